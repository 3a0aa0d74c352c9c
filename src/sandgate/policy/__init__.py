"""The policy model and its TOML loading, address classes, domain patterns, and ``decide()``:
every verdict. Pure: no sockets, no kernel.
"""

__all__ = [
    "classify",
    "decide",
    "dnsnames",
    "exemptions",
    "groups",
    "hostparse",
    "httprules",
    "index",
    "limits",
    "load",
    "locate",
    "model",
    "overlay",
    "patterns",
    "pins",
    "plainrules",
    "profile",
    "reach",
    "requests",
    "suggest",
]
