"""Launching a guest: the bubblewrap process, per-session limits, the workspace.
"""

__all__ = [
    "bwrap",
    "enter",
    "launch",
    "limits",
    "privilege",
    "tree",
    "workspace",
]
