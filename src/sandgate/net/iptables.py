"""The TLS first-flight gate: a flow's packets wait in NFQUEUE until its ClientHello is judged.

Two halves of one contract (the mark bits of ``TlsGate``):

* in the kernel, iptables-nft rules that queue only what still needs a verdict
  (``restore_text``, ``install``, ``remove``);
* in the reader, ``FirstFlights``: which held packets to release, with which verdict, once the
  first flight is whole (``StreamPrefix`` reassembles it from segments in any order), and
  ``TlsGate.verdict_args`` to turn that into an ``NfqueueSocket.verdict`` call.

This kernel has no nft ``queue`` expression (CONFIG_NFT_QUEUE is off) but has the xtables NFQUEUE
target behind nft_compat, which only iptables-nft can write. ``restore_text(gate)`` is the pure
ruleset; ``install``/``remove`` feed it to ``iptables-nft-restore`` in the *calling thread's*
network namespace (a child process inherits the namespace of the thread that forks it, so call
them on an ``NsThread`` or from a process that entered the namespace). They refuse to run in the
initial network namespace (or pid 1's, when readable): the host's firewall is never touched.

The rules, for ``TlsGate(queue_num=N)`` (D = decided bit, X = denied bit of the marks)::

    *mangle                                   # base chain FORWARD, priority -150 (mangle)
    -A FORWARD -i g+ -p tcp --dport 443 -m connmark ! --mark D/D -j sg-tls
    -A sg-tls -m mark --mark D/D -j CONNMARK --save-mark --nfmask D|X --ctmask D|X
    -A sg-tls -m mark --mark D/D -j RETURN
    -A sg-tls -m u32 --u32 "<IPv4, ihl 5, total length == 20 + 4*doff>" -j RETURN   (doff 5..15)
    -A sg-tls -j NFQUEUE --queue-num N        # no --queue-bypass: no reader, no passage
    *filter                                   # base chain FORWARD, priority 0 (filter)
    -A FORWARD -p tcp --dport 443 -m connmark --mark X/X -j REJECT --reject-with tcp-reset
    -A FORWARD -p tcp --sport 443 -m connmark --mark X/X -j REJECT --reject-with tcp-reset
    -A FORWARD ! -p tcp -m connmark --mark X/X -j DROP

Why this shape:

* Only packets of flows without the decided ct bit reach the chain; after the verdict every
  later packet costs a few connmark tests in the kernel and never leaves it.
* Per forwarded packet, the least work (issue 13, openpath): only the two base chains that
  hold rules are declared (iptables-nft hooks every chain a restore declares, empty or not),
  and the xt connmark tests come after native ones (interface, protocol, port), so a packet
  of another port never reaches them. X is only ever set on TCP flows to ``dport`` entering a
  guest link, so its packets carry that port at one end: the three filter rules give the
  verdicts one ``-p tcp`` and one catch-all rule gave.
* Segments without payload (the SYN, the handshake's ACK, window updates) skip the queue: the
  u32 tests prove "no payload" exactly (total length equals the headers), one rule per TCP
  header length. A length threshold would not do: tiny data segments would slip past it, and a
  client could send a whole ClientHello that way. Anything the tests cannot prove empty (IP
  options, payload) is queued.
* The verdict cannot set the ct mark on this kernel (no NETLINK_GLUE_CT), so the reader answers
  ``repeat`` with packet mark D (allow) or D|X (deny): the kernel re-runs mangle FORWARD, whose
  CONNMARK rule copies those bits into the ct mark (masked: other ct mark bits, such as the
  gateway's 0x80000000 "logged" bit, are kept) and lets the packet go on.
* Ordering against the gateway's nft ``inet`` forward chain (filter, priority 0): the queue runs
  at -150, strictly before it, so the gateway sees only released packets and its verdict still
  applies to them (an accept in one base chain does not skip later ones). The REJECT must live in
  iptables' filter table (xt REJECT refuses mangle), which has the same priority 0 as the
  gateway's chain; their relative order is registration order, and either order works: an
  ``accept`` there is not final, so the REJECT still runs; a ``drop`` there drops the packet
  anyway (only the reset is lost).
* IPv4 only: the gateway drops all forwarded IPv6.

``install`` owns the ``ip mangle`` and ``ip filter`` tables of the namespace: a restore replaces
their contents atomically (both tables in one transaction); ``remove`` restores them empty, which
iptables-nft turns into deleting both tables (their hooks go away too).
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from enum import Enum
from typing import Any

from sandgate.errors import NetError, SetupError
from sandgate.net.nfqueue import QueuedPacket
from sandgate.net.nft import CommitMonitor

__all__ = [
    "DECIDED",
    "DENIED",
    "Action",
    "TlsGate",
    "hold_text",
    "install",
    "install_hold",
    "removal_text",
    "remove",
    "restore_text",
]

DECIDED = 0x40000000  # ct mark / packet mark: this flow has its verdict, skip the queue
DENIED = 0x20000000  # ct mark / packet mark: the verdict was deny, reset the flow

RESTORE = "iptables-nft-restore"
PROC_NET_INIT_INO = 0xEFFFFFF9  # the inode of the initial network namespace, fixed by the kernel
_TCP_DOFF = range(5, 16)  # TCP header length in 32-bit words


class Action(Enum):
    """What to do with a held packet. ``PASS``: release without deciding the flow."""

    PASS = "pass"
    ALLOW = "allow"
    DENY = "deny"


@dataclass(frozen=True, slots=True)
class TlsGate:
    """What to hold: TCP to ``dport`` entering on ``iface`` (an iptables name, ``+`` = prefix)."""

    queue_num: int
    iface: str = "g+"
    dport: int = 443
    ifaces: tuple[str, ...] = ()  # handed guest links by name (a gateway VM); then not iface
    decided: int = DECIDED
    denied: int = DENIED
    chain: str = "sg-tls"

    def __post_init__(self) -> None:
        if not 0 <= self.queue_num <= 0xFFFF:
            raise ValueError(f"queue number {self.queue_num} out of range 0..65535")
        if not self.decided or self.decided & self.denied or self.decided & (self.decided - 1):
            raise ValueError("decided must be one bit, distinct from denied")
        if not self.denied or self.denied & (self.denied - 1):
            raise ValueError("denied must be one bit")
        for text in (self.iface, self.chain, *self.ifaces):
            if not text or not all(c.isalnum() or c in "+-_." for c in text):
                raise ValueError(f"{text!r} is not a plain interface or chain name")

    def allow_mark(self, mark: int) -> int:
        """The packet mark an allow verdict sets (``mark``'s other bits kept)."""
        return (mark & ~self.denied) | self.decided

    def deny_mark(self, mark: int) -> int:
        """The packet mark a deny verdict sets."""
        return mark | self.decided | self.denied

    def verdict_args(self, packet: QueuedPacket, action: Action) -> dict[str, Any]:
        """Keyword arguments of ``NfqueueSocket.verdict`` for ``action`` on ``packet``.

        ALLOW and DENY are ``repeat`` verdicts with the mark bits, so the chain re-runs and its
        CONNMARK rule records them in the ct mark; DENY then meets the filter table's REJECT.
        PASS releases the packet without deciding the flow.
        """
        if action is Action.PASS:
            return {"accept": True}
        mark = (
            self.allow_mark(packet.mark) if action is Action.ALLOW else self.deny_mark(packet.mark)
        )
        return {"accept": True, "mark": mark, "repeat": True}


def _pure_segment_tests() -> list[str]:
    # u32: bytes 0-3 = version/ihl, tos, total length; with ihl 5 the TCP header starts at 20,
    # so its data-offset nibble is the top of the word at 32. Equal lengths mean no payload.
    return [f"0>>24=0x45&&0&0xFFFF={20 + 4 * d}&&32>>28={d}" for d in _TCP_DOFF]


def restore_text(gate: TlsGate) -> str:
    """The ``iptables-nft-restore`` input for ``gate`` (module docstring explains each rule)."""
    d, x, c = gate.decided, gate.denied, gate.chain
    both = d | x
    # Only the base chains that hold rules: iptables-nft makes one for every chain declared,
    # and each is a hook every packet through it walks, empty or not (issue 13, openpath).
    lines = [
        "*mangle",
        ":FORWARD ACCEPT [0:0]",
        f":{c} - [0:0]",
        *(
            f"-A FORWARD -i {iface} -p tcp --dport {gate.dport}"
            f" -m connmark ! --mark {d:#x}/{d:#x} -j {c}"
            for iface in (gate.ifaces or (gate.iface,))
        ),
        f"-A {c} -m mark --mark {d:#x}/{d:#x}"
        f" -j CONNMARK --save-mark --nfmask {both:#x} --ctmask {both:#x}",
        f"-A {c} -m mark --mark {d:#x}/{d:#x} -j RETURN",
        *(f'-A {c} -m u32 --u32 "{test}" -j RETURN' for test in _pure_segment_tests()),
        f"-A {c} -j NFQUEUE --queue-num {gate.queue_num}",
        "COMMIT",
        "*filter",
        ":FORWARD ACCEPT [0:0]",
        # Only a gated flow (TCP to dport) can carry X, so each of its TCP packets has that
        # port as its dport (from the guest) or sport (replies): the same verdicts as one
        # "-p tcp" rule, but the port tests run natively and the connmark test (an xt match,
        # nft_compat) only after them, not on every forwarded packet (issue 13, openpath).
        *(
            f"-A FORWARD -p tcp --{end} {gate.dport} -m connmark --mark {x:#x}/{x:#x}"
            " -j REJECT --reject-with tcp-reset"
            for end in ("dport", "sport")
        ),
        f"-A FORWARD ! -p tcp -m connmark --mark {x:#x}/{x:#x} -j DROP",  # its ICMP errors
        "COMMIT",
    ]
    return "\n".join(lines) + "\n"


def removal_text() -> str:
    """Both tables with nothing in them: iptables-nft deletes the tables."""
    return "*mangle\nCOMMIT\n*filter\nCOMMIT\n"


def _check_not_host(allow_host: bool = False) -> None:
    if allow_host:  # a gateway VM: the whole machine is the gateway (sandgate gateway)
        return
    here = os.stat("/proc/thread-self/ns/net")
    hosts = {PROC_NET_INIT_INO}
    with contextlib.suppress(OSError):  # unreadable when pid 1 is not dumpable
        hosts.add(os.stat("/proc/1/ns/net").st_ino)
    if here.st_ino in hosts:
        raise NetError(
            "refusing to run iptables in the host's network namespace",
            "call it on an NsThread inside the gateway namespace",
        )


def _restore(text: str, allow_host: bool = False) -> None:
    _check_not_host(allow_host)
    if shutil.which(RESTORE) is None:
        raise SetupError(f"{RESTORE} not found", "apt-get install iptables")
    # The child inherits this thread's network namespace (fork copies the caller's namespaces).
    done = subprocess.run(
        [RESTORE], input=text, capture_output=True, text=True, check=False, timeout=30
    )
    if done.returncode != 0:
        raise NetError(f"{RESTORE} failed: {done.stderr.strip()}")


def hold_text(queue_num: int) -> str:
    """The guest side's process hold (gateway/logs/prochold.py): the first packet of every new
    outbound flow waits in ``queue_num`` until the gateway has found the process that sent it.
    ``--queue-bypass``: with no reader the packet goes on (the gateway's rules still judge it);
    the hold is for attribution, never for enforcement."""
    queue = f"-j NFQUEUE --queue-num {queue_num} --queue-bypass"
    # TCP by its SYN (a flag test, cheaper than a conntrack lookup on every segment of a bulk
    # transfer; a retransmitted SYN is held again, harmlessly); UDP by conntrack.
    return (
        "*mangle\n"
        ":OUTPUT ACCEPT [0:0]\n"
        "-A OUTPUT -o lo -j RETURN\n"
        f"-A OUTPUT -p tcp --syn {queue}\n"
        f"-A OUTPUT -p udp -m conntrack --ctstate NEW {queue}\n"
        "COMMIT\n"
    )


def install_hold(queue_num: int) -> None:
    """Replace this namespace's ``ip mangle`` table with the process hold (call it inside the
    guest's namespace: on an NsThread). Returns once the kernel has committed it, not when
    the restore has exited (``_restore_committed``)."""
    _restore_committed(hold_text(queue_num))


def _restore_committed(text: str) -> None:
    """``_restore``, returning as soon as the kernel has committed the child's transaction: its
    commit notification names the child's pid. The child's exit comes 4-25 ms later (closing
    its netlink socket waits out an RCU grace period; 2026-12-01, a guest's hold), and is
    reaped on a thread of its own. Where the notification cannot be matched (lost, or a pid
    namespace that names the child otherwise) the exit is waited for, as ``_restore`` does."""
    _check_not_host()
    if shutil.which(RESTORE) is None:
        raise SetupError(f"{RESTORE} not found", "apt-get install iptables")
    monitor = CommitMonitor()  # in this thread's namespace, before the child commits
    child: subprocess.Popen[bytes] | None = None
    try:
        child = subprocess.Popen(
            [RESTORE], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        assert child.stdin is not None and child.stderr is not None
        with contextlib.suppress(BrokenPipeError):
            child.stdin.write(text.encode())
            child.stdin.close()
        deadline = time.monotonic() + 30
        while not any(c.pid == child.pid for c in monitor.read()):
            if child.poll() is not None:
                err = child.stderr.read().decode(errors="replace").strip()
                if child.returncode != 0:
                    raise NetError(f"{RESTORE} failed: {err}")
                return
            if time.monotonic() > deadline:
                child.kill()
                child.wait()
                raise NetError(f"{RESTORE} did not finish in 30 s")
            waiter = select.poll()  # not select: descriptors past 1024 (many guests)
            waiter.register(monitor.fileno(), select.POLLIN)
            waiter.poll(50)
    finally:
        # Closing the monitor (a socket in a multicast group) waits out a grace period too
        # (9-16 ms): on the reaping thread, with the child's exit.
        threading.Thread(
            target=_reap, args=(child, monitor), name="restore-reap", daemon=True
        ).start()


def _reap(child: subprocess.Popen[bytes] | None, monitor: CommitMonitor) -> None:
    monitor.close()
    if child is not None and child.stderr is not None:
        child.stderr.read()
        child.stderr.close()
        child.wait()


def install(gate: TlsGate, allow_host: bool = False) -> None:
    """Replace the namespace's ``ip mangle``/``ip filter`` rules with ``gate``'s, atomically.
    ``allow_host``: only for a gateway VM, whose own namespace is the gateway's."""
    _restore(restore_text(gate), allow_host)


def remove() -> None:
    """Delete the namespace's ``ip mangle``/``ip filter`` tables: nothing is queued any more."""
    _restore(removal_text())
