"""One agent run (fixtures, home, timeout, drift, strays, claims), suites of tasks x modes, and
the stack (a gateway and its test world) they run on.
"""

__all__ = [
    "claims",
    "demo",
    "drift",
    "evidence",
    "modeluse",
    "retention",
    "runner",
    "stack",
    "suite",
    "tasks",
    "timings",
]
