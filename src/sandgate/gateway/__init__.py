"""The daemon outside every sandbox, as a composition root (server.py): the guest table
(guests.py), the event sink (sink.py), guest lifecycle (lifecycle.py), the kernel's logs into
the sink (logfeed.py), its config and control socket, starting and finding daemons
(manage.py), the self-check and watchdog, the relay to the host's loopback (hostlo.py), the
warm pool of guest namespaces (pool.py), freed memory handed back (heap.py), the garbage
collector's passes timed (collector.py). Its services live in ``proxy/``, ``logs/`` and
``dns/``, each handed a sink and lookups, never the daemon. Imports nothing from ``session/``
or ``world/``.
"""

__all__ = [
    "approvals",
    "collector",
    "config",
    "control",
    "daemon",
    "dns",
    "guests",
    "handed",
    "heap",
    "hostlo",
    "integrity",
    "lifecycle",
    "logfeed",
    "logs",
    "manage",
    "pool",
    "proxy",
    "registry",
    "reload",
    "selfcheck",
    "server",
    "sink",
    "watchdog",
]
