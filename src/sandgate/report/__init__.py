"""Terminal tables and the session report (render.py, session.py)."""

__all__ = [
    "render",
    "session",
]
