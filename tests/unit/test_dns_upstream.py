"""The resolver's upstream socket holds a burst of answers that arrives while the loop is busy
(a GC pass, a large batch of questions): a dropped answer costs a guest two seconds and a
SERVFAIL (issue 13: the bench's uncached runs lost answers this way). Real UDP on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import socket
import threading
import time

import pytest

from sandgate.gateway.dns import upstream as up

SERVER = "127.0.53.1"  # the upstream asks port 53: binding it needs root
BURST = 3000


def _burst_server(sock: socket.socket, ready: threading.Event) -> None:
    """Collect BURST questions, then answer them all at once (echo with QR set)."""
    got = []
    ready.set()
    while len(got) < BURST:
        data, addr = sock.recvfrom(512)
        got.append((data, addr))
    for data, addr in got:
        sock.sendto(data[:2] + bytes([data[2] | 0x80]) + data[3:] + bytes(60), addr)


@pytest.mark.skipif(os.geteuid() != 0, reason="binds port 53")
def test_a_burst_of_answers_while_the_loop_is_busy_is_not_dropped() -> None:
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    server.bind((SERVER, 53))
    ready = threading.Event()
    thread = threading.Thread(target=_burst_server, args=(server, ready), daemon=True)
    thread.start()
    ready.wait(5)

    async def main() -> int:
        u = up.Upstream([SERVER])
        await u.open()
        answered = 0
        done = asyncio.Event()

        def one(reply: bytes | None, error: BaseException | None) -> None:
            nonlocal answered
            answered += reply is not None
            if answered == BURST:
                done.set()

        for i in range(BURST):
            query = u.new_id().to_bytes(2, "big") + b"\x01\x00\x00\x01" + bytes(6)
            query += b"\x06q" + str(i).encode().rjust(5, b"0") + b"\x00\x00\x01\x00\x01"
            u.send(query, one)
        # The loop is busy while every answer arrives (the server sends them in a burst).
        thread.join(5)
        time.sleep(0.3)
        with contextlib.suppress(TimeoutError):  # under the upstream timeout (2 s)
            await asyncio.wait_for(done.wait(), 1.5)
        u.close()
        return answered

    try:
        assert asyncio.run(main()) == BURST
    finally:
        server.close()


def _query(u: up.Upstream, name: bytes) -> bytes:
    head = u.new_id().to_bytes(2, "big") + b"\x01\x00\x00\x01" + bytes(6)
    return head + bytes([len(name)]) + name + b"\x00\x00\x01\x00\x01"


def _answer_to(query: bytes, question: bytes | None = None) -> bytes:
    body = query[12:] if question is None else question
    return query[:2] + b"\x81\x80" + query[4:12] + body


@pytest.mark.skipif(os.geteuid() != 0, reason="binds port 53")
def test_an_answer_is_taken_only_from_the_server_asked_and_to_the_question_asked() -> None:
    """An off-path sender that knows the id: its answer from another address, and the server's
    answer to another question, are both dropped, and the real answer still arrives."""
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind((SERVER, 53))
    spoofer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    spoofer.bind(("127.0.53.2", 53))

    async def main() -> list[bytes | None]:
        u = up.Upstream([SERVER])
        await u.open()
        got: list[bytes | None] = []
        done = asyncio.Event()

        def one(reply: bytes | None, error: BaseException | None) -> None:
            got.append(reply)
            done.set()

        query = _query(u, b"real")
        u.send(query, one)
        loop = asyncio.get_running_loop()
        data, addr = await loop.run_in_executor(None, server.recvfrom, 512)
        assert data == query
        spoofer.sendto(_answer_to(query) + b"spoofed", addr)
        server.sendto(_answer_to(query, b"\x04fake\x00\x00\x01\x00\x01"), addr)
        await asyncio.sleep(0.2)
        assert not got  # neither was taken
        server.sendto(_answer_to(query) + b"real", addr)
        await asyncio.wait_for(done.wait(), 2)
        u.close()
        return got

    try:
        (reply,) = asyncio.run(main())
        assert reply is not None and reply.endswith(b"real")
    finally:
        server.close()
        spoofer.close()


def test_query_ids_are_random_and_never_in_flight_twice() -> None:
    u = up.Upstream([SERVER])
    ids = [u.new_id() for _ in range(2000)]
    steps = sum(1 for a, b in itertools.pairwise(ids) if (b - a) & 0xFFFF == 1)
    assert steps < 20, steps  # a counter would give 1999
    assert up.same_question(_query(u, b"Ab"), _answer_to(_query(u, b"aB")))
    assert not up.same_question(_query(u, b"ab"), _answer_to(_query(u, b"ac")))


def test_a_new_id_is_never_one_in_flight() -> None:
    """Ids come in blocks of random bytes; one already waiting is drawn again, never reused."""
    u = up.Upstream([SERVER])
    # Just under the in-flight bound: 5,537 ids free.
    u._waiting = dict.fromkeys(random.Random(13).sample(range(1 << 16), 59_999))  # type: ignore[arg-type]
    drawn = [u.new_id() for _ in range(3000)]  # ~11 in 12 draws hit one in flight
    assert not set(drawn) & u._waiting.keys()
    u._waiting[drawn[0]] = None  # type: ignore[assignment]
    with pytest.raises(OSError, match="too many"):  # 60,000 in flight: none is drawn
        u.new_id()
