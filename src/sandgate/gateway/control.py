"""The control socket: JSON lines over a root-only unix socket.

Request  ``{"op": "...", ...}``  →  reply ``{"ok": true, ...}`` or
``{"ok": false, "error": "...", "fix": "..."}``. The ``watch`` op streams events, one JSON
object per line, until the client goes away.

Ops (the daemon's dispatch table, gateway/server.py): ``ping``, ``add_guest``,
``remove_guest``, ``status``, ``metrics`` (exact totals), ``flush``, ``check`` (integrity),
``snapshot``, ``reload``, ``fault`` (tests), ``shutdown``; and ``watch``, served here from the
event sink.
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
from collections.abc import Awaitable, Callable, Iterator, Mapping
from pathlib import Path

from sandgate import TYPE_CHECKING
from sandgate.errors import GatewayError, SandgateError

if TYPE_CHECKING:  # only the daemon's side needs asyncio: a client (`run`) saves ~5 ms of CPU
    import asyncio
    from typing import Any

    Op = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
    Watch = Callable[[], contextlib.AbstractContextManager["asyncio.Queue[Any]"]]

MAX_LINE = 1 << 20


def encode(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    obj = json.loads(line)
    if not isinstance(obj, dict):
        raise ValueError("a control message must be a JSON object")
    return obj


async def serve_client(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ops: Mapping[str, Op], watch: Watch
) -> None:
    """One control connection: each line an op from ``ops``, each answered with a line."""
    import asyncio

    try:
        while line := await reader.readline():
            try:
                msg = decode(line)
                op = str(msg.get("op"))
                if op == "watch":
                    await _watch(writer, watch)
                    return
                handler = ops.get(op)
                if handler is None:
                    raise SandgateError(f"unknown control op {op!r}", ", ".join(sorted(ops)))
                reply = {"ok": True, **await handler(msg)}
            except SandgateError as exc:
                reply = {"ok": False, "error": exc.message, "fix": exc.fix}
            except (ValueError, KeyError, TypeError) as exc:
                reply = {"ok": False, "error": f"bad request: {exc}"}
            except Exception as exc:  # report, never die of one request
                import traceback  # the daemon's side only: a run's client never needs it

                traceback.print_exc(file=sys.stderr)
                reply = {"ok": False, "error": f"internal error: {exc}"}
            writer.write(encode(reply))
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


async def _watch(writer: asyncio.StreamWriter, watch: Watch) -> None:
    """Events to a watcher until it leaves: a normal end, not an error of the request."""
    with watch() as q, contextlib.suppress(ConnectionError):
        while not writer.is_closing():
            event = await q.get()
            writer.write(encode(event.as_json()))
            await writer.drain()


class ControlClient:
    """A blocking client (the CLI and the session runner use it)."""

    def __init__(self, path: Path, timeout: float = 30.0) -> None:
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(str(path))
        except OSError as exc:
            self._sock.close()
            raise GatewayError(
                f"the gateway is not answering on {path}: {exc.strerror}",
                "start one with `sandgate up`, or run `sandgate cleanup` after a crash",
            ) from exc
        self._file = self._sock.makefile("rb")

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        self.send(op, **args)
        return self.receive()

    def send(self, op: str, **args: Any) -> None:
        """A request whose reply ``receive`` reads later: the daemon answers a connection's
        requests one by one, in the order sent, so several may be sent ahead."""
        try:
            self._sock.sendall(encode({"op": op, **args}))
        except OSError as exc:
            raise GatewayError(f"the gateway stopped answering ({exc})") from exc

    def receive(self) -> dict[str, Any]:
        """The reply to the oldest request sent and not yet answered."""
        try:
            line = self._file.readline(MAX_LINE)
        except OSError as exc:
            raise GatewayError(f"the gateway stopped answering ({exc})") from exc
        if not line:
            raise GatewayError("the gateway closed the control connection (did it die?)")
        reply = decode(line)
        if not reply.get("ok"):
            raise GatewayError(reply.get("error", "the gateway refused"), reply.get("fix"))
        return reply

    def stream(self, op: str, **args: Any) -> Iterator[dict[str, Any]]:
        self._sock.settimeout(None)
        self._sock.sendall(encode({"op": op, **args}))
        for line in self._file:
            yield decode(line)

    def close(self) -> None:
        self._file.close()
        self._sock.close()

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
