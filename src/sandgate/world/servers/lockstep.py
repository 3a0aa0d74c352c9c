"""Lock-step server-sent events: prove that whatever sits between client and server streams.

Protocol (shared by the model server and the web server's `/sse`):

* The client asks for a lock-step stream (model: header `x-sg-lockstep: 1`; web:
  `/sse?lockstep=1`). It may choose the stream id (header `x-sg-lockstep-id` or
  `?id=`); otherwise the server picks one. The id is returned in the response header
  `x-sg-lockstep-id` and inside the events (model: every chunk's `id` is
  `chatcmpl-<stream id>`; web: each event's JSON has `"stream"`).
* Events are numbered from 0. The server writes event 0 at once and event n+1 only after
  the client has sent `POST /lockstep/<id>/ack/<n>` (any connection, any time after event
  n was written). An ack for an event not yet written is refused with 409, so a client
  cannot ack ahead blindly; unknown ids get 404.
* `GET /lockstep/<id>` returns `{"id", "sent", "acked", "done", "timed_out"}`: a test can
  see the server is parked after event n even though no byte of event n reached it.
* With no ack within the timeout (default 30 s) the server logs `lockstep_timeout` and
  ends the response without the remaining events.

A proxy that buffers the response keeps event n from the client, the client cannot ack,
and the test times out instead of passing.
"""

from __future__ import annotations

import asyncio
import re
import secrets
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field

from sandgate.world.servers.httpio import Request, Response, json_response
from sandgate.world.servers.runtime import JsonLog

__all__ = ["ID_HEADER", "LockstepRegistry", "LockstepStream", "sse_event"]

ID_HEADER = "x-sg-lockstep-id"
_ACK = re.compile(r"^/lockstep/([A-Za-z0-9_.-]{1,64})/ack/(\d{1,9})$")
_STATUS = re.compile(r"^/lockstep/([A-Za-z0-9_.-]{1,64})$")
_VALID_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_KEEP = 1000  # finished streams remembered for status queries


def sse_event(data: str, event: str | None = None, event_id: str | None = None) -> bytes:
    """One SSE event; `data` must not contain newlines (JSON from json.dumps never does)."""
    lines = []
    if event is not None:
        lines.append(f"event: {event}")
    if event_id is not None:
        lines.append(f"id: {event_id}")
    lines.append(f"data: {data}")
    return ("\n".join(lines) + "\n\n").encode()


@dataclass
class LockstepStream:
    id: str
    sent: int = 0  # events handed to the connection
    acked: int = -1  # highest event number acknowledged
    done: bool = False
    timed_out: bool = False
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def status(self) -> dict[str, object]:
        return {
            "id": self.id,
            "sent": self.sent,
            "acked": self.acked,
            "done": self.done,
            "timed_out": self.timed_out,
        }

    async def wait_ack(self, n: int, timeout: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.acked < n:
            self.changed.clear()
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(self.changed.wait(), remaining)
            except TimeoutError:
                return self.acked >= n
        return True


class LockstepRegistry:
    def __init__(self, log: JsonLog, timeout: float = 30.0) -> None:
        self.log = log
        self.timeout = timeout
        self.streams: OrderedDict[str, LockstepStream] = OrderedDict()

    def open(self, req: Request) -> LockstepStream:
        wanted = req.header(ID_HEADER) or req.query.get("id")
        sid = wanted if wanted and _VALID_ID.match(wanted) else secrets.token_hex(8)
        stream = LockstepStream(sid)
        self.streams[sid] = stream
        while len(self.streams) > _KEEP:
            self.streams.popitem(last=False)
        return stream

    def handle(self, req: Request) -> Response | None:
        """Answer `/lockstep/...` requests; None for any other path."""
        if m := _ACK.match(req.path):
            if req.method != "POST":
                return json_response(405, {"error": "POST to ack"}, [("allow", "POST")])
            return self._ack(m.group(1), int(m.group(2)))
        if m := _STATUS.match(req.path):
            stream = self.streams.get(m.group(1))
            if stream is None:
                return json_response(404, {"error": "unknown lock-step stream"})
            return json_response(200, stream.status())
        return None

    def _ack(self, sid: str, n: int) -> Response:
        stream = self.streams.get(sid)
        if stream is None:
            return json_response(404, {"error": "unknown lock-step stream"})
        if n >= stream.sent:
            self.log.write("lockstep_early_ack", stream=sid, n=n, sent=stream.sent)
            return json_response(409, {"error": f"event {n} not written yet", **stream.status()})
        stream.acked = max(stream.acked, n)
        stream.changed.set()
        self.log.write("lockstep_ack", stream=sid, n=n)
        return json_response(200, {"ok": True, **stream.status()})

    async def events(
        self, stream: LockstepStream | None, events: Iterable[bytes], delay: float = 0.0
    ) -> AsyncIterator[bytes]:
        """Yield `events`, each after `delay` and (lock-step) after the previous one's ack."""
        items = list(events)
        for n, event in enumerate(items):
            if n and delay:
                await asyncio.sleep(delay)
            if stream is not None and n and not await stream.wait_ack(n - 1, self.timeout):
                stream.timed_out = True
                self.log.write("lockstep_timeout", stream=stream.id, waiting_for=n - 1)
                return
            if stream is not None:
                # counted before the yield: the writer sends it synchronously right after,
                # and a fast client's ack (or status query) must not race the bookkeeping
                stream.sent = n + 1
                stream.done = n == len(items) - 1
            yield event
