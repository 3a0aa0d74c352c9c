"""The SSE client of ``bench/run proxy``: how long each server-sent event took to arrive.

Reads ``https://NAME/sse?n=N&interval_ms=I`` from the bench's TLS source, directly (the name
resolved by the system resolver, or ``--address``) or through an explicit proxy (``--proxy
HOST:PORT``, or ``--proxy-env`` for ``$HTTPS_PROXY``: CONNECT, then TLS inside the tunnel),
and prints one line::

    SSE TAG <delay ms> <delay ms> ...       (arrival time minus the server's stamp, per event)

Standard library only: it runs inside sandboxes with the system's python3.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import socket
import ssl
import sys
import time
from urllib.parse import unquote, urlsplit


class _Direct(http.client.HTTPSConnection):
    """HTTPS to ``name`` at a fixed address (the peer guest has no resolver of its own)."""

    def __init__(self, name: str, address: str, context: ssl.SSLContext) -> None:
        super().__init__(name, 443, context=context)
        self._address = address

    def connect(self) -> None:
        sock = socket.create_connection((self._address, 443), self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)  # type: ignore[attr-defined]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True)
    parser.add_argument("--address", help="connect here instead of resolving the name")
    parser.add_argument("--proxy", help="HOST:PORT of an explicit proxy (CONNECT)")
    parser.add_argument("--proxy-env", action="store_true", help="the proxy of $HTTPS_PROXY")
    parser.add_argument("--cafile")
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--interval-ms", type=float, default=5.0)
    parser.add_argument("--tag", default="sse")
    args = parser.parse_args()
    ctx = ssl.create_default_context(cafile=args.cafile)
    ctx.set_alpn_protocols(["http/1.1"])
    conn: http.client.HTTPSConnection
    auth: dict[str, str] = {}
    if args.proxy_env:  # with its credentials, if it has any (srt's proxy wants them)
        env = urlsplit(os.environ["HTTPS_PROXY"])
        args.proxy = f"{env.hostname}:{env.port}"
        if env.username is not None:
            pair = f"{unquote(env.username)}:{unquote(env.password or '')}".encode()
            auth["Proxy-Authorization"] = "Basic " + base64.b64encode(pair).decode()
    if args.proxy:
        host, _, port = args.proxy.rpartition(":")
        conn = http.client.HTTPSConnection(host, int(port), context=ctx, timeout=30)
        conn.set_tunnel(args.name, 443, headers=auth)
    elif args.address:
        conn = _Direct(args.name, args.address, ctx)
    else:
        conn = http.client.HTTPSConnection(args.name, 443, context=ctx, timeout=30)
    conn.request("GET", f"/sse?n={args.n}&interval_ms={args.interval_ms:g}")
    resp = conn.getresponse()
    if resp.status != 200:
        sys.stdout.write(f"SSEERR {args.tag} status {resp.status}\n")
        return
    delays: list[float] = []
    while True:
        line = resp.readline()
        arrived = time.time()
        if not line:
            break
        if line.startswith(b"data: "):
            stamp = json.loads(line[6:])["t"]
            delays.append((arrived - stamp) * 1e3)
    conn.close()
    sys.stdout.write(f"SSE {args.tag} " + " ".join(f"{d:.3f}" for d in delays) + "\n")


if __name__ == "__main__":
    main()
