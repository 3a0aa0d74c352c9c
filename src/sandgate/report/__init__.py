"""Terminal tables, the session report and its self-contained HTML form (render.py,
session.py, html.py)."""

__all__ = [
    "html",
    "render",
    "session",
]
