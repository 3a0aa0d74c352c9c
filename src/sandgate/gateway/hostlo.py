"""Ports of the host's own loopback for guests: the model server on this host (Ollama on
127.0.0.1:11434) with no change to the server, and nothing else of the host.

Two halves and a channel sandgate owns:

    guest ── GATEWAY:PORT ─► [gateway ns] listener ── Unix socket RUN/hostlo/PORT.sock ─►
             [host ns] host side ─► 127.0.0.1:PORT of the host

* The guest connects to its own gateway address on the port; the ruleset admits exactly the
  ports of its profile's ``host_loopback`` rules (the ``allow.host_loopback`` site, which logs
  the flow like every other) and refuses every other port of the gateway (``deny.gateway``).
* The daemon listens there (``HostLoopback``, one listener per guest and port, like the
  proxy's doors) and relays each connection to the port's Unix socket. The daemon itself never
  opens a socket on the host's network (gateway/daemon.py).
* The host side (``python -m sandgate.gateway.hostlo DIR DAEMON_PID PORT...``, started
  beside the daemon by gateway/manage.py, like pasta, and ending with it) listens on those
  sockets only (mode 0600 in a root-only directory) and dials ``127.0.0.1:PORT`` for the
  ports it was started with; it takes no address or port from the connection, so nothing a
  guest sends can lead it elsewhere.

pasta's ``-T PORT`` would forward a port of the gateway's loopback to the host's as well, but
only where pasta is the uplink (not in the test world, not on a gateway VM) and only with a
DNAT to 127.0.0.1 (``route_localnet`` on guest links) or a relay of our own anyway; this way
the path is the same everywhere and the test world exercises it whole (docs/NOTES.md).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from sandgate.gateway.proxy.relay import relay
from sandgate.net.compile import GuestLink

DIAL_TIMEOUT = 10.0
IDLE = 3600.0  # a model answering slowly streams nothing for a long while
TOTAL = 86400.0


def socket_path(directory: Path, port: int) -> Path:
    return directory / f"{port}.sock"


@dataclass
class _Listeners:
    ports: tuple[int, ...]
    sockets: list[socket.socket] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)


class HostLoopback:
    """The daemon's half: listeners on guests' gateway addresses, relayed to the host side."""

    def __init__(self, directory: Path, served: Iterable[int]) -> None:
        self.directory = directory
        self.served = frozenset(served)  # the ports the host side was started for
        self._guests: dict[str, _Listeners] = {}

    def start_guest(self, link: GuestLink, ports: Iterable[int]) -> None:
        ls = _Listeners(tuple(sorted(set(ports))))
        missing = [p for p in ls.ports if p not in self.served]
        if missing:
            # check_wiring refuses such a policy first; this is the last word.
            raise ValueError(f"host_loopback ports {missing} are not served by this gateway")
        try:
            for port in ls.ports:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                ls.sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((str(link.gateway), port))
                sock.listen(64)
                sock.settimeout(0.5)
                ls.threads.append(
                    threading.Thread(
                        target=self._accept_loop,
                        args=(sock, port, ls.stop),
                        name=f"hostlo-{link.ifname}-{port}",
                        daemon=True,
                    )
                )
        except BaseException:
            _close(ls)
            raise
        for t in ls.threads:
            t.start()
        self._guests[link.ifname] = ls

    def ports(self, link: GuestLink) -> tuple[int, ...]:
        ls = self._guests.get(link.ifname)
        return ls.ports if ls is not None else ()

    def stop_guest(self, link: GuestLink) -> None:
        ls = self._guests.pop(link.ifname, None)
        if ls is not None:
            _close(ls)

    def _accept_loop(self, listener: socket.socket, port: int, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._serve, args=(conn, port), daemon=True).start()

    def _serve(self, conn: socket.socket, port: int) -> None:
        with conn:
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            with upstream:
                try:
                    upstream.settimeout(DIAL_TIMEOUT)
                    upstream.connect(str(socket_path(self.directory, port)))
                    upstream.settimeout(None)
                except OSError as exc:
                    sys.stderr.write(f"sandgate gateway: host_loopback {port}: {exc}\n")
                    return
                relay(conn, upstream, idle=IDLE, total=TOTAL)


def _close(ls: _Listeners) -> None:
    ls.stop.set()
    for s in ls.sockets:
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in accept()
        s.close()
    for t in ls.threads:
        t.join(1)


# -- the host side ------------------------------------------------------------------------------


def unserved(
    ports: Iterable[int], proc: Path = Path("/proc/net"), addresses: Iterable[str] = ("127.0.0.1",)
) -> list[int]:
    """The ports nothing listens on at ``addresses`` (or every address) in the namespace whose
    ``/proc/.../net`` is ``proc``. Read from tcp and tcp6, so checking sends nothing."""
    listening: set[int] = set()
    local4 = {"00000000", *(socket.inet_aton(a)[::-1].hex().upper() for a in addresses)}
    # [::] and ::ffff:A.B.C.D: a dual-stack listener takes IPv4 too.
    local6 = {"0" * 32, *(f"0000000000000000FFFF0000{h}" for h in local4 - {"00000000"})}
    for name, local in (("tcp", local4), ("tcp6", local6)):
        with contextlib.suppress(OSError):
            for line in (proc / name).read_text().splitlines()[1:]:
                parts = line.split()
                if len(parts) > 3 and parts[3] == "0A":  # LISTEN
                    addr, _, port = parts[1].partition(":")
                    if addr in local:
                        listening.add(int(port, 16))
    return sorted(set(ports) - listening)


def serve_host_side(directory: Path, ports: Iterable[int]) -> list[threading.Thread]:
    """Listen on each port's Unix socket in ``directory``; relay to 127.0.0.1:PORT."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    threads = []
    for port in sorted(set(ports)):
        path = socket_path(directory, port)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(path))
        os.chmod(path, 0o600)
        listener.listen(64)
        thread = threading.Thread(target=_host_accept, args=(listener, port), daemon=True)
        thread.start()
        threads.append(thread)
    return threads


def _host_accept(listener: socket.socket, port: int) -> None:
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_host_serve, args=(conn, port), daemon=True).start()


def _host_serve(conn: socket.socket, port: int) -> None:
    with conn:
        try:
            server = socket.create_connection(("127.0.0.1", port), timeout=DIAL_TIMEOUT)
        except OSError as exc:
            sys.stderr.write(f"sandgate host side: 127.0.0.1:{port}: {exc}\n")
            return
        with server:
            server.settimeout(None)
            server.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            relay(conn, server, idle=IDLE, total=TOTAL)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 3 or not all(a.isdigit() for a in args[1:]):
        sys.stderr.write("usage: python -m sandgate.gateway.hostlo DIR DAEMON_PID PORT...\n")
        return 2
    daemon = int(args[1])
    serve_host_side(Path(args[0]), [int(a) for a in args[2:]])
    sys.stdout.write("READY\n")
    sys.stdout.flush()
    # Lives as long as its daemon (a killed `sandgate run` must not leave it behind).
    while Path(f"/proc/{daemon}").exists():
        time.sleep(1.0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
