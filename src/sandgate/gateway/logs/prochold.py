"""Which process made each flow: the first packet waits in the guest until we know.

The guest's uid log tells *who* (the uid); report 000 also wanted to tell the agent framework's
own traffic from the commands it ran for the model, which needs the *process*. A flow's socket
can be traced to its process through /proc (procattr.py), but only while the process lives: a
``curl`` that is refused exits within a millisecond, before any log record could be read. So
each guest namespace holds the first packet of every new outbound flow in an NFQUEUE
(``iptables.hold_text``) until a worker thread here has found the socket's process, then lets
it go. That costs about 0.3 ms per new flow and attributes every TCP flow whose socket still
exists when its first packet is sent (always, for a connect).

A flow is looked up once. While its first packet is held, the kernel has not yet confirmed the
flow's conntrack entry, so every further packet of it is ``NEW`` too and queued behind the
first: a DNS client asking 200 questions at once from one socket (dnsperf, a resolver library)
queued up to 2,000 packets here, each a /proc walk of ~0.3 ms, one after another (issue 13:
seconds of delay at the start of a burst, and the hold's thread taking the GIL from the
resolver). A packet whose 5-tuple was found within ``RECENT`` is now let go at once without a
lookup or a report: the first report already told the gateway who sent that flow, and the
gateway joins every record of a flow with its sender by that same 5-tuple for 30 s
(logs/attribution.py), so this attributes nothing the join would not. Once confirmed, the flow
is not ``NEW`` again until its conntrack entry expires (30 s at least), longer than ``RECENT``;
a new socket that reuses a 5-tuple inside that window meets the old entry and is not queued at
all, with or without this.

The hold never decides anything: every packet is accepted, a dead reader is bypassed by the
kernel (``--queue-bypass``, ``fail_open``), and the gateway's rules judge the flow as before.
One thread per guest owns its queue socket and its ``ProcessFinder`` (neither is thread-safe);
results go back to the gateway's event loop through ``report``.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from sandgate.events.schema import FlowKey
from sandgate.gateway.logs.logreader import proto_name
from sandgate.gateway.logs.procattr import ProcessFinder
from sandgate.net import iptables, ns
from sandgate.net.nfqueue import NfqueueSocket, QueuedPacket

HOLD_QUEUE = 0  # queue numbers are per namespace: every guest can use the same one
COPY = 128  # headers are enough: addresses and ports
RECENT = 1.0  # seconds a found flow's further queued packets go on without a lookup
_RECENT_MAX = 4096  # flows remembered at most

Report = Callable[[FlowKey, "int | None", "dict[str, Any] | None"], None]


Identity = tuple["str | None", tuple[str, ...]]  # the executable (None: unknown), its parents


class ProcessTable:
    """Flow → the executable its hold found and its parents, for the proxy's process rules
    (issue 14).

    The hold reports a flow before it lets its first packet go, so by the time the proxy
    accepts the connection its entry is here; ``exe`` still waits a little for it (a report
    goes through a thread) and says None for a flow no hold identified. Bounded and
    thread-safe: the hold threads write, the proxy's threads read."""

    def __init__(self, size: int = 16384) -> None:
        self._size = size
        self._exes: OrderedDict[FlowKey, Identity] = OrderedDict()
        self._cond = threading.Condition()

    def put(self, key: FlowKey, process: dict[str, Any] | None) -> None:
        exe = process.get("exe") if process is not None else None
        parents = process.get("parents") if process is not None else None
        known = exe if isinstance(exe, str) else None
        above = tuple(p for p in parents if isinstance(p, str)) if isinstance(parents, list) else ()
        with self._cond:
            self._exes[key] = (known, above if known is not None else ())
            self._exes.move_to_end(key)
            while len(self._exes) > self._size:
                self._exes.popitem(last=False)
            self._cond.notify_all()

    def forget(self, guest: str) -> None:
        """Drop a leaving guest's flows: its link name and address go to a later guest, whose
        flow with the same ports must not find this one's executable (its hold may be missing,
        or not have reported yet)."""
        with self._cond:
            for key in [k for k in self._exes if k[0] == guest]:
                del self._exes[key]

    def identity(self, key: FlowKey, wait: float = 0.5) -> Identity:
        with self._cond:
            self._cond.wait_for(lambda: key in self._exes, timeout=wait)
            return self._exes.get(key, (None, ()))

    def exe(self, key: FlowKey, wait: float = 0.5) -> str | None:
        return self.identity(key, wait)[0]


class ProcessHold:
    """The hold of one guest: its queue rule, its reader thread, its process finder."""

    def __init__(
        self,
        guest: str,
        netns: str,
        report: Report,
        root_pid: int | None = None,
        rules_in: bool = False,  # its queue rules are in already (a warm namespace, pool.py)
    ):
        self.guest = guest
        self.rules_in = rules_in
        self.netns = netns
        self.report = report
        self.root_pid = root_pid
        self._stop = threading.Event()
        self._wake_r, self._wake_w = os.pipe()  # stop() wakes the worker at once
        self._thread: threading.Thread | None = None
        self._done = threading.Event()  # the worker reports nothing more
        self._quiet = threading.Event()  # the guest's processes are dead (release_all)
        self._released = threading.Event()  # ... and every packet held then has gone on
        self._busy = False  # the worker has taken packets off its socket and not let them go
        self._queue: NfqueueSocket | None = None
        self._finder: ProcessFinder | None = None
        # Flows found lately -> when (monotonic): their further queued packets need no lookup.
        # Only the worker thread touches it.
        self._found: OrderedDict[FlowKey, float] = OrderedDict()
        self.skipped = 0  # packets let go as a flow already found (the worker's count)

    def start(self) -> None:
        path = ns.path(self.netns)
        self._queue = NfqueueSocket.in_netns(
            path, HOLD_QUEUE, copy_range=COPY, uid_gid=True, fail_open=True
        )
        try:
            if not self.rules_in:
                ns.run_in(self.netns, lambda: iptables.install_hold(HOLD_QUEUE))
            self._finder = ProcessFinder(os.stat(path).st_ino, self.root_pid, netns_path=path)
        except BaseException:
            self._queue.close()
            for fd in (self._wake_r, self._wake_w):
                os.close(fd)
            raise
        self._thread = threading.Thread(
            target=self._run, name=f"prochold-{self.guest}", daemon=True
        )
        self._thread.start()

    def release_all(self) -> None:
        """The guest's processes are dead: let every held packet go on at once, without
        looking for its process (there is none to find any more), so that the gateway meets
        and logs each flow now rather than one /proc walk (~0.3 ms) after another. Held packets
        would otherwise be dropped unseen when the queue closes. ``released`` says when."""
        self._quiet.set()
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"q")

    @property
    def released(self) -> bool:
        """Every packet held when ``release_all`` was called has gone on (or no worker runs).

        Also true at once when none is held: the worker is between batches and its socket
        has nothing to read (every held packet is sent to it when queued), so a quiet guest's
        barrier need not wait for the worker to be scheduled."""
        if self._released.is_set() or self._done.is_set():
            return True
        if not self._quiet.is_set() or self._busy or self._queue is None:
            return False
        try:  # poll, not select: a gateway with many guests has descriptors past 1024
            poller = select.poll()
            poller.register(self._queue.fileno(), select.POLLIN)
            readable = poller.poll(0)
        except (OSError, ValueError):
            return self._done.is_set()
        return not readable and not self._busy

    def stop(self, wait: bool = True) -> None:
        """End the worker; ``wait``: until it reports nothing more. A caller whose guest's
        held packets have all gone on (``released``) has nothing more to wait for."""
        if self._stop.is_set():  # stopped before: its fds are closed (their numbers reused)
            if wait and self._thread is not None:
                self._done.wait(timeout=5)
            return
        self._stop.set()
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        with contextlib.suppress(OSError):
            os.close(self._wake_w)  # the read end is the worker's to close
        if self._thread is None:
            with contextlib.suppress(OSError):
                os.close(self._wake_r)
        elif wait:
            # Not join(): the worker closes its queue socket after its loop, and that close
            # waits out an RCU grace period (~10 ms) no caller needs to wait for (issue 13).
            self._done.wait(timeout=5)

    def _run(self) -> None:
        assert self._queue is not None and self._finder is not None
        queue, finder = self._queue, self._finder
        try:
            with contextlib.suppress(OSError):
                finder.prime()
            poller = select.poll()  # not select: descriptors past 1024 (many guests)
            poller.register(queue.fileno(), select.POLLIN)
            poller.register(self._wake_r, select.POLLIN)
            while not self._stop.is_set():
                ready = {fd for fd, _ in poller.poll()}
                if self._wake_r in ready:
                    if self._stop.is_set() or not self._quiet.is_set():
                        break
                    with contextlib.suppress(OSError):
                        os.read(self._wake_r, 64)
                    # Each held packet was sent to this socket when it was queued: read empty,
                    # none is held (a dead guest queues no more).
                    self._busy = True
                    try:
                        while batch := queue.read():
                            for pkt in batch:
                                self._one(queue, None, pkt)
                    finally:
                        self._busy = False
                    self._released.set()
                    continue
                self._busy = True  # before the read: its packets leave the socket
                try:
                    for pkt in queue.read():
                        self._one(queue, None if self._quiet.is_set() else finder, pkt)
                finally:
                    self._busy = False
        finally:
            self._done.set()
            with contextlib.suppress(OSError):
                os.close(self._wake_r)
            finder.close()
            queue.close()

    def _one(self, queue: NfqueueSocket, finder: ProcessFinder | None, pkt: QueuedPacket) -> None:
        try:
            proto = proto_name(pkt.proto)
            if proto in ("tcp", "udp") and pkt.sport and pkt.dst and pkt.dport:
                key: FlowKey = (self.guest, proto, pkt.sport, pkt.dst, pkt.dport)
                if finder is not None and self._seen(key):
                    self.skipped += 1
                    return  # reported when its first packet was found (module docstring)
                info = None
                with contextlib.suppress(OSError):
                    if finder is not None:
                        info = finder.find(proto, pkt.sport, pkt.dst, pkt.dport, pkt.src)
                # Reported before the packet goes on: the gateway's record of it comes after.
                self.report(key, pkt.uid, info.details() if info is not None else None)
                if info is not None:
                    self._remember(key)
        finally:
            with contextlib.suppress(OSError):
                queue.verdict(pkt.id, accept=True)

    def _seen(self, key: FlowKey) -> bool:
        """``key`` was found within ``RECENT``; forgets what is older."""
        now = time.monotonic()
        found = self._found
        while found:
            first = next(iter(found))
            if now - found[first] < RECENT:
                break
            del found[first]
        return key in found

    def _remember(self, key: FlowKey) -> None:
        self._found[key] = time.monotonic()
        self._found.move_to_end(key)
        if len(self._found) > _RECENT_MAX:
            self._found.popitem(last=False)
