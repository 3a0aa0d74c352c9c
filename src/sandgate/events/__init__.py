"""One event schema with the Decision inside (and the flow key enforcers join records by), the
SQLite store with its hash chain and its writer process, the OCSF export.
"""

__all__ = [
    "chain",
    "ocsf",
    "redact",
    "schema",
    "store",
    "verify",
    "writer",
]
