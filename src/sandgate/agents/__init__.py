"""What runs inside a sandbox: the scripted agent and real frameworks, as data the runner
runs. Imports no runner (session/).
"""

__all__ = [
    "demo_agent",
    "frameworks",
    "registry",
    "scripted_agent",
]
