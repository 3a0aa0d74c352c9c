"""The proxy's one accepting thread (gateway/proxy/accept.py), on loopback listeners."""

from __future__ import annotations

import socket
import threading
import time

from sandgate.gateway.proxy.accept import Acceptor


def _listener() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    return s


def _wait(cond: object, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():  # type: ignore[operator]
            return True
        time.sleep(0.01)
    return False


def test_one_thread_accepts_on_every_listener_and_a_removed_one_is_not_served() -> None:
    got: list[tuple[int, socket.socket]] = []
    lock = threading.Lock()

    def on_conn(conn: socket.socket, peer: tuple[str, int], door: int) -> None:
        with lock:
            got.append((door, conn))

    before = threading.active_count()
    acceptor = Acceptor(on_conn)
    listeners = [_listener() for _ in range(20)]
    for i, s in enumerate(listeners):
        acceptor.add(s, i)
    assert threading.active_count() == before + 1
    clients = [socket.create_connection(s.getsockname(), timeout=5) for s in listeners]
    clients += [socket.create_connection(listeners[3].getsockname(), timeout=5) for _ in range(5)]
    assert _wait(lambda: len(got) == 25), len(got)
    assert sorted(d for d, _ in got) == sorted([*range(20), 3, 3, 3, 3, 3])

    gone = listeners[7]
    address = gone.getsockname()
    assert acceptor.serves(gone)
    acceptor.remove(gone)
    assert not acceptor.serves(gone)
    gone.close()
    try:
        socket.create_connection(address, timeout=2).close()
        refused = False
    except ConnectionRefusedError:
        refused = True
    assert refused
    # The others are still served, and a listener added later is too.
    late = _listener()
    acceptor.add(late, 99)
    clients.append(socket.create_connection(listeners[0].getsockname(), timeout=5))
    clients.append(socket.create_connection(late.getsockname(), timeout=5))
    assert _wait(lambda: len(got) == 27)
    assert {d for d, _ in got[25:]} == {0, 99}
    for c in clients:
        c.close()
    for _, conn in got:
        conn.close()
    for s in [*listeners, late]:
        acceptor.remove(s)
        s.close()


def test_a_failing_handler_does_not_stop_the_acceptor() -> None:
    calls: list[int] = []

    def on_conn(conn: socket.socket, peer: tuple[str, int], door: int) -> None:
        calls.append(door)
        if len(calls) == 1:
            raise RuntimeError("boom")
        conn.close()

    acceptor = Acceptor(on_conn)
    s = _listener()
    acceptor.add(s, 1)
    a = socket.create_connection(s.getsockname(), timeout=5)
    assert _wait(lambda: len(calls) == 1)
    b = socket.create_connection(s.getsockname(), timeout=5)
    assert _wait(lambda: len(calls) == 2)
    a.close()
    b.close()
    acceptor.remove(s)
    s.close()
