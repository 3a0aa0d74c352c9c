"""Launching a guest: the bubblewrap process, per-session limits, the workspace.
"""

__all__ = [
    "bwrap",
    "launch",
    "limits",
    "privilege",
    "tree",
    "workspace",
]
