"""Asking the gateway's upstream resolvers: UDP with retries to the next server, TCP when an
answer is truncated. Questions wait as callbacks keyed by query id (no task per question), with
one sweep for those past their deadline; ``ask`` wraps that for code that wants to await.

An answer is taken only from the server asked, from port 53, with the question asked, and ids
are random: an off-path sender that spoofs the server must guess the id for every packet."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sandgate.gateway.dns.dnslogic import qname_end

UPSTREAM_TIMEOUT = 2.0
# Room for a burst of ~20k small datagrams while the loop is busy elsewhere (a GC pass, the
# store's flush): the default (~200 KB) holds only a few hundred, and on the upstream socket a
# dropped answer costs the guest UPSTREAM_TIMEOUT and a SERVFAIL.
UDP_RCVBUF = 8 << 20
SWEEP_INTERVAL = 0.25  # how often questions past their upstream deadline are looked for
# Query ids come from the kernel's CSPRNG in blocks: one getrandom() for 2,048 ids, not one per
# question (secrets.randbits made a syscall and ~10 Python calls per id).
ID_BLOCK = 4096

Answered = Callable[[bytes | None, BaseException | None], None]


@dataclass(slots=True)
class _Asked:
    """A question in flight upstream."""

    query: bytes
    done: Answered
    server: str
    rest: list[str]  # the servers still to try after this one
    deadline: float = 0.0


class Upstream:
    """Asks upstream servers over UDP (TCP when the answer is truncated).

    Questions wait as callbacks in ``_waiting`` (by query id); one sweep every
    ``SWEEP_INTERVAL`` moves those past their deadline to the next server, or gives up."""

    def __init__(self, servers: list[str]) -> None:
        self.servers = servers
        self._transport: asyncio.DatagramTransport | None = None
        self._waiting: dict[int, _Asked] = {}
        self._sweep: asyncio.TimerHandle | None = None
        self._tcp_tasks: set[asyncio.Future[None]] = set()
        self._ids: memoryview = memoryview(b"").cast("H")
        self._next_id = 0

    def new_id(self) -> int:
        """A random id no question in flight has (sequential ones are guessed)."""
        if len(self._waiting) >= 60_000:
            raise OSError("too many upstream questions in flight")
        while True:
            if self._next_id >= len(self._ids):
                self._ids, self._next_id = memoryview(os.urandom(ID_BLOCK)).cast("H"), 0
            qid: int = self._ids[self._next_id]
            self._next_id += 1
            if qid not in self._waiting:
                return qid

    async def open(self) -> None:
        """Make the socket (before the first question: ``send`` does not wait for it)."""
        if self._transport is None:
            loop = asyncio.get_running_loop()
            self._transport, _ = await loop.create_datagram_endpoint(
                lambda: _UpstreamProtocol(self._received), local_addr=("0.0.0.0", 0)
            )
            grow_rcvbuf(self._transport.get_extra_info("socket"))

    def send(self, query: bytes, done: Answered) -> None:
        """Ask the servers in turn; ``done`` gets the first answer, or None and why."""
        if not self.servers:
            done(None, OSError("no upstream resolver configured"))
            return
        if self._transport is None:
            done(None, OSError("the upstream socket is not open"))
            return
        self._try(_Asked(query, done, self.servers[0], self.servers[1:]))  # a new list

    async def ask(self, query: bytes) -> bytes:
        """``send`` for coroutines: the answer, or TimeoutError/OSError."""
        await self.open()
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

        def done(reply: bytes | None, error: BaseException | None) -> None:
            if fut.done():
                return
            if reply is not None:
                fut.set_result(reply)
            else:
                fut.set_exception(error or TimeoutError("no upstream resolver answered"))

        self.send(query, done)
        return await fut

    def _try(self, asked: _Asked) -> None:
        assert self._transport is not None
        qid = int.from_bytes(asked.query[:2], "big")
        asked.deadline = time.monotonic() + UPSTREAM_TIMEOUT
        self._waiting[qid] = asked
        try:
            self._transport.sendto(asked.query, (asked.server, 53))
        except OSError as exc:
            del self._waiting[qid]
            self._next(asked, exc)
            return
        if self._sweep is None:
            self._sweep = asyncio.get_running_loop().call_later(SWEEP_INTERVAL, self._expire)

    def _next(self, asked: _Asked, error: BaseException) -> None:
        if asked.rest:
            asked.server = asked.rest.pop(0)
            self._try(asked)
        else:
            asked.done(None, error)

    def _expire(self) -> None:
        self._sweep = None
        now = time.monotonic()
        late = [qid for qid, asked in self._waiting.items() if asked.deadline <= now]
        for qid in late:
            self._next(self._waiting.pop(qid), TimeoutError("no upstream resolver answered"))
        if self._waiting and self._sweep is None:
            self._sweep = asyncio.get_running_loop().call_later(SWEEP_INTERVAL, self._expire)

    def _received(self, data: bytes, addr: tuple[str, int]) -> None:
        if len(data) < 12:
            return
        qid = int.from_bytes(data[:2], "big")
        asked = self._waiting.get(qid)
        # Anything else is dropped and the question keeps waiting: a spoofed packet must not
        # cost the real answer.
        if asked is None or addr[:2] != (asked.server, 53) or not same_question(asked.query, data):
            return
        del self._waiting[qid]
        if len(data) > 2 and data[2] & 0x02:  # TC: ask again over TCP
            task = asyncio.ensure_future(self._tcp_then(asked))
            self._tcp_tasks.add(task)
            task.add_done_callback(self._tcp_tasks.discard)
            return
        asked.done(data, None)

    async def _tcp_then(self, asked: _Asked) -> None:
        try:
            reply = await self._tcp(asked.server, asked.query)
        except (OSError, TimeoutError, EOFError) as exc:
            asked.done(None, exc)
            return
        asked.done(reply, None)

    async def _tcp(self, server: str, query: bytes) -> bytes:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(server, 53), UPSTREAM_TIMEOUT
        )
        try:
            writer.write(struct.pack("!H", len(query)) + query)
            await writer.drain()
            (size,) = struct.unpack(
                "!H", await asyncio.wait_for(reader.readexactly(2), UPSTREAM_TIMEOUT)
            )
            return await asyncio.wait_for(reader.readexactly(size), UPSTREAM_TIMEOUT)
        finally:
            writer.close()

    def close(self) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        if self._transport is not None:
            self._transport.close()


def same_question(query: bytes, answer: bytes) -> bool:
    """Whether ``answer`` is to ``query``'s question: one question, the same name (any case),
    type and class. Our queries write the name out in full; so do answers to them."""
    end = qname_end(query)
    return (
        end > 0
        and answer[4:6] == b"\x00\x01"
        and answer[12 : end + 4].lower() == query[12 : end + 4].lower()
    )


def grow_rcvbuf(sock: Any) -> None:
    """A large receive buffer for a UDP socket (the gateway is root: past rmem_max if need be)."""
    if sock is None:
        return
    for option in (getattr(socket, "SO_RCVBUFFORCE", 33), socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, option, UDP_RCVBUF)
            return
        except OSError:
            continue


class _UpstreamProtocol(asyncio.DatagramProtocol):
    def __init__(self, received: Callable[[bytes, tuple[str, int]], None]) -> None:
        self.received = received

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.received(data, addr)
