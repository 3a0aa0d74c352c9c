"""One step from the runner into a sandbox: fork, become the sandbox's identity, exec bwrap.

Until issue 13 this was a chain of four programs, each an exec (and ``sh`` a fork too):

    sh -c 'echo 500 > oom_score_adj; echo $$ > cgroup.procs …'   (limits.prefix_argv)
      → nsenter --net=GUEST_NS → setpriv --reuid … --no-new-privs → bwrap …

50–60 ms at a load of 5–11 on this 2-core machine, ~30 ms without ``sh``. Now one program,
``sandgate-enter`` (enter.c, built with the host's C compiler on first use into
RUN_ROOT/bin, keyed by the source's hash), does the same steps in the same order and execs
bwrap:

    1. /proc/self/oom_score_adj ← the sandbox's OOM score          (was sh)
    2. "0" into each cgroup.procs: the writer joins                 (was sh, with $$)
    3. setns(the guest's netns, CLONE_NEWNET)                        (was nsenter --net)
    4. every capability out of the bounding set, the inheritable     (was setpriv --inh-caps=-all
       set cleared: needs CAP_SETPCAP, so before the uid switch        --bounding-set=-all)
    5. setgroups([]), setresgid(g, g, g), setresuid(u, u, u): the    (was setpriv --clear-groups
       switch away from uid 0 clears permitted, effective, ambient     --regid --reuid)
    6. PR_SET_NO_NEW_PRIVS                                           (was setpriv --no-new-privs)

Why a C program: the runner cannot do these steps in a vfork()ed child, and a full fork() of
a Python process costs 6 ms at 100 MB and 17–22 ms at 300 MB of memory (2026-12-01, this
machine), while vfork + exec of sandgate-enter is under 1 ms at any size. Where no compiler is
found, the runner's own child does the steps after a full fork (``preexec_fn``; the same
identity, slower). There the child may only do what cannot wait on a lock another thread held
at the fork: every file it writes is opened first (but /proc/self, which must be the child's),
every C function and argument is bound first, and it imports and logs nothing.

``ahead`` starts sandgate-enter before bwrap's command line is known (the runner does so before
it asks the gateway for the guest): its waits, mostly the cgroup join's RCU grace period,
overlap the gateway's work, and the command line follows over a pipe.

``late_command`` goes one step further (issue 13): bwrap itself is started before the gateway
answers, with sandgate-enter's ``--late`` mode as its command, so bwrap's namespaces and mounts
(8-20 ms here) are made while the gateway joins the guest. The command's environment (proxy,
CA, placeholders) and its command line follow through a pipe (``late_blob``); reading it is
the sandbox's hold, and end-of-file with nothing read runs nothing.

Either way a failing step is named: it is written into a close-on-exec pipe the runner reads
until bwrap runs (Python's own report says only "Exception occurred in preexec_fn").
tests/kernel/test_exec_identity.py compares what a sandboxed process is (ids, groups, every
capability set, no_new_privs, seccomp, netns, cgroups, OOM score) under each way and the old
chain.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sandgate import TYPE_CHECKING
from sandgate.errors import SandboxError
from sandgate.gateway.config import RUN_ROOT

if TYPE_CHECKING:
    from typing import Any

__all__ = ["LATER", "Entry", "ahead", "helper", "late_blob", "late_command", "popen", "spawn"]

SOURCE = Path(__file__).with_name("enter.c")
HELPER_DIR = RUN_ROOT / "bin"

LATER = "@"  # Entry.netns for ``ahead``: the namespace comes with the command line
CLONE_NEWNET = 0x40000000
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
_LINUX_CAPABILITY_VERSION_3 = 0x20080522

_libc = ctypes.CDLL(None, use_errno=True)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


@dataclass(frozen=True)
class Entry:
    """Who the sandbox's first process becomes, and where it lives."""

    netns: str  # path of the guest's network namespace (/run/netns/sg-…), or LATER
    uid: int
    gid: int
    cgroups: tuple[str, ...] = ()  # cgroup.procs files of the session's cgroups
    oom_score: int | None = None

    def __post_init__(self) -> None:
        if self.uid == 0 or self.gid == 0:
            raise ValueError("a sandbox never runs as uid or gid 0")


def _last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 63  # dropping a capability the kernel does not know is EINVAL: skipped below


def _bwrap() -> str:
    found = shutil.which("bwrap")
    if found is None:
        raise SandboxError("bwrap not found", "apt-get install bubblewrap")
    return found


def popen(
    entry: Entry, argv: Sequence[str], *, use_helper: bool | None = None, **kwargs: Any
) -> subprocess.Popen[bytes]:
    """Start ``argv`` (a bwrap command line) as ``entry`` says; ``kwargs`` go to Popen.
    ``use_helper``: True needs sandgate-enter, False forks the runner, None takes the helper
    where it can be built. Returns once bwrap runs; a step that failed raises SandboxError."""
    proc, entered = spawn(entry, argv, use_helper=use_helper, **kwargs)
    entered()
    return proc


def spawn(
    entry: Entry, argv: Sequence[str], *, use_helper: bool | None = None, **kwargs: Any
) -> tuple[subprocess.Popen[bytes], Callable[[], None]]:
    """As ``popen``, but returns at once, with a call that waits until bwrap runs (or raises
    what failed): the helper's steps (a cgroup join waits out an RCU grace period) overlap
    whatever the caller does meanwhile."""
    if not argv or os.path.basename(argv[0]) != "bwrap":
        raise ValueError("enter.popen starts bwrap, which makes the sandbox's own namespaces")
    if entry.netns == LATER:
        raise ValueError("only enter.ahead takes the namespace later")
    found = helper() if use_helper is not False else None
    if use_helper and found is None:
        raise SandboxError("sandgate-enter cannot be built here", "apt-get install gcc libc6-dev")
    if found is not None:
        return _with_helper(found, entry, argv, dict(kwargs))
    return _by_fork(entry, argv, kwargs), lambda: None


def ahead(
    entry: Entry, **kwargs: Any
) -> tuple[subprocess.Popen[bytes], Callable[[Sequence[str] | None], None], Callable[[], None]]:
    """sandgate-enter started before its command line is known: it does every step (joining
    the cgroup waits out an RCU grace period) while the caller goes on. Returns the process,
    ``launch(argv)`` (hands it the bwrap command line, once; ``launch(None)`` gives up and
    the process runs nothing), and the call that waits until bwrap runs, as ``spawn``'s.
    With ``entry.netns`` LATER the process starts before the namespace exists (its cgroup
    join begins sooner) and ``argv`` starts with the namespace's path, then bwrap's line."""
    found = helper()
    if found is None:
        raise SandboxError("sandgate-enter cannot be built here", "apt-get install gcc libc6-dev")
    argv_r, argv_w = os.pipe2(os.O_CLOEXEC)
    try:
        keep = (argv_r, *kwargs.pop("pass_fds", ()))
        proc, entered = _with_helper(found, entry, ["@", str(argv_r)], {**kwargs, "pass_fds": keep})
    except BaseException:
        os.close(argv_w)
        raise
    finally:
        os.close(argv_r)

    def launch(argv: Sequence[str] | None) -> None:
        if argv is None:  # given up: the helper reads end-of-file and runs nothing
            os.close(argv_w)
            return
        line_argv = argv[1:] if entry.netns == LATER else argv
        if not line_argv or os.path.basename(line_argv[0]) != "bwrap":
            os.close(argv_w)
            raise ValueError("enter.ahead launches bwrap, which makes the sandbox's namespaces")
        try:
            line = memoryview(b"".join(os.fsencode(a) + b"\0" for a in argv))
            with contextlib.suppress(BrokenPipeError):  # it failed a step: entered() says which
                while line:
                    line = line[os.write(argv_w, line) :]
        finally:
            os.close(argv_w)

    return proc, _once_with(launch), entered


def late_command(self_fd: int, blob_fd: int) -> list[str]:
    """The command bwrap runs when the sandbox's command comes later: sandgate-enter (open as
    ``self_fd`` in the sandbox, so nothing of it is bound in) waiting on ``blob_fd``."""
    return [f"/proc/self/fd/{self_fd}", "--late", str(blob_fd), str(self_fd)]


def late_blob(env: dict[str, str], command: Sequence[str]) -> bytes:
    """What ``late_command`` reads: the environment, an empty string, the command line."""
    if not command:
        raise ValueError("no command")
    for key, value in env.items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise ValueError(f"not an environment variable: {key!r}")
    if any("\0" in a for a in command):
        raise ValueError("a NUL byte in the command line")
    parts = [f"{k}={v}" for k, v in env.items()] + ["", *command]
    return b"".join(os.fsencode(p) + b"\0" for p in parts)


def _with_helper(
    found: str, entry: Entry, argv: Sequence[str], kwargs: dict[str, Any]
) -> tuple[subprocess.Popen[bytes], Callable[[], None]]:
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    oom = "-" if entry.oom_score is None else str(entry.oom_score)
    line = [found, str(err_w), entry.netns, str(entry.uid), str(entry.gid), oom]
    keep = (err_w, *kwargs.pop("pass_fds", ()))
    try:
        proc = subprocess.Popen([*line, *entry.cgroups, "--", *argv], pass_fds=keep, **kwargs)
    except BaseException:
        os.close(err_r)
        raise
    finally:
        os.close(err_w)

    def entered() -> None:
        try:
            why = _read_all(err_r)  # end of file once bwrap runs; else the step that failed
        finally:
            os.close(err_r)
        if why:
            proc.wait()
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
            raise SandboxError(f"cannot enter the sandbox: {why}")

    return proc, _once(entered)


def _once_with(
    fn: Callable[[Sequence[str] | None], None],
) -> Callable[[Sequence[str] | None], None]:
    done = False

    def call(argv: Sequence[str] | None) -> None:
        nonlocal done
        if done:
            raise ValueError("launched already")
        done = True
        fn(argv)

    return call


def _once(fn: Callable[[], None]) -> Callable[[], None]:
    done = False

    def call() -> None:
        nonlocal done
        if not done:
            done = True
            fn()

    return call


def _read_all(fd: int) -> str:
    out = b""
    while chunk := os.read(fd, 512):
        out += chunk
    return out.decode(errors="replace")


def helper() -> str | None:
    """sandgate-enter for this source, built on first use; None where it cannot be. Looked up
    once per process, and again if the file went (a reboot empties /run). One thread builds
    (a suite's parallel sessions all ask at once); the others wait for its answer."""
    with _BUILDING:
        found = _helper()
        if found is not None and not os.path.exists(found):
            _helper.cache_clear()
            found = _helper()
        return found


_BUILDING = threading.Lock()
STALE_BUILD = 3600.0  # seconds: a build of another source older than this is deleted


@functools.cache
def _helper() -> str | None:
    try:
        source = SOURCE.read_bytes()
    except OSError:
        return None
    target = HELPER_DIR / f"sandgate-enter-{hashlib.sha256(source).hexdigest()[:16]}"
    if all(_trusted(p) for p in (target, HELPER_DIR, HELPER_DIR.parent)):
        return str(target)
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None or os.geteuid() != 0:
        return None
    with contextlib.suppress(OSError):
        HELPER_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    if not all(_trusted(d) for d in (HELPER_DIR, HELPER_DIR.parent)):
        return None
    if sys.stderr.isatty():
        sys.stderr.write("sandgate: building sandgate-enter (once per boot)\n")
    # Another process may build beside us: each writes a file of its own, then renames it.
    partial = HELPER_DIR / f".{target.name}.{os.getpid()}.{threading.get_ident()}"
    for static in (["-static"], []):  # static: no dynamic loader at each exec
        build = [compiler, "-O2", "-Wall", *static, "-o", str(partial), str(SOURCE)]
        if subprocess.run(build, capture_output=True, check=False).returncode == 0:
            os.chmod(partial, 0o755)
            os.replace(partial, target)  # atomic: a runner building beside us is harmless
            _forget_stale(target)
            return str(target)
    with contextlib.suppress(OSError):
        partial.unlink()
    return None


def _forget_stale(target: Path) -> None:
    """Delete builds of other sources not made lately: an older sandgate's, after an upgrade.
    One made lately may be another installed version's, in use (it would rebuild, but a
    session starting at that moment would fail)."""
    now = time.time()
    for old in HELPER_DIR.glob("sandgate-enter-*"):
        with contextlib.suppress(OSError):
            if old != target and now - old.stat().st_mtime > STALE_BUILD:
                old.unlink()


def _trusted(path: Path) -> bool:
    """Root's, and writable by no one else: it is run as root."""
    try:
        st = path.stat()
    except OSError:
        return False
    return st.st_uid == 0 and not st.st_mode & 0o022


def _by_fork(entry: Entry, argv: Sequence[str], kwargs: dict[str, Any]) -> subprocess.Popen[bytes]:
    fds: list[int] = []
    try:
        net = _open(entry.netns, os.O_RDONLY, "the guest's network namespace", fds)
        joins = [_open(p, os.O_WRONLY, "the session's cgroup", fds) for p in entry.cgroups]
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        fds += [err_r, err_w]
        child = _child(entry, net, joins, err_w)
        try:
            # The child takes no lock and imports nothing (see the top): preexec_fn is safe here.
            return subprocess.Popen(
                list(argv),
                executable=_bwrap(),
                preexec_fn=child,  # noqa: PLW1509
                **kwargs,
            )
        except subprocess.SubprocessError as exc:
            os.close(err_w)
            fds.remove(err_w)
            why = os.read(err_r, 512).decode(errors="replace") or str(exc)
            raise SandboxError(f"cannot enter the sandbox: {why}") from exc
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def _open(path: str, flags: int, what: str, fds: list[int]) -> int:
    try:
        fd = os.open(path, flags | os.O_CLOEXEC)
    except OSError as exc:
        raise SandboxError(f"cannot open {what} ({path}): {exc.strerror}") from exc
    fds.append(fd)
    return fd


def _child(entry: Entry, net: int, joins: list[int], err: int) -> Callable[[], None]:
    """The function the child runs between fork and exec; everything it needs bound here."""
    uid, gid = entry.uid, entry.gid
    oom = None if entry.oom_score is None else str(entry.oom_score).encode()
    prctl, setns, capget, capset = _libc.prctl, _libc.setns, _libc.capget, _libc.capset
    caps = [ctypes.c_ulong(c) for c in range(_last_cap() + 1)]
    zero, one = ctypes.c_ulong(0), ctypes.c_ulong(1)
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    get_errno, strerror, write, setgroups = ctypes.get_errno, os.strerror, os.write, os.setgroups
    setresgid, setresuid = os.setresgid, os.setresuid

    def fail(step: str, errno: int) -> None:
        with contextlib.suppress(OSError):
            write(err, f"{step}: {strerror(errno)}".encode())
        raise OSError(errno, step)

    def child() -> None:
        if oom is not None:
            try:
                fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
                write(fd, oom)
                os.close(fd)
            except OSError as exc:
                fail("setting the OOM score", exc.errno or 0)
        for fd in joins:
            try:
                write(fd, b"0")
            except OSError as exc:
                fail("joining the session's cgroup", exc.errno or 0)
        if setns(net, CLONE_NEWNET) != 0:
            fail("entering the guest's network namespace", get_errno())
        for cap in caps:
            if prctl(PR_CAPBSET_DROP, cap, zero, zero, zero) != 0 and get_errno() != 22:
                fail("dropping the capability bounding set", get_errno())
        if capget(ctypes.byref(header), data) != 0:
            fail("reading capabilities", get_errno())
        data[0].inheritable = data[1].inheritable = 0
        if capset(ctypes.byref(header), data) != 0:
            fail("clearing inheritable capabilities", get_errno())
        try:
            setgroups([])
            setresgid(gid, gid, gid)
            setresuid(uid, uid, uid)
        except OSError as exc:
            fail("switching to the sandbox's uid", exc.errno or 0)
        if prctl(PR_SET_NO_NEW_PRIVS, one, zero, zero, zero) != 0:
            fail("setting no_new_privs", get_errno())

    return child
