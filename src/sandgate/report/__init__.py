"""Terminal tables, the session report and its self-contained HTML form (render.py,
session.py, html.py), the live dashboard (dashboard.py, dashpage.py) and its metrics."""

__all__ = [
    "dashboard",
    "dashpage",
    "html",
    "metrics",
    "render",
    "session",
]
