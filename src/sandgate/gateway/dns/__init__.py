"""The gateway's resolver: one listener pair per guest (resolver.py), its answers judged by
``policy/`` (dnsnames, decide_answer, pins), the wire format read and written with dnspython
behind a fast reader for the common shapes (dnslogic.py), and the upstream servers it asks
(upstream.py), and its cache of answers held where the garbage collector does not walk them
(cache.py). Handed a sink and a pin callback; never the daemon.
"""

__all__ = [
    "cache",
    "dnslogic",
    "resolver",
    "upstream",
]
