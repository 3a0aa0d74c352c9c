"""``sandgate doctor``: hop by hop from inside a fresh guest, what works, what not, the fix."""

__all__ = [
    "driver",
    "hops",
    "judge",
    "plan",
    "runner",
]
