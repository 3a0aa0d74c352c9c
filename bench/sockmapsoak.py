"""The kernel relay's hold, soaked: many two-way tunnels whose guest pauses, each byte checked.

``PYTHONPATH=src:. python -m bench.sockmapsoak [ROUNDS]`` (root, 127.0.0.1 only). Each round is
one tunnel through sockmap.py: 256 MiB down and 64 MiB up at once, every 8-byte word its own
offset, the guest reading flat out (odd rounds) or pausing 0.3 s every 16 MiB (even rounds).
Prints per round MB/s down and whether both streams arrived whole and in order; at the end the
failures, the program's holds and the bytes user space carried for held ways. A round whose
streams stop for 5 s counts as a stall, with the way's counters (``C P R S``) printed.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from array import array
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


def _send(sock: socket.socket, total: int) -> None:
    for at in range(0, total, CHUNK):
        sock.sendall(_numbered(at, CHUNK))
    sock.shutdown(socket.SHUT_WR)


def _read(sock: socket.socket, total: int, pause_every: int, into: list[int]) -> bool:
    """Whether the stream arrived whole and in order (into[0]: bytes so far)."""
    expect, buf = 0, b""
    good = True
    next_pause = pause_every
    while True:
        try:
            data = sock.recv(CHUNK)
        except TimeoutError:
            return False
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
    up_ok, down_n, up_n = [False], [0], [0]

    def far_end() -> None:
        threading.Thread(target=_send, args=(server, DOWN), daemon=True).start()
        up_ok[0] = _read(server, UP, 0, up_n)

    reader = threading.Thread(target=far_end, daemon=True)
    reader.start()
    threading.Thread(target=_send, args=(client, UP), daemon=True).start()
    t0 = time.monotonic()
    down_ok = _read(client, DOWN, 16 << 20 if pause else 0, down_n)
    seconds = time.monotonic() - t0
    reader.join(10)
    row: dict[str, Any] = {
        "pause": pause,
        "ok": down_ok and up_ok[0],
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
    time.sleep(0.2)
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
        "holds": kernel.holds,
        "carried_MiB": kernel.carried >> 20,
        "moved_MiB": rounds * (DOWN + UP) >> 20,
        "MB_s_flat_out": sorted(r["MB_s"] for r in rows if not r["pause"]),
        "routes": kernel.routes(),
    }


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 20), indent=1))
