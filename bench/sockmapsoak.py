"""The kernel relay's hold, soaked: many two-way tunnels whose guest pauses, each byte checked.

``PYTHONPATH=src:. python -m bench.sockmapsoak [ROUNDS] [--fast]`` (root, 127.0.0.1 only). Each
round is one tunnel through sockmap.py: 256 MiB down and 64 MiB up at once, every 8-byte word its
own offset, the guest reading flat out (odd rounds) or pausing 0.3 s every 16 MiB (even rounds).
Checking each word costs the readers a core (~110 MB/s flat out); ``--fast`` sends one random
MiB over and over and compares SHA-256 digests instead (hashlib leaves the GIL), at ~1 GB/s.
Prints per round MB/s down and what each stream did: ``ok`` (whole and in order), ``reset``,
``stall`` (5 s without a byte, with the ways' counters ``C P R S``) or ``corrupt`` (it ended
clean but wrong: the failure that must never happen; a reader whose socket's sender met the
reset first may see a plain end, so ``senders_cut`` says whether a sender was cut), and the
relay's result; at the end the failures by kind, the program's holds and the MiB user space
carried for held ways.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import threading
import time
from array import array
from collections import Counter
from typing import Any

from sandgate.gateway.proxy import sockmap
from sandgate.gateway.proxy.relay import RelayResult

DOWN, UP, CHUNK = 256 << 20, 64 << 20, 1 << 16


def _numbered(start: int, size: int) -> bytes:
    words = array("Q", range(start, start + size, 8))
    if sys.byteorder == "little":
        words.byteswap()  # big-endian: the stream reads in order
    return words.tobytes()


def _pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        a = socket.create_connection(listener.getsockname())
        b, _ = listener.accept()
    return a, b


BLOB = os.urandom(1 << 20)
FAST = "--fast" in sys.argv


def _send(sock: socket.socket, total: int, cut: list[str]) -> None:
    try:
        _send_all(sock, total)
    except OSError as exc:  # the relay reset the tunnel: the reader may see only an end
        cut.append(type(exc).__name__)


def _send_all(sock: socket.socket, total: int) -> None:
    if FAST:
        for _ in range(total // len(BLOB)):
            sock.sendall(BLOB)
    else:
        for at in range(0, total, CHUNK):
            sock.sendall(_numbered(at, CHUNK))
    sock.shutdown(socket.SHUT_WR)


def _read(sock: socket.socket, total: int, pause_every: int, into: list[int]) -> str:
    """``ok`` (the stream arrived whole and in order), ``corrupt`` (it ended clean, wrong),
    ``reset`` (the relay cut it) or ``stall`` (5 s without a byte). into[0]: bytes so far."""
    try:
        whole = (_read_fast if FAST else _read_words)(sock, total, pause_every, into)
    except ConnectionResetError:
        return "reset"
    except TimeoutError:
        return "stall"
    return "ok" if whole else "corrupt"


def _read_fast(sock: socket.socket, total: int, pause_every: int, into: list[int]) -> bool:
    want, got = hashlib.sha256(), hashlib.sha256()
    for _ in range(total // len(BLOB)):
        want.update(BLOB)
    buf = bytearray(1 << 20)
    next_pause = pause_every
    while True:
        n = sock.recv_into(buf)
        if not n:
            break
        got.update(memoryview(buf)[:n])
        into[0] += n
        if pause_every and into[0] >= next_pause:
            time.sleep(0.3)
            next_pause += pause_every
    return into[0] == total and got.digest() == want.digest()


def _read_words(sock: socket.socket, total: int, pause_every: int, into: list[int]) -> bool:
    expect, buf = 0, b""
    good = True
    next_pause = pause_every
    while True:
        data = sock.recv(CHUNK)
        if not data:
            break
        buf += data
        whole = len(buf) - len(buf) % CHUNK
        if whole:
            good = good and buf[:whole] == _numbered(expect, whole)
            expect, buf = expect + whole, buf[whole:]
        into[0] += len(data)
        if pause_every and into[0] >= next_pause:
            time.sleep(0.3)
            next_pause += pause_every
    return good and not buf and expect == total


def one_round(kernel: sockmap.Kernel, pause: bool) -> dict[str, Any]:
    client, inner_c = _pair()
    inner_s, server = _pair()
    out: list[RelayResult] = []
    kernel.start(inner_c, inner_s, out.append)
    inner_c.close()
    inner_s.close()
    for sock in (client, server):
        sock.settimeout(5)
    up_ok, down_n, up_n = ["stall"], [0], [0]
    cut: list[str] = []  # senders that met a reset

    def far_end() -> None:
        threading.Thread(target=_send, args=(server, DOWN, cut), daemon=True).start()
        up_ok[0] = _read(server, UP, 0, up_n)

    reader = threading.Thread(target=far_end, daemon=True)
    reader.start()
    threading.Thread(target=_send, args=(client, UP, cut), daemon=True).start()
    t0 = time.monotonic()
    down_ok = _read(client, DOWN, 16 << 20 if pause else 0, down_n)
    seconds = time.monotonic() - t0
    reader.join(10)
    row: dict[str, Any] = {
        "pause": pause,
        "ok": down_ok == up_ok[0] == "ok",
        "down_is": down_ok,
        "up_is": up_ok[0],
        "senders_cut": cut,
        "MB_s": round(DOWN / seconds / 1e6),
        "down": down_n[0],
        "up": up_n[0],
    }
    if not row["ok"] and kernel.maps is not None:
        counters = kernel.maps.counters
        row["ways"] = [
            {"C P R S": list(counters[4 * slot : 4 * slot + 4]), "carrying": way.carrying}
            for slot, (_, way) in kernel._ways.items()
        ]
    client.close()
    server.close()
    time.sleep(0.6)  # past a tick: the relay has ended the tunnel
    if out:
        row["ended"], row["error"] = out[0].ended, out[0].error
    return row


def main(rounds: int) -> dict[str, Any]:
    kernel = sockmap.KERNEL
    kernel.on = True
    if not kernel._ready():
        raise SystemExit(f"the kernel relay cannot load here: {kernel.unavailable}")
    rows = []
    for i in range(rounds):
        row = one_round(kernel, pause=i % 2 == 0)
        print(json.dumps(row), file=sys.stderr)
        rows.append(row)
    return {
        "rounds": rounds,
        "failed": sum(not r["ok"] for r in rows),
        "by_kind": dict(Counter(f"{r['down_is']}/{r['up_is']}" for r in rows if not r["ok"])),
        "holds": kernel.holds,
        "carried_MiB": kernel.carried >> 20,
        "kicks": kernel.kicks,  # ticks that found bytes unjudged and ran the program on them
        "moved_MiB": rounds * (DOWN + UP) >> 20,
        "MB_s_flat_out": sorted(r["MB_s"] for r in rows if not r["pause"]),
        "routes": kernel.routes(),
    }


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--fast"]
    print(json.dumps(main(int(args[0]) if args else 20), indent=1))
