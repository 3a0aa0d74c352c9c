"""The policy model and its TOML loading, address classes, domain patterns, and ``decide()``:
every verdict. Pure: no sockets, no kernel.
"""

__all__ = [
    "classify",
    "decide",
    "hostparse",
    "load",
    "locate",
    "model",
    "patterns",
    "profile",
]
