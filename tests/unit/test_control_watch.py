"""A watcher that leaves is normal: the control server ends its connection quietly, without a
traceback or an unretrieved task error in the gateway's log (both were there in a CI log), and
goes on answering others. On a real unix socket."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandgate.gateway.control import serve_client


def test_a_watcher_that_leaves_ends_quietly(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    queue: asyncio.Queue[Any] = asyncio.Queue()

    @contextlib.contextmanager
    def watch() -> Iterator[asyncio.Queue[Any]]:
        yield queue

    class Event:
        def as_json(self) -> dict[str, Any]:
            return {"event": "x" * 65536}  # more than a socket buffer: drain must wait

    async def echo(msg: dict[str, Any]) -> dict[str, Any]:
        return {"echo": msg.get("n")}

    done: list[asyncio.Task[None]] = []
    errors: list[dict[str, Any]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))

        async def client(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            done.append(task)
            await serve_client(r, w, {"echo": echo}, watch)

        path = str(tmp_path / "control.sock")
        server = await asyncio.start_unix_server(client, path)
        watcher = socket.socket(socket.AF_UNIX)
        watcher.connect(path)
        watcher.sendall(b'{"op": "watch"}\n')
        for _ in range(64):
            queue.put_nowait(Event())
        await asyncio.sleep(0.1)
        watcher.close()  # gone with events unread
        for _ in range(4):
            queue.put_nowait(Event())
        await asyncio.sleep(0.2)
        r, w = await asyncio.open_unix_connection(path)
        w.write(b'{"op": "echo", "n": 7}\n')
        assert json.loads(await r.readline()) == {"ok": True, "echo": 7}
        w.close()
        await asyncio.gather(*done, return_exceptions=True)
        assert all(t.exception() is None for t in done)
        server.close()

    asyncio.run(main())
    assert errors == []
    assert "Traceback" not in capfd.readouterr().err
