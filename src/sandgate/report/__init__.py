"""Terminal tables, the session report, the live dashboard and its metrics."""

__all__ = [
    "dashboard",
    "dashpage",
    "metrics",
    "render",
    "session",
]
