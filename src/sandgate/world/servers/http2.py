"""HTTP/2 for the test-world servers (chosen when TLS ALPN picks "h2"), driven by h2.

Each stream runs the same `Handler` as HTTP/1.1 in its own task. Request bodies are
acknowledged as they arrive (the test world trusts its clients), and response bodies
honour the peer's flow-control windows so a slow reader slows us down, as on h1.
"""

from __future__ import annotations

import asyncio
import time

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings

from sandgate.world.servers.httpio import (
    ConnInfo,
    Handler,
    Request,
    Response,
    call_handler,
    close_body,
    log_request,
)
from sandgate.world.servers.runtime import JsonLog

__all__ = ["serve_h2"]

_WINDOW = 16 * 1024 * 1024
# Hop-by-hop headers are illegal in HTTP/2 and h2 rejects them; handlers may still set them.
_HOP = {"connection", "keep-alive", "transfer-encoding", "upgrade", "proxy-connection"}


class _H2:
    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        handler: Handler,
        log: JsonLog,
        info: ConnInfo,
    ) -> None:
        config = h2.config.H2Configuration(client_side=False, header_encoding=None)
        self.conn = h2.connection.H2Connection(config=config)
        self.reader, self.writer = reader, writer
        self.handler, self.log, self.info = handler, log, info
        self.bodies: dict[int, asyncio.Queue[bytes | None]] = {}
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.window_open = asyncio.Event()

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.writer.write(data)

    async def run(self) -> None:
        self.conn.initiate_connection()
        self.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: _WINDOW})
        self.conn.increment_flow_control_window(_WINDOW)
        self.flush()
        try:
            while data := await self.reader.read(256 * 1024):
                try:
                    events = self.conn.receive_data(data)
                except h2.exceptions.ProtocolError as exc:
                    self.log.write("h2_error", error=repr(exc))
                    self.flush()
                    return
                if not self._dispatch(events):
                    return
                self.flush()
                await self.writer.drain()
        finally:
            for task in self.tasks.values():
                task.cancel()
            self.window_open.set()

    def _dispatch(self, events: list[h2.events.Event]) -> bool:
        for ev in events:
            if isinstance(ev, h2.events.RequestReceived):
                self._start(ev)
            elif isinstance(ev, h2.events.DataReceived):
                self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                if (queue := self.bodies.get(ev.stream_id)) is not None:
                    queue.put_nowait(bytes(ev.data))
            elif isinstance(ev, h2.events.StreamEnded):
                if (queue := self.bodies.get(ev.stream_id)) is not None:
                    queue.put_nowait(None)
            elif isinstance(ev, h2.events.StreamReset):
                if (task := self.tasks.get(ev.stream_id)) is not None:
                    task.cancel()
            elif isinstance(ev, (h2.events.WindowUpdated, h2.events.RemoteSettingsChanged)):
                self.window_open.set()
            elif isinstance(ev, h2.events.ConnectionTerminated):
                return False
        return True

    def _start(self, ev: h2.events.RequestReceived) -> None:
        sid = ev.stream_id
        pseudo: dict[str, str] = {}
        headers: list[tuple[str, str]] = []
        for raw_name, raw_value in ev.headers or ():
            name = bytes(raw_name).decode("latin-1")
            value = bytes(raw_value).decode("latin-1")
            if name.startswith(":"):
                pseudo[name] = value
            else:
                headers.append((name, value))
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.bodies[sid] = queue
        req = Request(
            method=pseudo.get(":method", "GET"),
            target=pseudo.get(":path", "/"),
            headers=headers,
            http_version="2",
            conn=self.info,
            receive=queue.get,
            authority=pseudo.get(":authority"),
        )
        self.tasks[sid] = asyncio.create_task(self._stream(sid, req))

    async def _stream(self, sid: int, req: Request) -> None:
        started = time.monotonic()
        resp = await call_handler(self.handler, req, self.log)
        sent = 0
        try:
            sent = await self._respond(sid, req, resp)
        except h2.exceptions.StreamClosedError:
            pass  # the client reset the stream; nothing left to send
        finally:
            self.tasks.pop(sid, None)
            self.bodies.pop(sid, None)
            log_request(self.log, req, resp, sent, started)

    async def _respond(self, sid: int, req: Request, resp: Response) -> int:
        status = 400 if resp.status == 101 else resp.status  # no Upgrade on h2
        headers = [(":status", str(status))]
        headers += [(k.lower(), v) for k, v in resp.headers if k.lower() not in _HOP]
        body = resp.body
        if isinstance(body, bytes) and not any(k == "content-length" for k, _ in headers):
            headers.append(("content-length", str(len(body))))
        if req.method == "HEAD" or status == 101 or body == b"":
            self.conn.send_headers(sid, headers, end_stream=True)
            self.flush()
            await close_body(body)
            return 0
        self.conn.send_headers(sid, headers)
        self.flush()
        sent = 0
        if isinstance(body, bytes):
            await self._send(sid, body)
            sent = len(body)
        else:
            async for chunk in body:
                await self._send(sid, chunk)
                sent += len(chunk)
        self.conn.end_stream(sid)
        self.flush()
        await self.writer.drain()
        return sent

    async def _send(self, sid: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            window = min(
                self.conn.local_flow_control_window(sid), self.conn.max_outbound_frame_size
            )
            if window <= 0:
                await self.writer.drain()
                self.window_open.clear()
                await self.window_open.wait()
                if self.reader.at_eof():
                    raise ConnectionResetError("peer closed while we waited for window")
                continue
            self.conn.send_data(sid, view[:window].tobytes())
            view = view[window:]
            self.flush()
        await self.writer.drain()  # once per chunk: per 16 KiB frame would halve throughput


async def serve_h2(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    handler: Handler,
    log: JsonLog,
    info: ConnInfo,
) -> None:
    await _H2(reader, writer, handler, log, info).run()
