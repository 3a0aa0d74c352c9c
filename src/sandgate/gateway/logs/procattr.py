"""Which process made a flow: from the guest's record of a new flow (its 5-tuple) to a pid.

The guest's namespace logs each new outbound flow with its uid (net/compile.py
``guest_uid_log``: NFLOG, ~0.3 ms after the packet). The sender is then usually still in
``connect()`` or waiting for an answer, so ``ProcessFinder.find``

1. asks the guest namespace's ``sock_diag`` for the socket with exactly that 5-tuple: one
   netlink round trip, ~25 µs. (``/proc/PID/net/tcp`` costs 1.7-3.5 ms per read here: the
   kernel walks the host-wide TCP hash, 262,144 buckets, whatever the namespace holds. It is
   the fallback, ``parse_proc_net``, for callers that do not know the source address.)
2. finds which process of the sandbox holds ``socket:[inode]`` in ``/proc/PID/fd``: first the
   last four holders (a stub resolver's next socket is in the process that held its last), each
   one's descriptors that were sockets or new at the last look read first, stopping at the
   socket; then the pids handed out since the last look, newest first, stopping at the holder
   (the older stay pending for the next look); then every member, newest first. It remembers
   every socket it passes (inode -> pid, fd: a socket sending again is found without a scan).
   A holder found without the pid list must still be in the namespace (a reused pid);
3. walks the parent chain up to the sandbox's root and names the ``Role``.

The sandbox's processes are those whose ``/proc/PID/ns/net`` is the guest's namespace. Pids
are handed out in order, so only those handed out since the last look (``ns_last_pid``) are
checked, or all of /proc when many were; a pid is known by its name and the inode of its
/proc entry, which a reused pid does not share. The programs the launcher runs on the way in
(nsenter, setpriv, bwrap) are ``launcher``; the first process below them is the ``framework``
(also when one of its threads connects: they share its descriptors); all it starts are tools.

Races: a process that has closed its socket or exited when the lookup runs is not found. In
tests/kernel/test_procattr.py (a fast local world, a loaded machine) this path attributes
12-100% of TCP attempts depending on the case and the load, 30-80% of UDP ones: the misses are
senders done within a millisecond or two (a refused ``curl``, ``dig``, a one-shot ``sendto``).
Holding each new flow's first packet in the guest (NFQUEUE) until the lookup is done
attributes every TCP attempt and every UDP sender that waits for its answer; fire-and-forget
UDP stays best effort (about half).

``ProcessFinder`` does blocking I/O: use it from one worker thread (it is not thread-safe).
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import socket
import struct
import time
from dataclasses import dataclass

from sandgate.gateway.logs.procparse import (
    _MAX_SOCKETS,
    LAUNCHERS,
    MAX_DEPTH,
    ProcInfo,
    ProcStat,
    Role,
    SockEntry,
    classify_chain,
    parse_cmdline,
    parse_hex_address,
    parse_proc_net,
    parse_socket_link,
    parse_stat,
    parse_status_ppid,
)
from sandgate.net import sockdiag
from sandgate.net.netlink import (
    NetlinkParseError,
    run_in_netns,
)
from sandgate.net.sockdiag import _NLMSGHDR, PROTOCOLS, pack_diag_request, parse_diag_reply

__all__ = [
    "LAUNCHERS",
    "FinderStats",
    "ProcInfo",
    "ProcStat",
    "ProcessFinder",
    "Role",
    "SockEntry",
    "classify_chain",
    "parse_cmdline",
    "parse_hex_address",
    "parse_proc_net",
    "parse_socket_link",
    "parse_stat",
    "parse_status_ppid",
]


@dataclass
class FinderStats:
    """Counters since the finder was made; ``seconds`` is the time spent in ``find``."""

    lookups: int = 0
    found: int = 0
    no_socket: int = 0  # the socket was gone (its process exited or closed it)
    no_holder: int = 0  # the socket existed, but no process of the sandbox held it any more
    cache_hits: int = 0
    recent_hits: int = 0  # found in the process that held the last flow's socket
    processes_checked: int = 0  # ns/net inodes read
    fds_read: int = 0
    seconds: float = 0.0

    @property
    def share(self) -> float:
        return self.found / self.lookups if self.lookups else 0.0


_RECENT = 4  # holders tried before the namespace's pid list
_ONE_SECOND = struct.pack("@ll", 1, 0)  # struct timeval


@dataclass(frozen=True, slots=True)
class _Hold:
    pid: int
    fd: str


class ProcessFinder:
    """Find the process of the sandbox whose socket sent a flow, in one guest namespace.

    ``netns_inode``: ``os.stat(netns_path).st_ino`` of the guest's namespace. ``root_pid``: the
    sandbox's top pid as the launcher knows it (the process it started; may be set later), or
    None: then a chain ends at its highest process still in the namespace (with the launcher's
    nsenter -> setpriv -> bwrap, which exec one another, that is the same pid). ``netns_path``
    lets the finder ask ``sock_diag`` there without relying on a live process; without it, a
    process of the namespace lends its ``/proc/PID/ns/net``.
    """

    def __init__(
        self,
        netns_inode: int,
        root_pid: int | None = None,
        *,
        netns_path: str | None = None,
        proc: str = "/proc",
    ) -> None:
        self.netns_inode = netns_inode
        self.root_pid = root_pid
        self.stats = FinderStats()
        self._proc = proc
        self._netns_path = netns_path
        self._diag: socket.socket | None = None
        self._diag_failed = False
        self._seq = 0
        self._known: dict[tuple[str, int], bool] = {}  # (pid, /proc/PID inode) -> member?
        self._members: set[int] = set()
        self._deep_at = 0.0
        self._last: int | None = None  # ns_last_pid at the last look
        self._pending: list[int] = []  # pids handed out before it, not probed yet
        self._sockets: dict[int, _Hold] = {}  # socket inode -> holder
        self._exes: dict[tuple[int, int, str], str | None] = {}  # (pid, start, comm) -> exe
        self._recent: list[int] = []  # the last holders found, most recent first
        self._fds: dict[int, dict[str, int | None]] = {}  # pid -> fd -> socket inode (or None)

    def close(self) -> None:
        if self._diag is not None:
            self._diag.close()
            self._diag = None

    def __enter__(self) -> ProcessFinder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- public --------------------------------------------------------------------------------

    def find(
        self, proto: str, sport: int, dst: str, dport: int, src: str | None = None
    ) -> ProcInfo | None:
        """The process whose ``proto`` socket sent ``src:sport -> dst:dport``, or None. Pass
        ``src`` (the record's source address): without it the /proc/net tables are read."""
        began = time.perf_counter()
        self.stats.lookups += 1
        try:
            found = self.socket_inode(proto, sport, dst, dport, src)
            if found is None:
                self.stats.no_socket += 1
                return None
            inode, uid = found
            pid = self._holder(inode)
            if pid is None:
                self.stats.no_holder += 1
                return None
            info = self._describe(pid, inode, uid)
            self.stats.found += 1
            return info
        finally:
            self.stats.seconds += time.perf_counter() - began

    def socket_inode(
        self, proto: str, sport: int, dst: str, dport: int, src: str | None = None
    ) -> tuple[int, int] | None:
        """``(inode, uid)`` of the socket that sent the flow, if it still exists."""
        if proto not in PROTOCOLS:
            return None
        if src is not None:
            answer = self._ask_diag(pack_diag_request(proto, src, sport, dst, dport, self._next()))
            if isinstance(answer, tuple):
                # inode 0: an orphan (closed by its process, still ending its connection)
                return (answer[0], answer[1]) if answer[0] else None
            if answer == -errno.ENOENT:
                return None
        return self._from_tables(proto, sport, dst, dport)

    def prime(self) -> None:
        """Do the first lookup's set-up now (the diag socket, the namespace's processes), so
        the first flow is not looked up late. Call it on the worker thread."""
        self._diag_socket()
        self._refresh(deep=False)

    def processes(self) -> list[int]:
        """The pids in the guest's namespace now, newest (highest) first."""
        self._refresh(deep=False)
        self._members = {pid for pid in self._members if os.path.exists(f"{self._proc}/{pid}")}
        return sorted(self._members, reverse=True)

    # -- sockets -------------------------------------------------------------------------------

    def _next(self) -> int:
        self._seq = self._seq % 0x7FFFFFFF + 1
        return self._seq

    def _ask_diag(self, request: bytes) -> tuple[int, int, int] | int | None:
        """The diag answer, or None when there is no diag socket to ask."""
        sock = self._diag_socket()
        if sock is None:
            return None
        seq = _NLMSGHDR.unpack_from(request)[3]
        try:
            sock.send(request)
            while True:
                answer = parse_diag_reply(sock.recv(1 << 16), seq)
                if answer is not None:
                    return answer
        except NetlinkParseError:
            return None
        except OSError:
            self.close()
            return None

    def _diag_socket(self) -> socket.socket | None:
        if self._diag is not None or self._diag_failed:
            return self._diag
        candidates = [self._netns_path] if self._netns_path else []
        pids = [self.root_pid] if self.root_pid else []
        candidates += [f"{self._proc}/{pid}/ns/net" for pid in [*pids, *self.processes()]]
        for path in candidates:
            with contextlib.suppress(OSError):
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    if os.fstat(fd).st_ino != self.netns_inode:
                        continue  # the pid has moved or been reused since
                    sock = run_in_netns(f"/proc/self/fd/{fd}", sockdiag.open_socket)
                    # The same 1 s bound from the kernel: a socket with a Python timeout
                    # polls before each send and recv, two system calls a flow more.
                    sock.settimeout(None)
                    for opt in (socket.SO_RCVTIMEO, socket.SO_SNDTIMEO):
                        sock.setsockopt(socket.SOL_SOCKET, opt, _ONE_SECOND)
                    self._diag = sock
                    return self._diag
                finally:
                    os.close(fd)
        self._diag_failed = self._netns_path is not None  # else retry once a process appears
        return None

    def _from_tables(self, proto: str, sport: int, dst: str, dport: int) -> tuple[int, int] | None:
        """The slow way: the namespace's /proc/net tables, read through one of its processes."""
        ip = ipaddress.ip_address(dst)
        want = str(getattr(ip, "ipv4_mapped", None) or ip)
        entries: list[SockEntry] | None = None
        for pid in self.processes():
            with contextlib.suppress(OSError):
                entries = [
                    e
                    for table in (proto, proto + "6")
                    for e in parse_proc_net(
                        _read(f"{self._proc}/{pid}/net/{table}").decode(), table
                    )
                ]
                break
        for e in entries or []:
            if e.lport != sport or e.inode == 0:
                continue
            if (e.remote, e.rport) == (want, dport) or (proto == "udp" and e.rport == 0):
                return e.inode, e.uid
        return None

    # -- processes -----------------------------------------------------------------------------

    def _refresh(self, deep: bool) -> None:
        """Bring the namespace's processes up to date. Pids are handed out in order, so when
        few were since the last look (``ns_last_pid``), only those are checked; else /proc is
        listed again and each pid not seen before is checked (each pid, if ``deep``). A pid is
        known by its name and the inode of its /proc entry, which a reused pid does not share.
        """
        last, before = self._last_pid(), self._last
        self._last = last
        pending, self._pending = self._pending, []
        if not deep and last is not None and before is not None and 0 <= last - before <= 32:
            for pid in [*pending, *range(before + 1, last + 1)]:
                self._probe(pid)
            return
        old = {} if deep else self._known
        root = str(self.root_pid)
        known: dict[tuple[str, int], bool] = {}
        with os.scandir(self._proc) as it:
            for entry in it:
                name = entry.name
                if not name.isdigit():
                    continue
                key = (name, entry.inode())
                member = old.get(key)
                if member is None or name == root:
                    member = self._in_netns(name)
                    if member is None:
                        continue
                known[key] = member
        self._known = known
        self._members = {int(name) for (name, _), member in known.items() if member}

    def _last_pid(self) -> int | None:
        try:
            return int(_read_record(f"{self._proc}/sys/kernel/ns_last_pid"))
        except (OSError, ValueError):
            return None

    def _probe(self, pid: int) -> bool:
        """A pid handed out since the last look: a member if it is a process (not a thread)
        of the namespace. Whether it is one."""
        if not self._in_netns(str(pid)):
            return False
        try:
            status = _read_record(f"{self._proc}/{pid}/status").decode(errors="replace")
            tgid = next(int(ln.split()[1]) for ln in status.splitlines() if ln[:5] == "Tgid:")
            ino = os.stat(f"{self._proc}/{pid}").st_ino
        except (OSError, ValueError, StopIteration, IndexError):
            return False
        if tgid == pid:
            self._known[(str(pid), ino)] = True
            self._members.add(pid)
        return tgid == pid

    def _newest(self, inode: int, scanned: set[int]) -> int | None:
        """The holder among the pids handed out since the last look, newest first (a socket
        of a new flow is mostly a new process's), stopping at it: the older ones stay pending
        for the next ``_refresh``. None: not among them, or too many for probing."""
        if len(self._pending) > 32:
            return None  # _refresh probes them (as many as it would have had to anyway)
        last, before = self._last_pid(), self._last
        if last is None or before is None or not 0 <= last - before <= 32:
            return None  # _refresh lists /proc
        self._last = last
        new = range(last, before, -1)
        for i, pid in enumerate(new):
            if self._probe(pid):
                scanned.add(pid)
                if self._scan_one(pid, inode):
                    self._pending.extend(new[i + 1 :])
                    return pid
        return None

    def _in_netns(self, pid: str) -> bool | None:
        """Whether ``pid`` is in the guest's namespace; None when it is gone."""
        self.stats.processes_checked += 1
        try:
            return os.stat(f"{self._proc}/{pid}/ns/net").st_ino == self.netns_inode
        except PermissionError:
            return False  # not ours to read (another namespace's init, a protected process)
        except OSError:
            return None

    def _holder(self, inode: int) -> int | None:
        # Found without the pid list, a holder is checked as the list's members are: in the
        # guest's namespace (a pid reused by a process of the host is not one).
        hold = self._sockets.get(inode)
        if (
            hold is not None
            and self._link(hold.pid, hold.fd) == inode
            and self._in_netns(str(hold.pid))
        ):
            self.stats.cache_hits += 1
            return self._held_by(hold.pid)
        # A client with a socket per question (a stub resolver) or per request opens the next
        # one in the process that held the last: look there first, before the pid list.
        scanned: set[int] = set()
        for pid in list(self._recent):
            scanned.add(pid)
            if self._scan_one(pid, inode) and self._in_netns(str(pid)):
                self.stats.recent_hits += 1
                return self._held_by(pid)
        found = self._newest(inode, scanned)
        if found is not None:
            return self._held_by(found)
        self._refresh(deep=False)  # what _newest left pending, or /proc listed
        found = self._scan(sorted(self._members - scanned, reverse=True), inode, scanned)
        now = time.monotonic()
        if found is None and now >= self._deep_at:
            # A pid reused behind our back, a process that entered the namespace after we saw
            # it: check every pid again, at most once a second (misses are mostly the dead).
            self._deep_at = now + 1.0
            self._refresh(deep=True)
            rest = [pid for pid in sorted(self._members, reverse=True) if pid not in scanned]
            found = self._scan(rest, inode, scanned)
        return None if found is None else self._held_by(found)

    def _held_by(self, pid: int) -> int:
        if pid in self._recent:
            self._recent.remove(pid)
        self._recent.insert(0, pid)
        del self._recent[_RECENT:]
        return pid

    def _scan(self, pids: list[int], inode: int, scanned: set[int]) -> int | None:
        for pid in pids:
            scanned.add(pid)
            if self._scan_one(pid, inode):
                return pid
        return None

    def _scan_one(self, pid: int, inode: int) -> bool:
        """Whether ``pid`` holds socket ``inode``; remembers the sockets it passes. The
        descriptors that were sockets or new at the last look are read first (a new socket
        mostly takes the number a closed one freed), and the reading stops at the socket."""
        if len(self._sockets) > _MAX_SOCKETS:
            self._sockets.clear()
        if len(self._fds) > _MAX_SOCKETS // 64:
            self._fds.clear()
        folder = f"{self._proc}/{pid}/fd"
        try:
            fds = os.listdir(folder)
        except FileNotFoundError:
            self._members.discard(pid)  # gone (the probes never list /proc)
            self._fds.pop(pid, None)
            if pid in self._recent:
                self._recent.remove(pid)
            return False
        except OSError:
            return False
        before = self._fds.get(pid, {})
        fds.sort(key=lambda fd: fd in before and before[fd] is None)
        now: dict[str, int | None] = {}
        hit = False
        for fd in fds:
            self.stats.fds_read += 1
            try:
                sock = parse_socket_link(os.readlink(f"{folder}/{fd}"))
            except OSError:
                continue
            now[fd] = sock
            if sock is not None:
                self._sockets[sock] = _Hold(pid, fd)
                if sock == inode:
                    hit = True
                    break
        if hit:  # the descriptors not read keep what they were
            listed = set(fds)
            now = {fd: sock for fd, sock in {**before, **now}.items() if fd in listed}
        self._fds[pid] = now
        return hit

    def _in_tree(self, pid: int) -> bool:
        return pid in self._members or bool(self._in_netns(str(pid)))

    def _link(self, pid: int, fd: str) -> int | None:
        with contextlib.suppress(OSError):
            return parse_socket_link(os.readlink(f"{self._proc}/{pid}/fd/{fd}"))
        return None

    def _stat(self, pid: int) -> ProcStat | None:
        with contextlib.suppress(OSError, ValueError):
            return parse_stat(_read_record(f"{self._proc}/{pid}/stat").decode(errors="replace"))
        return None

    def _exe(self, pid: int) -> str | None:
        with contextlib.suppress(OSError):
            return os.readlink(f"{self._proc}/{pid}/exe")
        return None

    def _describe(self, pid: int, inode: int, uid: int) -> ProcInfo:
        exe = self._exe(pid)
        cmdline: list[str] = []
        with contextlib.suppress(OSError):
            cmdline = parse_cmdline(_read_record(f"{self._proc}/{pid}/cmdline"))
        chain: list[tuple[int, str]] = []
        exes: list[str] = []
        reached = False
        cur = pid
        while cur > 0 and len(chain) < MAX_DEPTH:
            st = self._stat(cur)
            if st is None:
                break
            if self.root_pid is None and cur != pid and not self._in_tree(cur):
                break  # left the namespace: the previous one was the top
            chain.append((st.pid, st.comm))
            exes.append(self._chain_exe(st, exe if cur == pid else None))
            if cur == self.root_pid:
                reached = True
                break
            cur = st.ppid
        if self.root_pid is None:
            reached = bool(chain)
        elif not reached:
            if self._pending:
                self._refresh(deep=False)  # the members are needed whole here
            kept = [i for i, c in enumerate(chain) if c[0] in self._members]
            chain, exes = [chain[i] for i in kept], [exes[i] for i in kept]
        names: list[str | None] = [os.path.basename(e) for e in exes]
        role = classify_chain(names, reached)
        return ProcInfo(pid, exe, cmdline, chain, role, inode, uid, tuple(exes[1:]))

    def _chain_exe(self, st: ProcStat, known: str | None) -> str:
        if known is not None:
            return known
        key = (st.pid, st.start, st.comm)  # exec keeps pid and start; it changes comm
        if key not in self._exes:
            if len(self._exes) > 4096:
                self._exes.clear()
            self._exes[key] = self._exe(st.pid)
        exe = self._exes[key]
        return exe if exe is not None else st.comm


def _read_record(path: str) -> bytes:
    """A /proc file the kernel writes whole on the first read (stat, status, cmdline, a
    sysctl): one read, not two; a read that fills the buffer goes on as ``_read``."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        first = os.read(fd, 16384)
        if len(first) < 16384:
            return first
        parts = [first]
        while chunk := os.read(fd, 65536):
            parts.append(chunk)
        return b"".join(parts)
    finally:
        os.close(fd)


def _read(path: str) -> bytes:
    """A whole /proc file: os-level reads, a third of the cost of ``open()``'s."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        parts = []
        while chunk := os.read(fd, 65536):
            parts.append(chunk)
        return b"".join(parts)
    finally:
        os.close(fd)
