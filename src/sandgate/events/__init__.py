"""One event schema with the Decision inside (and the flow key enforcers join records by), the
SQLite store with its hash chain.
"""

__all__ = [
    "chain",
    "schema",
    "store",
    "verify",
]
