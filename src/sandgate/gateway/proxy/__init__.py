"""The proxy: its two doors (server.py), the SNI gate in the kernel's path (tlsgate.py,
firstflight.py, sni.py), passthrough (joined in the kernel by a BPF sockmap: sockmap.py; else
the splice hub: relay.py), inspection and its CA (tls.py, ca.py; TLS on
memory BIOs: tlsio.py), HTTP/1.1 (http1.py, httphead.py) and the secret swap (credentials.py);
plain bodies moved in the kernel (splice.py); name lookups kept for their TTL (lookup.py).
Never the daemon.
"""

__all__ = [
    "accept",
    "ca",
    "chunked",
    "credentials",
    "firstflight",
    "flow",
    "http1",
    "httphead",
    "lookup",
    "relay",
    "server",
    "sni",
    "sockmap",
    "splice",
    "tls",
    "tlsgate",
    "tlsio",
]
