"""What every test-world server shares: addresses, JSON logs, READY, TLS, SIGTERM.

A server's `main()` parses its flags, then calls `run(serve)`: `serve(stop)` binds its
sockets, calls `announce_ready`, awaits `stop` (set by SIGTERM or SIGINT), closes its
sockets and returns; the process then exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import os
import signal
import ssl
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import IO, Any

from sandgate.gateway.proxy.ca import CA, IPLike

__all__ = [
    "Addr",
    "JsonLog",
    "announce_ready",
    "close_servers",
    "format_addr",
    "leaf_context",
    "load_json",
    "merged_config",
    "parse_addr",
    "run",
]

Addr = tuple[str, int]


def parse_addr(text: str, default_port: int | None = None) -> Addr:
    """`1.2.3.4:80`, `[::1]:80`, or (with a default port) a bare `1.2.3.4` / `::1`."""
    host, port = text, None
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else None
    elif text.count(":") == 1:
        host, port = text.split(":")
    if port is None:
        if default_port is None:
            raise ValueError(f"{text!r}: no port given")
        return str(ipaddress.ip_address(host)), default_port
    # Only literal addresses: a server must never bind to whatever a name resolves to.
    return str(ipaddress.ip_address(host)), int(port)


def format_addr(addr: Addr) -> str:
    host, port = addr[0], addr[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class JsonLog:
    """One JSON object per line, flushed at once so a test can tail the file live."""

    def __init__(self, path: str | os.PathLike[str] | None, server: str) -> None:
        self._server = server
        self._file: IO[str] | None = None
        if path is not None:
            self._file = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115

    def write(self, event: str, **fields: Any) -> None:
        if self._file is None:
            return
        record = {"ts": round(time.time(), 6), "server": self._server, "event": event, **fields}
        self._file.write(json.dumps(record, separators=(",", ":"), default=str) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def announce_ready(server: str, **info: Any) -> None:
    """The line a launcher waits for: `READY {"server": ..., "pid": ..., ...}`."""
    payload = {"server": server, "pid": os.getpid(), **info}
    sys.stdout.write("READY " + json.dumps(payload, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def load_json(path: str | os.PathLike[str] | None) -> dict[str, Any]:
    if path is None:
        return {}
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the config must be a JSON object")
    return data


def merged_config(args: argparse.Namespace) -> dict[str, Any]:
    """`--config FILE.json` overlaid with every flag given on the command line.

    Flags must default to None so that "not given" is visible; keys are the flags' dest
    names (`--token-delay-ms` is `token_delay_ms` in the file).
    """
    merged = load_json(args.config)
    for key, value in vars(args).items():
        if key != "config" and value is not None:
            merged[key] = value
    return merged


def leaf_context(
    ca: CA,
    names: Iterable[str],
    ips: Iterable[IPLike] = (),
    alpn: Iterable[str] = ("http/1.1",),
) -> ssl.SSLContext:
    """A server SSLContext holding a fresh leaf from `ca` for `names` and `ips`."""
    cert_pem, key_pem = ca.issue(names, ips, days=30)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    # load_cert_chain reads files only; the key lives on disk for a moment, 0600 in a
    # private directory, then goes.
    with tempfile.TemporaryDirectory(prefix="sg-leaf-") as tmp:
        cert_path, key_path = Path(tmp) / "leaf.pem", Path(tmp) / "leaf.key"
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key_pem)
        cert_path.write_bytes(cert_pem + ca.cert_pem)
        ctx.load_cert_chain(cert_path, key_path)
    ctx.set_alpn_protocols(list(alpn))
    return ctx


def _install_uvloop() -> None:
    try:
        import uvloop
    except ImportError:  # plain asyncio works too, only slower
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def run(serve: Callable[[asyncio.Event], Awaitable[None]]) -> int:
    """Run `serve(stop)` until it returns; SIGTERM and SIGINT set `stop`."""
    _install_uvloop()

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(stop)

    asyncio.run(main())
    return 0


async def close_servers(servers: Iterable[asyncio.Server], grace: float = 1.0) -> None:
    """Stop listening, then give open connections `grace` seconds before cancelling them."""
    servers = list(servers)
    for server in servers:
        server.close()
    current = asyncio.current_task()
    pending = [t for t in asyncio.all_tasks() if t is not current]
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending, timeout=grace)
    for server in servers:
        # wait_closed() waits for every connection; they were just cancelled.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(server.wait_closed(), timeout=grace)
