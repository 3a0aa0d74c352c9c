"""The splice relay hub (gateway/proxy/relay.py) and the kernel's (sockmap.py) on real loopback
TCP: what goes in comes out. The shared cases run against both (the ``start`` fixture).

Each tunnel is outer client <-> [inner client | relay | inner server] <-> outer server, the same
shape as a CONNECT tunnel on the gateway.
"""

from __future__ import annotations

import hashlib
import os
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress

import pytest

from sandgate.gateway.proxy import relay, sockmap
from sandgate.gateway.proxy.relay import RelayResult

Start = Callable[..., None]


@pytest.fixture(params=["hub", "kernel"])
def start(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Start:
    """relay.start (the splice hub) or sockmap.start (the kernel carries it)."""
    if request.param == "hub":
        return relay.start
    monkeypatch.setattr(sockmap.KERNEL, "on", True)  # off by default (sockmap.ON)
    if not sockmap.KERNEL._ready():
        if os.geteuid() != 0:  # loading BPF needs CAP_BPF and CAP_NET_ADMIN
            pytest.skip(f"BPF sockmap unavailable here: {sockmap.KERNEL.unavailable}")
        pytest.fail(f"as root the kernel relay must load: {sockmap.KERNEL.unavailable}")
    return sockmap.start


def _pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        a = socket.create_connection(listener.getsockname())
        b, _ = listener.accept()
    return a, b


@contextmanager
def tunnel(
    start: Start = relay.start, **limits: float | int | None
) -> Iterator[tuple[socket.socket, socket.socket, list[RelayResult]]]:
    """(outer client, outer server, [result once done]) with a relay tunnel between them."""
    client, inner_c = _pair()
    inner_s, server = _pair()
    out: list[RelayResult] = []
    ended = threading.Event()

    def done(result: RelayResult) -> None:
        out.append(result)
        ended.set()

    for s in (client, server):
        s.settimeout(20)  # a broken relay fails the test instead of hanging it
    start(inner_c, inner_s, done, **limits)
    inner_c.close()  # the relay works on its own duplicates
    inner_s.close()
    try:
        yield client, server, out
        assert ended.wait(20), "the tunnel did not end"
    finally:
        client.close()
        server.close()


def _recv_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def _send_then_shut(sock: socket.socket, data: bytes) -> threading.Thread:
    def go() -> None:
        with suppress(OSError):  # the cap test closes the socket under a blocked sender
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)

    t = threading.Thread(target=go)
    t.start()
    return t


def test_bytes_both_ways_at_once_are_identical_and_counted(start: Start) -> None:
    up, down = os.urandom(6 << 20), os.urandom(9 << 20)
    with tunnel(start) as (client, server, out):
        senders = [_send_then_shut(client, up), _send_then_shut(server, down)]
        got_down: list[bytes] = []
        reader = threading.Thread(target=lambda: got_down.append(_recv_all(client)))
        reader.start()
        got_up = _recv_all(server)
        reader.join(20)
        for t in senders:
            t.join(20)
    assert hashlib.sha256(got_up).digest() == hashlib.sha256(up).digest()
    assert hashlib.sha256(got_down[0]).digest() == hashlib.sha256(down).digest()
    assert (out[0].up, out[0].down, out[0].ended) == (len(up), len(down), "eof")


def test_half_close_carries_over_and_the_other_way_keeps_talking(start: Start) -> None:
    with tunnel(start) as (client, server, out):
        client.sendall(b"request")
        client.shutdown(socket.SHUT_WR)
        assert _recv_all(server) == b"request"  # EOF reached the server
        server.sendall(b"answer after the client's FIN")
        server.shutdown(socket.SHUT_WR)
        assert _recv_all(client) == b"answer after the client's FIN"
    assert out[0].ended == "eof"


def test_a_peer_reset_resets_the_other_side(start: Start) -> None:
    with tunnel(start) as (client, server, out):
        client.sendall(b"x" * 1000)
        assert server.recv(1000)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        server.close()  # a reset, not a FIN
        client.settimeout(10)
        with pytest.raises(ConnectionResetError):
            while client.recv(1 << 16):
                pass
    assert out[0].ended == "error"


def test_many_tunnels_at_once(start: Start) -> None:
    n = 40
    payloads = [os.urandom(200_000 + i) for i in range(n)]
    with ExitStack() as stack:
        tunnels = [stack.enter_context(tunnel(start)) for _ in range(n)]
        assert (relay.HUB if start is relay.start else sockmap.KERNEL).count() >= n
        for (client, _, _), data in zip(tunnels, payloads, strict=True):
            _send_then_shut(client, data)
        for (_, server, _), data in zip(tunnels, payloads, strict=True):
            echoed = _recv_all(server)
            assert echoed == data
            server.sendall(echoed[::-1])
            server.shutdown(socket.SHUT_WR)
        for (client, _, _), data in zip(tunnels, payloads, strict=True):
            assert _recv_all(client) == data[::-1]
    assert all(out[0].ended == "eof" for _, _, out in tunnels)


def test_the_byte_cap_ends_a_tunnel_without_passing_more(start: Start) -> None:
    with tunnel(start, cap=100_000) as (client, server, out):
        sender = _send_then_shut(server, b"y" * 1_000_000)
        got = _recv_all(client)
        server.close()  # unblocks the sender once the hub has stopped reading
        sender.join(20)
    assert len(got) <= 100_000
    assert out[0].ended == "cap"
    assert out[0].down <= 100_000


def test_an_idle_tunnel_ends(start: Start) -> None:
    with tunnel(start, idle=0.2) as (client, _server, out):
        assert _recv_all(client) == b""  # closed by the hub, not by the peer
    assert out[0].ended == "idle"


def test_the_blocking_form_returns_the_result() -> None:
    client, inner_c = _pair()
    inner_s, server = _pair()
    client.sendall(b"early bytes already waiting")
    client.shutdown(socket.SHUT_WR)
    server.shutdown(socket.SHUT_WR)
    result = relay.relay(inner_c, inner_s)
    assert (result.up, result.down, result.ended) == (27, 0, "eof")
    assert _recv_all(server) == b"early bytes already waiting"
    for s in (client, inner_c, inner_s, server):
        s.close()


def test_a_bug_or_a_failing_callback_costs_one_tunnel_not_the_hub(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hub = relay.Hub()  # its own: the shared one must not see the planted bug
    results: list[RelayResult] = []

    def through(done: relay.Done) -> tuple[socket.socket, socket.socket]:
        client, inner_c = _pair()
        inner_s, server = _pair()
        hub.start(inner_c, inner_s, done)
        inner_c.close()
        inner_s.close()
        for s in (client, server):
            s.settimeout(20)
        return client, server

    def failing(result: RelayResult) -> None:
        results.append(result)
        raise RuntimeError("a callback that fails")

    real_pull, calls = relay.Hub._pull, [0]

    def buggy_once(self: relay.Hub, tunnel: object, way: object) -> bool:
        calls[0] += 1
        if calls[0] == 1:
            raise RuntimeError("a planted bug")
        return real_pull(self, tunnel, way)  # type: ignore[arg-type]

    monkeypatch.setattr(relay.Hub, "_pull", buggy_once)
    c1, s1 = through(failing)
    c1.sendall(b"meets the bug")
    with pytest.raises(ConnectionResetError):  # that tunnel is cut ...
        _recv_all(s1)
    c2, s2 = through(results.append)  # ... and the next one works
    c2.sendall(b"fine")
    c2.shutdown(socket.SHUT_WR)
    assert _recv_all(s2) == b"fine"
    s2.shutdown(socket.SHUT_WR)
    assert _recv_all(c2) == b""
    for s in (c1, s1, c2, s2):
        s.close()
    deadline = threading.Event()
    for _ in range(100):
        if len(results) == 2:
            break
        deadline.wait(0.05)
    assert [r.ended for r in results] == ["error", "eof"]


def test_a_tunnel_that_cannot_be_made_is_reported_not_lost() -> None:
    client, inner_c = _pair()
    inner_s, server = _pair()
    inner_s.close()  # as if it had gone: no duplicate can be made of it
    out: list[RelayResult] = []
    relay.start(inner_c, inner_s, out.append)
    assert [r.ended for r in out] == ["error"] and out[0].error
    for s in (client, inner_c, server):
        s.close()
