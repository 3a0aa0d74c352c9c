"""Raw tunnels carried by the kernel: a BPF sockmap joins the two sockets after the verdict.

The splice hub (relay.py) costs each message two wake-ups of a Python thread and four splices.
Here an SK_SKB stream-verdict program redirects every arriving skb to the peer socket's egress
inside the kernel, so no byte and no wake-up reaches user space. Only raw passthrough tunnels
come here (server.py's ``_raw``, after ``raw_relay``); inspected ones never do.

Two SOCKHASH maps, keyed by socket cookie (SO_COOKIE, u64):
- ``peers``: under each socket's cookie, the *other* socket. No program is attached to it: it
  is only where the program looks the peer up.
- ``joined``: each socket under its own cookie; the verdict program is attached to this map,
  so a socket gets the program when it is put here. Both sockets are in ``peers`` before
  either is in ``joined``, so no skb ever meets a missing peer (that skb would be dropped).
Closing a socket takes it out of both maps (the kernel's sock_map_close); nothing is left.

Two more maps give each way (one direction of a tunnel) its counters: ``slots`` (a hash,
cookie -> slot) and ``ways`` (an array of four u64s per slot, mmap'd into this process).

The program (assembled by net/bpf.py; ``program`` spells it out), per arriving skb:
- an empty skb (the FIN's) is dropped: sent on it would hit the shut socket (EPIPE); the FIN
  itself is user space's job;
- it finds the way's counters; if user space has not yet carried every byte the program passed
  (PASSED != CONSUMED) the skb is passed too, so the stream keeps its order;
- it looks up the peer socket and reads its ``struct tcp_sock`` (bytes_acked, write_seq,
  snd_una; offsets from the kernel's BTF, net/btf.py) to count the bytes redirected to it that
  its TCP has not taken yet (START + REDIRECTED + CONSUMED - handed): the peer psock's queue,
  which the kernel does not bound and does not charge to tcp_mem. At HOLD_AT or more it passes;
- else it redirects the skb to the peer's egress (bpf_sk_redirect_hash) and counts it.
A passed skb goes to the source socket's own queue (its psock's ingress_msg), charged to its
receive buffer, which closes the far end's window: that is the hold. The relay thread notices
a hold within HELD_POLL (the program counts every pass in one u64, SIGNAL), waits until the
peer's TCP has taken every redirected byte, then carries the held bytes itself (recv, send,
CONSUMED += sent) and hands the way back to the program when PASSED == CONSUMED. The program
runs under the source socket's lock, one skb at a time, so the test is not racy. What one
tunnel can make the gateway hold is then HOLD_AT a way plus TCP's own buffers; without the hold,
a guest that stops reading let a far end park 256 MiB in seconds (test_sockmap).

User space keeps the rest, from one thread and one epoll that wakes only on FIN, reset and a
tick (not on data):
- bytes already queued on a socket when it joins would wait for the next segment (the program
  runs on data_ready): setting SO_RCVLOWAT runs data_ready at once (tcp_set_rcvlowat);
- half-close: a FIN one way (EPOLLRDHUP) shuts the other socket's write side once every byte
  has reached it (the redirect is asynchronous): bytes received on the source (TCP_INFO
  bytes_received, less the FIN's one) equal bytes written to the destination (bytes_sent less
  bytes_retrans, plus notsent_bytes);
- a reset (EPOLLERR) resets the other side, as the hub does;
- idle (TCP_INFO last_data_recv of both sockets) and total timeouts, on the tick;
- byte counts for the event, from the same counters.
A byte cap cannot be held exactly from user space while the kernel moves the bytes, so a capped
tunnel goes to the splice hub, where it is exact. Anything missing in BPF (an older kernel,
EPERM, a verifier refusal) sends every tunnel to the hub, said once on stderr; a socket the map
refuses (not ESTABLISHED any more) sends that tunnel there. A tunnel is never failed for it.
The kernel relay is off unless ``SANDGATE_SOCKMAP=1`` is in the gateway's environment (``ON``);
off, every tunnel goes to the hub (``hub.off``).
``Kernel.routes()`` counts where each tunnel went (``kernel``, or ``hub.<why>``), so a
benchmark can tell a kernel tunnel from a fallback.

What the kernel's redirect costs (2026-12-01, kernel 6.18, ``python -m bench.relayloop 3 --trace``):
the kernel never sends a redirected skb from the softirq that received it. sk_psock_skb_redirect
queues it on the peer's psock and schedules sk_psock_backlog on the system workqueue, so each
message wakes a kworker on the receiving CPU, which sends it on (net/core/skmsg.c: the same for an
ingress redirect and with a stream parser; an sk_msg program runs only on a local sendmsg, never on
bytes that arrive: no variant avoids it). Traced: exactly two work items per one-byte round trip. On
loopback, load 1.5-2.6: queue to start 4-5 µs p50, the send (with the receiver's softirq) 5-7 µs; a
round trip 34-42 µs against 15-19 µs with no relay (+19..25: the two waits are 8-10 of it, the rest
is the second TCP connection's send and receive, which any relay that ends TCP pays), and 36-50 µs
of CPU against 15-20 (+21..30). No Python runs per message. Under ``bench/run proxy`` (both cores
busy) each wait grew to 11 µs p50, 30 µs p90, 115 µs p99: the relay's +40 µs goal holds on a free
core and is lost to the run queue on a busy one, which user space cannot shorten (the kworkers are
the kernel's, at nice 0).
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import select
import socket
import struct
import sys
import termios
import threading
import time
import traceback
from array import array
from collections import Counter, deque
from dataclasses import dataclass
from typing import NamedTuple

from sandgate.gateway.proxy import relay
from sandgate.gateway.proxy.relay import Done, RelayResult
from sandgate.net import bpf, btf

TICK = 0.5  # seconds between checks of the tunnels' deadlines
# While a FIN waits for its bytes to reach the peer, it is checked again after 1 ms, then twice
# as long each time the bytes have not moved (a peer that stopped reading costs ~10 checks a
# second, not a thousand).
DRAIN_POLL, DRAIN_POLL_MAX = 0.001, 0.1
# The joined sockets keep the kernel's autotuned buffers. When the kernel's send to the peer meets
# a full send buffer it retries a jiffy later (4 ms at HZ=250), not when room appears: a fixed
# 64 KiB buffer moved 15 MB/s on loopback. Fixed 4 MiB buffers (SO_SNDBUF/SO_RCVBUF, until
# 2026-12-01) cost the two ends more in bench/run proxy (veth, TLS ends, load 2-8): the client
# and server spent +0.48..0.92 s of CPU per GB above the kernel path (7 runs) against -0.11..+0.38
# autotuned (4 runs), and 2.55/2.94 against 1.76/1.98 s/GB in 2 interleaved sg-connect pairs
# (175/397 against 310/631 MB/s); the client sent 2 to 5 times the ACKs (40-42k against 8-20k
# segments a run). Bulk ratios to the kernel path did not move (medians 0.88 and 0.87). On
# loopback alone (bench.relayloop, 3 pairs) the fixed buffers did better: 529-701 against
# 470-558 MB/s, kworker 0.19-0.21 against 0.28-0.36 s/GB. A fixed size also disables autotuning
# and is capped at wmem_max/rmem_max (208 KiB when stock).
MAX_TUNNELS = 1 << 15  # each map holds two sockets per tunnel; past this, tunnels take the hub
SO_COOKIE = getattr(socket, "SO_COOKIE", 57)
_TCP_INFO_LEN = 232  # through tcpi_bytes_retrans (include/uapi/linux/tcp.h)
_RDHUP, _ERR, _HUP = select.EPOLLRDHUP, select.EPOLLERR, select.EPOLLHUP
_WATCH = select.EPOLLRDHUP | select.EPOLLET  # FIN once; ERR and HUP are always reported
_CARRY = _WATCH | select.EPOLLIN | select.EPOLLOUT  # while user space carries a held way
# While any tunnel is joined, the thread looks this often for ways the program began to hold
# (one u64, SIGNAL, not every way). A held way waits at most this long to be carried.
HELD_POLL = 0.01
STUCK_TICKS = 4  # ticks a way's arrived bytes may stay unjudged (kicked each tick) before a reset
CARRY_CHUNK = 1 << 20  # bytes one recv takes from a held way's source, into the way's buffer
_NOTHING = memoryview(b"")


def cookie(sock: socket.socket) -> bytes:
    """The socket's cookie as the maps' 8-byte key (the kernel's byte order, as the program
    stores it)."""
    return sock.getsockopt(socket.SOL_SOCKET, SO_COOKIE, 8)


@dataclass(frozen=True)
class Counters:
    """What TCP_INFO tells of one socket (include/uapi/linux/tcp.h offsets)."""

    received: int  # tcpi_bytes_received: payload in, plus one for a FIN
    written: int  # bytes handed to TCP to send: sent once (sent - retrans) + not yet sent
    quiet_ms: int  # tcpi_last_data_recv: since data last arrived

    @classmethod
    def of(cls, sock: socket.socket) -> Counters:
        raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
        if len(raw) < 216:  # a kernel before 4.19: no tcpi_bytes_sent/retrans
            raise OSError(95, "TCP_INFO without byte counts")  # EOPNOTSUPP
        (quiet,) = struct.unpack_from("<I", raw, 52)
        (received,) = struct.unpack_from("<Q", raw, 128)
        (notsent,) = struct.unpack_from("<I", raw, 144)
        sent, retrans = struct.unpack_from("<QQ", raw, 200)
        return cls(received, sent - retrans + notsent, quiet)


# A way's counters, one 32-byte element of the ``ways`` array per source socket (u64 each),
# mapped into user space. User space writes CONSUMED (bytes it carried itself) and START (what
# the peer had been handed before the join), the program PASSED and REDIRECTED; each side only
# reads the other's, so neither overwrites what the other counts.
CONSUMED, PASSED, REDIRECTED, START = range(4)
WAY_SIZE = 8 * 4
# What one way may queue in the gateway outside TCP: bytes redirected to the peer and not yet
# handed to its TCP (the peer psock's queue, which has no bound of its own and is not charged to
# tcp_mem; the peer's send buffer bounds the rest). Past it the program holds the way: its bytes
# stay in the source's own queue, whose receive buffer closes the far end's window.
HOLD_AT = 1 << 20
WAYS = 2 * MAX_TUNNELS
# The element after the ways': its first u64 counts the program's holds, so the relay thread
# reads one number to know whether any way became held, not every way's counters.
SIGNAL = WAYS


class TcpFields(NamedTuple):
    """Where the program reads a ``struct tcp_sock`` (this kernel's offsets, from its BTF)."""

    bytes_acked: int  # u64: data bytes the peer acknowledged
    write_seq: int  # u32: the sequence number after the last byte handed to TCP
    snd_una: int  # u32: the first byte not yet acknowledged

    @classmethod
    def here(cls) -> TcpFields:
        return cls(*(btf.member_offset("tcp_sock", field) for field in cls._fields))


def program(peers_fd: int, slots_fd: int, ways_fd: int, tcp: TcpFields) -> bytes:
    """The verdict program: redirect to the peer, or hold the way (SK_PASS to the source's own
    queue) while bytes are passed and not yet carried by user space, or while the peer has
    HOLD_AT bytes not acknowledged. ``acked_at``: ``struct tcp_sock``'s ``bytes_acked``."""
    b, J = bpf, bpf.Jump
    cookie_at, slot_at, handed_tmp = -8, -16, -24
    return b.assemble(
        (
            b.load_w(b.R2, b.R1, 0),  # skb->len
            J(b.JEQ_K, "drop", b.R2),  # the FIN's empty skb: user space carries the FIN
            b.mov_reg(b.R6, b.R1),  # the __sk_buff (calls clobber r1-r5)
            b.mov_reg(b.R7, b.R2),  # its length
            b.call(b.FUNC_GET_SOCKET_COOKIE),
            b.store_dw(b.R10, cookie_at, b.R0),
            b.ld_map_fd(b.R1, slots_fd),  # cookie -> the way's slot in ``ways``
            b.mov_reg(b.R2, b.R10),
            b.add_imm(b.R2, cookie_at),
            b.call(b.FUNC_MAP_LOOKUP_ELEM),
            J(b.JEQ_K, "redirect", b.R0),  # no slot: cannot happen (made before the join)
            b.load_w(b.R2, b.R0, 0),
            b.store_w(b.R10, slot_at, b.R2),
            b.ld_map_fd(b.R1, ways_fd),
            b.mov_reg(b.R2, b.R10),
            b.add_imm(b.R2, slot_at),
            b.call(b.FUNC_MAP_LOOKUP_ELEM),
            J(b.JEQ_K, "redirect", b.R0),
            b.mov_reg(b.R8, b.R0),  # the way's counters
            b.load_dw(b.R2, b.R8, 8 * PASSED),
            b.load_dw(b.R3, b.R8, 8 * CONSUMED),
            J(b.JNE_X, "pass", b.R2, b.R3),  # passed bytes not yet carried: keep the order
            b.ld_map_fd(b.R1, peers_fd),  # the peer socket (a reference, released below)
            b.mov_reg(b.R2, b.R10),
            b.add_imm(b.R2, cookie_at),
            b.call(b.FUNC_MAP_LOOKUP_ELEM),
            J(b.JEQ_K, "redirect", b.R0),  # no peer: the redirect drops it, as before
            b.mov_reg(b.R9, b.R0),
            b.mov_reg(b.R1, b.R0),
            b.call(b.FUNC_SKC_TO_TCP_SOCK),
            J(b.JEQ_K, "release", b.R0),
            # what the peer's TCP holds or has sent = acked + (write_seq - snd_una), in u32
            b.load_w(b.R3, b.R0, tcp.write_seq),
            b.load_w(b.R4, b.R0, tcp.snd_una),
            b.sub32_reg(b.R3, b.R4),
            b.load_dw(b.R2, b.R0, tcp.bytes_acked),
            b.add_reg(b.R2, b.R3),
            b.store_dw(b.R10, handed_tmp, b.R2),
            b.mov_reg(b.R1, b.R9),
            b.call(b.FUNC_SK_RELEASE),
            # queued = start + redirected + consumed - handed: on the peer's psock, not in its TCP
            b.load_dw(b.R2, b.R8, 8 * START),
            b.load_dw(b.R3, b.R8, 8 * REDIRECTED),
            b.add_reg(b.R2, b.R3),
            b.load_dw(b.R3, b.R8, 8 * CONSUMED),
            b.add_reg(b.R2, b.R3),
            b.load_dw(b.R3, b.R10, handed_tmp),
            b.sub_reg(b.R2, b.R3),
            J(b.JSGE_K, "pass", b.R2, imm=HOLD_AT),
            b.load_dw(b.R2, b.R8, 8 * REDIRECTED),
            b.add_reg(b.R2, b.R7),
            b.store_dw(b.R8, 8 * REDIRECTED, b.R2),
            "redirect",
            b.mov_reg(b.R1, b.R6),
            b.ld_map_fd(b.R2, peers_fd),
            b.mov_reg(b.R3, b.R10),
            b.add_imm(b.R3, cookie_at),
            b.mov_imm(b.R4, 0),  # 0: the peer's egress (send it), not its ingress
            b.call(b.FUNC_SK_REDIRECT_HASH),  # SK_PASS with the redirect set, SK_DROP if no peer
            b.exit_(),
            "release",
            b.mov_reg(b.R1, b.R9),
            b.call(b.FUNC_SK_RELEASE),
            J(b.JA, "redirect"),
            "pass",
            b.load_dw(b.R2, b.R8, 8 * PASSED),
            b.add_reg(b.R2, b.R7),
            b.store_dw(b.R8, 8 * PASSED, b.R2),
            b.mov_imm(b.R2, SIGNAL),  # and say so: user space looks for held ways when it moves
            b.store_w(b.R10, slot_at, b.R2),
            b.ld_map_fd(b.R1, ways_fd),
            b.mov_reg(b.R2, b.R10),
            b.add_imm(b.R2, slot_at),
            b.call(b.FUNC_MAP_LOOKUP_ELEM),
            J(b.JEQ_K, "passed", b.R0),
            b.load_dw(b.R2, b.R0, 0),
            b.add_imm(b.R2, 1),
            b.store_dw(b.R0, 0, b.R2),
            "passed",
            b.mov_imm(b.R0, b.SK_PASS),
            b.exit_(),
            "drop",
            b.mov_imm(b.R0, b.SK_DROP),
            b.exit_(),
        )
    )


@dataclass(frozen=True)
class Maps:
    """The maps and the program, made once per process and kept open for its life."""

    peers: int
    joined: int
    slots: int  # cookie -> the way's index in ``ways``
    ways: int
    prog: int
    counters: memoryview  # ``ways`` mapped, as u64s: way i's are [4 * i, 4 * i + 4)

    @classmethod
    def make(cls) -> Maps:
        made: list[int] = []
        try:
            tcp = TcpFields.here()
            # ``joined`` has room to spare: a tunnel that got into ``peers`` gets into ``joined``
            # (a tunnel refused half-joined goes to the hub, and bytes the kernel had already
            # taken could race the hub's).
            for size in (2 * MAX_TUNNELS, 2 * MAX_TUNNELS + 1024):
                made.append(bpf.map_create(bpf.MAP_TYPE_SOCKHASH, 8, 8, size))
            made.append(bpf.map_create(bpf.MAP_TYPE_HASH, 8, 4, 2 * MAX_TUNNELS + 1024))
            made.append(bpf.map_create(bpf.MAP_TYPE_ARRAY, 4, WAY_SIZE, WAYS + 1, bpf.F_MMAPABLE))
            made.append(
                bpf.prog_load(
                    bpf.PROG_TYPE_SK_SKB,
                    program(made[0], made[2], made[3], tcp),
                    "sg_tunnel",
                )
            )
            bpf.prog_attach(made[1], made[4], bpf.SK_SKB_STREAM_VERDICT)
            size = (WAYS + 1) * WAY_SIZE
            mem = mmap.mmap(made[3], size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except (OSError, btf.BtfError) as exc:
            for fd in made:
                with contextlib.suppress(OSError):
                    os.close(fd)
            if isinstance(exc, btf.BtfError):
                raise OSError(95, str(exc)) from exc  # EOPNOTSUPP: the hub carries tunnels
            raise
        peers, joined, slots, ways, prog = made
        return cls(peers, joined, slots, ways, prog, memoryview(mem).cast("Q"))


class _Way:
    """One direction, ``src`` -> ``dst``; counts are relative to the hand-off."""

    __slots__ = (
        "buffer",
        "carrying",
        "closed",
        "dst",
        "eof",
        "moved",
        "pending",
        "slot",
        "src",
        "stuck",
        "taken0",
        "written0",
    )

    def __init__(
        self, src: socket.socket, dst: socket.socket, taken0: int, written0: int, slot: int
    ) -> None:
        self.src, self.dst = src, dst
        self.taken0 = taken0  # bytes received on src that were no longer queued at hand-off
        self.written0 = written0  # bytes written to dst before the hand-off
        self.slot = slot  # its counters in ``Maps.counters``: [4 * slot, 4 * slot + 4)
        self.eof = False  # src has sent FIN
        self.closed = False  # and it was carried over: dst's write side is shut
        self.moved = 0  # bytes written to dst since the hand-off, when last counted
        self.carrying = False  # the program holds the way: user space carries its bytes
        self.pending = _NOTHING  # read from src, not yet taken by dst's TCP (in ``buffer``)
        self.buffer: bytearray | None = None  # while carrying
        self.stuck = (0, 0)  # (bytes judged, ticks since it last moved) while bytes wait

    def drained(self) -> bool:
        """Every byte src received (less the FIN) has been handed to dst's TCP. More than that
        is the kernel's double verdict (``Overcounted``): the tunnel must not end clean."""
        dst = Counters.of(self.dst)  # first: what it was handed had arrived on src by then
        src = Counters.of(self.src)
        self.moved = dst.written - self.written0
        arrived = src.received - 1 - self.taken0
        if self.moved > arrived:
            raise Overcounted(self.moved - arrived)
        return arrived == self.moved

    def unjudged(self, counters: memoryview) -> int:
        """Bytes arrived on src that the program has not judged; negative: it judged more than
        arrived (``Overcounted``). Judged are read first: by then they had all arrived."""
        at = 4 * self.slot
        judged = counters[at + REDIRECTED] + counters[at + PASSED]
        return Counters.of(self.src).received - self.eof - self.taken0 - judged


class Overcounted(OSError):
    """The kernel ran the verdict twice on the same bytes and sent them on twice.

    Seen on 6.18 in bench/sockmapsoak, with and without the hold (NOTES, 2026-12-07): one skb
    counted twice, its bytes delivered twice, or the socket's read position moved past bytes
    still queued (the tunnel stalls). The stream is corrupt: the tunnel is reset, so neither
    end takes it for a clean one."""

    def __init__(self, extra: int) -> None:
        super().__init__(5, f"the kernel relay sent {extra} bytes twice (sockmap): reset")  # EIO


class Stuck(OSError):
    """Bytes arrived and the program never ran on them (kernel 6.18, with the hold: about one
    paused soak round in sixty; NOTES 2026-12-07). A kick did not help: reset, not a hang."""

    def __init__(self, waiting: int) -> None:
        super().__init__(5, f"the kernel relay left {waiting} bytes unjudged (sockmap): reset")


class _Tunnel:
    __slots__ = ("deadline", "done", "down", "idle", "keys", "socks", "start", "up")

    def __init__(
        self,
        client: socket.socket,
        server: socket.socket,
        up: _Way,
        down: _Way,
        keys: tuple[bytes, bytes],
    ) -> None:
        self.socks = (client, server)
        self.up, self.down = up, down
        self.keys = keys  # the two sockets' cookies (their keys in the maps)
        self.start = time.monotonic()
        self.idle, self.deadline = 0.0, 0.0
        self.done: Done = lambda _result: None

    def way_from(self, fd: int) -> _Way:
        return self.up if fd == self.up.src.fileno() else self.down


class Kernel:
    """Tunnels joined in the kernel, watched by one thread. ``start`` falls back to ``hub``."""

    def __init__(self, hub: relay.Hub | None = None, *, on: bool = True) -> None:
        self.hub = hub or relay.HUB
        # Off: every tunnel takes the hub (the gateway's default, ``ON``: see its comment).
        self.on = on
        self.maps: Maps | None = None
        self.unavailable: str | None = None  # why BPF cannot carry tunnels here (said once)
        self._said: set[str] = set()
        self._routes: Counter[str] = Counter()  # tunnels by where they went (``routes``)
        self._epoll = select.epoll()
        self._tunnels: dict[int, _Tunnel] = {}  # by each of its two fds
        self._draining: dict[_Tunnel, tuple[float, float, int]] = {}  # next check, wait, moved
        # Slots in ``Maps.counters`` not in use, reused oldest first: a program run that looked
        # a slot up just before its tunnel ended must not count into the next tunnel's way.
        self._free: deque[int] = deque(range(WAYS))
        self._ways: dict[int, tuple[_Tunnel, _Way]] = {}  # by slot
        self._carrying: set[_Way] = set()
        self._signal = 0  # SIGNAL's count when the ways were last looked at
        self.holds = 0  # times a way was held and carried by this thread, since the start
        self.carried = 0  # bytes this thread carried for held ways
        self.kicks = 0  # ticks that found a way's bytes left unjudged, and ran the program
        self._finished: list[tuple[_Tunnel, RelayResult]] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(
        self,
        client: socket.socket,
        server: socket.socket,
        done: Done,
        *,
        idle: float = 300.0,
        total: float = 3600.0,
        cap: int | None = None,
    ) -> None:
        """As ``relay.start``: returns at once, ``done(result)`` runs on a relay thread at the
        end; works on duplicates of the sockets, so the caller closes its own when it likes."""
        hub = self._why_hub(cap)
        if hub is not None:
            self._route(hub)
            self.hub.start(client, server, done, idle=idle, total=total, cap=cap)
            return
        try:
            tunnel = self._join(client, server)
        except Exception as exc:  # the map refused a socket (closing, or not TCP), or a bug
            if not isinstance(exc, OSError):
                traceback.print_exc()
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            self._say(f"a tunnel goes through the splice hub: {why}")
            self._route("hub.refused")
            self.hub.start(client, server, done, idle=idle, total=total, cap=cap)
            return
        tunnel.idle, tunnel.deadline, tunnel.done = idle, tunnel.start + total, done
        with self._lock:
            self._routes["kernel"] += 1
            c, s = tunnel.socks
            self._tunnels[c.fileno()] = self._tunnels[s.fileno()] = tunnel
            for way in (tunnel.up, tunnel.down):
                self._ways[way.slot] = (tunnel, way)
            for sock in tunnel.socks:
                self._epoll.register(sock.fileno(), _WATCH)  # a FIN already in is reported
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="relay-bpf", daemon=True)
                self._thread.start()
        for sock in tunnel.socks:  # bytes queued before the join: run the program on them now
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)

    def count(self) -> int:
        """Tunnels the kernel carries now."""
        return len(self._tunnels) // 2

    def routes(self) -> dict[str, int]:
        """Tunnels started so far, by where they went: ``kernel``, or the hub and why
        (``hub.off``, ``hub.cap``, ``hub.unavailable``, ``hub.full``, ``hub.refused``)."""
        return dict(self._routes)

    # -- set-up -----------------------------------------------------------------------------------

    def _why_hub(self, cap: int | None) -> str | None:
        """Why this tunnel cannot be joined in the kernel (its ``routes`` key), None if it can."""
        if not self.on:
            return "hub.off"
        if cap is not None:
            return "hub.cap"  # only the hub holds a byte cap exactly
        if not self._ready():
            return "hub.unavailable"
        if self.count() >= MAX_TUNNELS:
            return "hub.full"
        return None

    def _route(self, where: str) -> None:
        with self._lock:  # proxy threads start tunnels at once
            self._routes[where] += 1

    def _ready(self) -> bool:
        if self.maps is None and self.unavailable is None:
            with self._lock:
                if self.maps is None and self.unavailable is None:
                    try:
                        self.maps = Maps.make()
                    except OSError as exc:
                        self.unavailable = str(exc).splitlines()[0]
                        self._say(f"CONNECT tunnels go through the splice hub: {self.unavailable}")
        return self.maps is not None

    def _say(self, line: str) -> None:
        if line not in self._said:  # once per reason, not once per tunnel
            self._said.add(line)
            sys.stderr.write(f"sandgate gateway: {line}\n")

    def _join(self, client: socket.socket, server: socket.socket) -> _Tunnel:
        assert self.maps is not None
        maps = self.maps
        dups: list[socket.socket] = []
        done: list[tuple[int, bytes]] = []
        with self._lock:
            slots = (self._free.popleft(), self._free.popleft())  # count() < MAX_TUNNELS
        try:
            dups += [client.dup(), server.dup()]
            c, s = dups
            keys = (cookie(c), cookie(s))
            before = (Counters.of(c), Counters.of(s))
            queued = tuple(_inq(sock) for sock in dups)
            up = _Way(c, s, before[0].received - queued[0], before[1].written, slots[0])
            down = _Way(s, c, before[1].received - queued[1], before[0].written, slots[1])
            for way in (up, down):  # before the program can find the slot
                at = 4 * way.slot
                maps.counters[at : at + 4] = array("Q", (0, 0, 0, way.written0))
            for fd, key, value in (
                (maps.slots, keys[0], struct.pack("<I", slots[0])),
                (maps.slots, keys[1], struct.pack("<I", slots[1])),
                (maps.peers, keys[0], struct.pack("<Q", s.fileno())),
                (maps.peers, keys[1], struct.pack("<Q", c.fileno())),
                (maps.joined, keys[0], struct.pack("<Q", c.fileno())),
                (maps.joined, keys[1], struct.pack("<Q", s.fileno())),
            ):
                bpf.map_update(fd, key, value)
                done.append((fd, key))
        except Exception:
            for fd, key in done:  # nothing was redirected yet: both peers were never joined
                with contextlib.suppress(OSError):
                    bpf.map_delete(fd, key)
            for sock in dups:
                sock.close()
            with self._lock:
                self._free.extend(slots)
            raise
        return _Tunnel(c, s, up, down, keys)

    # -- the thread -------------------------------------------------------------------------------

    def _run(self) -> None:
        next_tick = time.monotonic() + TICK
        while True:
            try:
                now = time.monotonic()
                soonest = min((due for due, _, _ in self._draining.values()), default=now + TICK)
                if self._tunnels:
                    soonest = min(soonest, now + HELD_POLL)
                events = self._epoll.poll(max(0.0, min(soonest - now, TICK)))
            except InterruptedError:
                continue
            with self._lock:
                for fd, ev in events:
                    tunnel = self._tunnels.get(fd)
                    if tunnel is not None:
                        self._guarded(tunnel, self._event, fd, ev)
                self._look_for_held()
                for way in list(self._carrying):
                    tunnel = self._tunnels.get(way.src.fileno())
                    if tunnel is not None:
                        self._guarded(tunnel, self._carry, way)
                now = time.monotonic()
                for tunnel, (due, _, _) in list(self._draining.items()):
                    if now >= due:
                        self._guarded(tunnel, self._carry_fins)
                now = time.monotonic()
                if now >= next_tick:
                    next_tick = now + TICK
                    for tunnel in set(self._tunnels.values()):
                        self._guarded(tunnel, self._check, now)
                finished, self._finished = self._finished, []
            for tunnel, result in finished:  # outside the lock: a callback may start a tunnel
                try:
                    tunnel.done(result)
                except Exception:  # a failing callback must not stop every other tunnel
                    traceback.print_exc()

    def _guarded(self, tunnel: _Tunnel, step: object, *args: object) -> None:
        try:
            step(tunnel, *args)  # type: ignore[operator]
        except OSError as exc:
            self._end(tunnel, "error", exc)
        except Exception:  # a bug must cost this tunnel, not the thread and every other
            traceback.print_exc()
            self._end(tunnel, "error")

    def _event(self, tunnel: _Tunnel, fd: int, ev: int) -> None:
        if ev & _ERR:
            self._end(tunnel, "error", _socket_error(tunnel.way_from(fd).src))
            return
        if ev & (_RDHUP | _HUP):
            tunnel.way_from(fd).eof = True
            self._carry_fins(tunnel)
        # (EPOLLIN and EPOLLOUT come only while a way is carried: the loop carries it next)

    # -- held ways: the program keeps their bytes on the source, user space carries them --------

    def _look_for_held(self) -> None:
        """Start carrying each way the program has begun to hold since the last look."""
        assert self.maps is not None
        counters = self.maps.counters
        signal = counters[4 * SIGNAL]
        if signal == self._signal:
            return  # no hold anywhere since: one read, not one per way
        self._signal = signal
        for tunnel, way in list(self._ways.values()):
            at = 4 * way.slot
            if not way.carrying and counters[at + PASSED] != counters[at + CONSUMED]:
                way.carrying = True
                self.holds += 1
                self._carrying.add(way)
                self._watch(tunnel)

    def _carry(self, tunnel: _Tunnel, way: _Way) -> None:
        """Carry the bytes the program held on ``way`` from its source to its destination, after
        every byte it redirected there before; hand the way back once none is left."""
        assert self.maps is not None
        counters, at = self.maps.counters, 4 * way.slot
        while True:
            if way.pending:
                sent = _send_some(way.dst, way.pending)
                counters[at + CONSUMED] += sent  # after the send: a redirect then comes after it
                self.carried += sent
                way.pending = way.pending[sent:]
                if way.pending:
                    return  # the destination's buffer is full: EPOLLOUT brings it back
            if counters[at + PASSED] == counters[at + CONSUMED]:
                way.carrying = False  # the program redirects again from the next skb on
                way.buffer = None
                self._carrying.discard(way)
                self._watch(tunnel)
                return
            moved = Counters.of(way.dst).written - way.written0
            if moved < counters[at + REDIRECTED] + counters[at + CONSUMED]:
                return  # redirected bytes still queued for dst go first (looked at again soon)
            if way.buffer is None:
                way.buffer = bytearray(CARRY_CHUNK)
            try:
                got = way.src.recv_into(way.buffer, CARRY_CHUNK, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return  # counted, not queued yet (EPOLLIN, or the next look)
            if not got:
                return  # the source's FIN: _carry_fins
            way.pending = memoryview(way.buffer)[:got]

    def _watch(self, tunnel: _Tunnel) -> None:
        """Wake on data and room too while a way of the tunnel is carried, on FIN alone when not."""
        mask = _CARRY if tunnel.up.carrying or tunnel.down.carrying else _WATCH
        for sock in tunnel.socks:
            self._epoll.modify(sock.fileno(), mask)

    def _carry_fins(self, tunnel: _Tunnel) -> None:
        """Shut the write side of each way whose source has ended and whose bytes are out."""
        for way in (tunnel.up, tunnel.down):
            if way.eof and way.carrying:
                self._carry(tunnel, way)
            if way.eof and not way.closed and way.drained():
                way.closed = True
                with contextlib.suppress(OSError):  # the other side may be gone already
                    way.dst.shutdown(socket.SHUT_WR)
        if tunnel.up.closed and tunnel.down.closed:
            self._end(tunnel, "eof")
        elif any(w.eof and not w.closed for w in (tunnel.up, tunnel.down)):
            moved = tunnel.up.moved + tunnel.down.moved
            _, wait, before = self._draining.get(tunnel, (0.0, DRAIN_POLL / 2, -1))
            wait = DRAIN_POLL if moved != before else min(wait * 2, DRAIN_POLL_MAX)
            self._draining[tunnel] = (time.monotonic() + wait, wait, moved)
        else:
            self._draining.pop(tunnel, None)

    def _check(self, tunnel: _Tunnel, now: float) -> None:
        """The tick's look at a tunnel: its deadlines, and counts no sound stream can have."""
        assert self.maps is not None
        for way in (tunnel.up, tunnel.down):
            self._judged(way)
        if now > tunnel.deadline:
            self._end(tunnel, "total")
        elif min(Counters.of(s).quiet_ms for s in tunnel.socks) > tunnel.idle * 1000:
            self._end(tunnel, "idle")

    def _judged(self, way: _Way) -> None:
        """Every byte that arrived is judged within a tick; one judged twice, or bytes left
        unjudged tick after tick, is the kernel's fault and costs the tunnel (a reset)."""
        assert self.maps is not None
        waiting = way.unjudged(self.maps.counters)
        if waiting < 0:
            raise Overcounted(-waiting)
        at = 4 * way.slot
        judged = self.maps.counters[at + REDIRECTED] + self.maps.counters[at + PASSED]
        if waiting <= 1 or judged != way.stuck[0]:  # (1: a FIN not yet seen as one)
            way.stuck = (judged, 0)
            return
        ticks = way.stuck[1] + 1
        way.stuck = (judged, ticks)
        if ticks >= STUCK_TICKS:
            raise Stuck(waiting)
        self.kicks += 1  # run the program on what is queued (tcp_set_rcvlowat: tcp_data_ready)
        way.src.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)

    def _end(self, tunnel: _Tunnel, why: str, exc: OSError | None = None) -> None:
        c, s = tunnel.socks
        if self._tunnels.pop(c.fileno(), None) is None:
            return  # ended already
        self._tunnels.pop(s.fileno(), None)
        self._draining.pop(tunnel, None)
        assert self.maps is not None
        for key in tunnel.keys:  # the program finds no counters from now on
            with contextlib.suppress(OSError):
                bpf.map_delete(self.maps.slots, key)
        for way in (tunnel.up, tunnel.down):
            self._ways.pop(way.slot, None)
            self._carrying.discard(way)
            self._free.append(way.slot)
        for way in (tunnel.up, tunnel.down):
            if not way.closed:  # a closed way's count was taken before its FIN was queued
                with contextlib.suppress(OSError):
                    way.moved = Counters.of(way.dst).written - way.written0
        for sock in tunnel.socks:
            with contextlib.suppress(OSError):
                self._epoll.unregister(sock.fileno())
            with contextlib.suppress(OSError):
                if why == "error":  # carry the cut over as a reset, not as a clean end
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                else:
                    sock.shutdown(socket.SHUT_RDWR)
            sock.close()  # and out of both maps
        result = RelayResult(
            up=tunnel.up.moved,
            down=tunnel.down.moved,
            seconds=time.monotonic() - tunnel.start,
            ended=why,
            error=None if exc is None else (exc.strerror or str(exc)),
        )
        self._finished.append((tunnel, result))


def _send_some(sock: socket.socket, data: memoryview) -> int:
    """What the socket's TCP took of ``data`` without waiting (0 when its buffer is full)."""
    try:
        return sock.send(data, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
    except BlockingIOError:
        return 0


def _inq(sock: socket.socket) -> int:
    """Bytes queued on the socket, not yet read (FIONREAD/SIOCINQ)."""
    buf = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    return int(struct.unpack("<i", buf)[0])


def _socket_error(sock: socket.socket) -> OSError:
    err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) or 104  # ECONNRESET
    return OSError(err, os.strerror(err))


# Off unless the gateway's environment says SANDGATE_SOCKMAP=1. Until 2026-12-07 its queue had no
# bound (a guest that stops reading let a far end park a GiB in the gateway); the hold bounds it
# now, but (bench/sockmapsoak, bench/relayloop, 2026-12-07): on a fast bulk stream the kernel's
# own send to the peer stalls a jiffy whenever its buffer is full, the queue passes HOLD_AT and
# user space carries most of the stream (1.6-1.7 GB/s at 0.26-0.36 CPU s/GB on loopback, against
# the hub's 2.5-2.6 GB/s at 0.19-0.20); and one stall in about 70 loopback runs was seen, not
# explained, not reproduced since. The hub stays the default; the kernel relay wins round trips.
ON = os.environ.get("SANDGATE_SOCKMAP") == "1"
KERNEL = Kernel(on=ON)


def start(
    client: socket.socket,
    server: socket.socket,
    done: Done,
    *,
    idle: float = 300.0,
    total: float = 3600.0,
    cap: int | None = None,
) -> None:
    """Relay a raw tunnel in the kernel where it can, else on the splice hub; returns at once."""
    KERNEL.start(client, server, done, idle=idle, total=total, cap=cap)
