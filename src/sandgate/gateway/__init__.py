"""The daemon outside every sandbox, as a composition root: the guest table (server.py), its
config and control socket, starting and finding daemons (manage.py), the self-check and
watchdog. Its services live in ``proxy/`` and ``logs/`` (and the resolver), each handed a
sink and lookups, never the daemon. Imports nothing from ``session/`` or ``world/``.
"""

__all__ = [
    "config",
    "control",
    "daemon",
    "dnslogic",
    "integrity",
    "logs",
    "manage",
    "proxy",
    "registry",
    "resolver",
    "selfcheck",
    "server",
    "upstream",
    "watchdog",
]
