"""The gateway's resolver: one listener pair per guest (resolver.py), its answers judged by
``policy/`` (dnsnames, decide_answer, pins), the wire format read and written with dnspython
behind a fast reader for the common shapes (dnslogic.py), and the upstream servers it asks
(upstream.py). Handed a sink and a pin callback; never the daemon.
"""

__all__ = [
    "dnslogic",
    "resolver",
    "upstream",
]
