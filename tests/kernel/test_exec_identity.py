"""The one-step exec (sandbox/enter.py) makes the same sandboxed process the old chain made.

The chain was ``sh`` (OOM score, cgroup join) → nsenter → setpriv → bwrap; now the runner's
child does those steps itself and execs bwrap. Both start the same bwrap command in the same
namespace and cgroup; every process of the tree (the outer bwrap, bwrap as pid 1, the command)
must be the same as seen from the host (ids, groups, every capability set, no_new_privs,
seccomp, netns, cgroups, OOM score, session) and from inside (``id``, /proc/self/status).
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from sandgate.errors import SandboxError
from sandgate.net import ns
from sandgate.policy.limits import Limits
from sandgate.sandbox import bwrap, enter, limits
from sandgate.sandbox.launch import CommandNotFound, Sandbox

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root"),
    pytest.mark.skipif(
        not all(shutil.which(t) for t in ("nsenter", "setpriv", "bwrap")),
        reason="needs nsenter, setpriv and bwrap",
    ),
]

T = TypeVar("T")
UID = 61077
EXTRA_GROUP = 4242
CAP_NET_RAW = 13
SYS_SETGROUPS = {"x86_64": 116, "aarch64": 159}
FIELDS = (
    "Uid",
    "Gid",
    "Groups",
    "CapInh",
    "CapPrm",
    "CapEff",
    "CapBnd",
    "CapAmb",
    "NoNewPrivs",
    "Seccomp",
    "Seccomp_filters",
)
INSIDE = (
    "id; grep -E '^(Uid|Gid|Groups|Cap...|NoNewPrivs|Seccomp.*):' /proc/self/status; "
    "readlink /proc/self/ns/net; echo READY; read _; exit 0"
)


@dataclass
class Place:
    netns: str
    cgroup: limits.Cgroup
    base: Path

    def spec(self) -> bwrap.SandboxSpec:
        return bwrap.SandboxSpec(
            netns=ns.path(self.netns),
            uid=UID,
            gid=UID,
            command=("/bin/sh", "-c", INSIDE),
            workdir=self.base / "work",
            home=self.base / "home",
        )


@pytest.fixture
def place() -> Iterator[Place]:
    name = f"sg-exid-{os.getpid() % 100000}"
    cg_name = f"sandgate-exid-{os.getpid() % 100000}"
    base = Path(tempfile.mkdtemp(prefix="sg-exid-", dir="/var/tmp"))
    os.chmod(base, 0o711)
    for d in ("work", "home"):
        (base / d).mkdir(mode=0o700)
        os.chown(base / d, UID, UID)
    ns.create(name)
    cg = limits.create(cg_name, Limits(pids=64, memory=128 << 20))
    try:
        yield Place(name, cg, base)
    finally:
        cg.remove()
        ns.remove(name)
        shutil.rmtree(base)


def _status(pid: int) -> dict[str, str]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = " ".join(value.split())
    return {k: fields.get(k, "") for k in FIELDS}


def _identity(pid: int) -> dict[str, str]:
    """What the process is, as the host sees it."""
    out = _status(pid)
    out["comm"] = Path(f"/proc/{pid}/comm").read_text().strip()
    out["netns"] = os.readlink(f"/proc/{pid}/ns/net")
    own_userns = os.readlink("/proc/self/ns/user")
    out["host userns"] = str(os.readlink(f"/proc/{pid}/ns/user") == own_userns)
    out["cgroup"] = Path(f"/proc/{pid}/cgroup").read_text()
    out["oom_score_adj"] = Path(f"/proc/{pid}/oom_score_adj").read_text().strip()
    out["session leader"] = str(os.getsid(pid) == pid)
    return out


def _tree(pid: int) -> list[int]:
    """The process and its first descendants (outer bwrap → bwrap as pid 1 → the command)."""
    chain = [pid]
    while kids := Path(f"/proc/{chain[-1]}/task/{chain[-1]}/children").read_text().split():
        chain.append(int(kids[0]))
    return chain


def observe(proc: subprocess.Popen[bytes]) -> dict[str, object]:
    assert proc.stdout is not None and proc.stdin is not None
    inside: list[str] = []
    while (line := proc.stdout.readline().decode().strip()) != "READY":
        assert line or proc.poll() is None, f"the sandbox ended early: {inside}"
        inside.append(line)
    deadline = time.monotonic() + 10
    while len(tree := _tree(proc.pid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    seen = {"inside": inside, "tree": [_identity(p) for p in tree]}
    proc.stdin.close()
    assert proc.wait(timeout=10) == 0
    return seen


def old_chain(place: Place) -> subprocess.Popen[bytes]:
    """What the runner started before: the cgroup shell, then nsenter, setpriv, bwrap."""
    argv = [*place.cgroup.prefix_argv(limits.SANDBOX_OOM_SCORE), *bwrap.argv(place.spec())]
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE}
    return subprocess.Popen(argv, start_new_session=True, **pipes)  # type: ignore[call-overload]


def start(entry: enter.Entry, argv: list[str], way: str, **kwargs: Any) -> subprocess.Popen[bytes]:
    if way == "ahead":  # what the runner does: started first, its command line given later
        proc, launch, entered = enter.ahead(entry, **kwargs)
        launch(argv)
        entered()
        return proc
    return enter.popen(entry, argv, use_helper=way == "helper", **kwargs)


def one_step(place: Place, way: str) -> subprocess.Popen[bytes]:
    spec = place.spec()
    entry = enter.Entry(spec.netns, UID, UID, place.cgroup.procs, limits.SANDBOX_OOM_SCORE)
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE}
    return start(entry, bwrap.bwrap_argv(spec), way, start_new_session=True, **pipes)


# sandgate-enter (vfork + exec of the C helper) with its command line at once or later, and
# the runner's own fork where the helper cannot be built.
@pytest.fixture(params=["helper", "ahead", "fork"])
def way(request: pytest.FixtureRequest) -> str:
    if request.param != "fork" and enter.helper() is None:
        pytest.skip("sandgate-enter cannot be built here (no C compiler)")
    return str(request.param)


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint32) for n in ("effective", "permitted", "inheritable")]


def with_more_to_drop(fn: Callable[[], T]) -> T:
    """Run ``fn`` on a thread holding a supplementary group and an inheritable capability
    (credentials are per thread in the kernel; raw syscalls change only this one), so a path
    that forgets to clear either shows it: the test process itself has neither."""

    def run() -> T:
        libc = _libc()
        gids = (ctypes.c_uint * 1)(EXTRA_GROUP)
        assert libc.syscall(SYS_SETGROUPS[os.uname().machine], 1, gids) == 0
        header, data = _CapHeader(0x20080522, 0), (_CapData * 2)()
        assert libc.capget(ctypes.byref(header), data) == 0
        data[0].inheritable |= 1 << CAP_NET_RAW
        assert libc.capset(ctypes.byref(header), data) == 0
        mine = Path("/proc/thread-self/status").read_text()
        assert f"Groups:\t{EXTRA_GROUP}" in mine and "CapInh:\t0000000000002000" in mine
        return fn()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()


def test_one_step_gives_the_sandbox_the_identity_the_chain_gave(place: Place, way: str) -> None:
    before = with_more_to_drop(lambda: observe(old_chain(place)))
    now = with_more_to_drop(lambda: observe(one_step(place, way)))
    assert now == before
    # And what that identity is, so two equally wrong paths do not pass.
    host = os.readlink("/proc/self/ns/net")
    tree = now["tree"]
    assert isinstance(tree, list) and [p["comm"] for p in tree] == ["bwrap", "bwrap", "sh"]
    ids = f"{UID} {UID} {UID} {UID}"
    for proc in tree:
        assert proc["Uid"] == proc["Gid"] == ids
        assert proc["Groups"] == ""
        assert proc["NoNewPrivs"] == "1"
        assert proc["CapInh"] == proc["CapPrm"] == proc["CapEff"] == proc["CapAmb"]
        assert proc["CapEff"] == "0000000000000000"
        assert proc["CapBnd"] == "0000000000000000"
        assert proc["netns"] != host
        assert proc["oom_score_adj"] == str(limits.SANDBOX_OOM_SCORE)
        for line in proc["cgroup"].splitlines():
            if any(c in line.split(":")[1].split(",") for c in place.cgroup.hierarchy.dirs):
                assert line.endswith(place.cgroup.name), line
    assert tree[0]["host userns"] == "True" and tree[0]["session leader"] == "True"
    target = os.stat(ns.path(place.netns)).st_ino
    assert all(p["netns"] == f"net:[{target}]" for p in tree)
    inside = now["inside"]
    assert isinstance(inside, list) and inside[-1] == f"net:[{target}]"
    assert inside[0].startswith(f"uid={UID}") and f" gid={UID}" in inside[0], inside[0]


def test_a_step_that_fails_is_named_and_nothing_runs(
    place: Place, tmp_path: Path, way: str
) -> None:
    not_a_netns = tmp_path / "plain-file"
    not_a_netns.write_text("")
    spec = place.spec()
    fds = len(os.listdir("/proc/self/fd"))
    entry = enter.Entry(str(not_a_netns), UID, UID, place.cgroup.procs)
    with pytest.raises(SandboxError, match="entering the guest's network namespace"):
        start(entry, bwrap.bwrap_argv(spec), way)
    missing = enter.Entry("/run/netns/sg-exid-none", UID, UID)
    with pytest.raises(SandboxError, match=r"network namespace .*sg-exid-none"):
        start(missing, bwrap.bwrap_argv(spec), way)
    assert len(os.listdir("/proc/self/fd")) == fds  # no descriptor left open
    # The failed child had joined the cgroup before it failed; it is gone now.
    assert not limits.populated(place.cgroup.name)


STATE = """#!/bin/sh
grep -E '^(Uid|Gid|Groups|Cap...|NoNewPrivs|Seccomp.*):' /proc/self/status
readlink /proc/self/ns/net
cat /proc/self/cgroup /proc/self/oom_score_adj
"""


def test_bwrap_starts_with_the_credentials_setpriv_gave_it(
    place: Place, monkeypatch: pytest.MonkeyPatch, way: str
) -> None:
    """bwrap itself sets no_new_privs and clears capabilities, which hides a step the path
    forgot: a stand-in ``bwrap`` first on PATH prints the state it was started in."""
    fake = place.base / "bin"
    fake.mkdir(mode=0o755)
    (fake / "bwrap").write_text(STATE)
    os.chmod(fake / "bwrap", 0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")

    def state(proc: subprocess.Popen[bytes]) -> list[str]:
        out, _ = proc.communicate(timeout=10)
        return out.decode().splitlines()

    before = with_more_to_drop(lambda: state(old_chain(place)))
    now = with_more_to_drop(lambda: state(one_step(place, way)))
    assert now == before
    for line in (
        f"Uid:\t{UID}\t{UID}\t{UID}\t{UID}",
        f"Gid:\t{UID}\t{UID}\t{UID}\t{UID}",
        "Groups:\t ",
        "NoNewPrivs:\t1",
        f"net:[{os.stat(ns.path(place.netns)).st_ino}]",
        str(limits.SANDBOX_OOM_SCORE),
    ):
        assert line in now
    assert all(x.endswith("0000000000000000") for x in now if x.startswith("Cap"))
    assert sum(x.endswith(f"/{place.cgroup.name}") for x in now) == len(place.cgroup.procs)


def _held_box(tmp: str) -> tuple[Sandbox, bwrap.SandboxSpec]:
    box = Sandbox.create(f"exid-{tmp}", "exid", None, UID)
    spec = bwrap.SandboxSpec(
        netns=ns.path(box.netns),
        uid=UID,
        gid=UID,
        command=("/bin/sh", "-c", "touch /work/ran"),
        workdir=box.workdir,
        home=box.home,
    )
    return box, spec


@pytest.fixture(params=["helper", "fork"])
def held_way(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "fork":
        monkeypatch.setattr(enter, "helper", lambda: None)  # as on a host without a compiler
    elif enter.helper() is None:
        pytest.skip("sandgate-enter cannot be built here (no C compiler)")
    return str(request.param)


def test_a_started_sandbox_runs_nothing_until_released(held_way: str) -> None:
    box, spec = _held_box("held")
    try:
        box.start(spec)
        assert box.proc is not None
        time.sleep(0.3)  # bwrap set up and waiting (a held command would have run by now)
        assert box.proc.poll() is None
        assert [Path(f"/proc/{p}/comm").read_text().strip() for p in _tree(box.proc.pid)] == [
            "bwrap",
            "bwrap",
        ]
        assert not (box.workdir / "ran").exists()
        assert box.run(spec, timeout=10) == 0
        assert (box.workdir / "ran").exists()
    finally:
        box.destroy()


def test_a_started_sandbox_that_is_killed_never_runs_its_command(held_way: str) -> None:
    box, spec = _held_box("killed")
    try:
        box.start(spec)
        time.sleep(0.3)
        assert box.proc is not None
        held = _tree(box.proc.pid)
        # As when the runner dies: its end of the pipe closes. That releases nothing.
        assert box._release is not None
        os.close(box._release)
        box._release = None
        time.sleep(0.3)
        assert not (box.workdir / "ran").exists()
        box.kill()
        assert box.proc.poll() is not None
        time.sleep(0.2)
        assert not (box.workdir / "ran").exists()
        # bwrap's pid 1 is gone too (held, it is not tied to its parent), not left waiting.
        assert not [p for p in held if Path(f"/proc/{p}").exists()]  # nor a zombie
    finally:
        box.destroy()


def test_a_helper_given_up_before_its_command_line_runs_nothing(place: Place) -> None:
    if enter.helper() is None:
        pytest.skip("sandgate-enter cannot be built here (no C compiler)")
    entry = enter.Entry(ns.path(place.netns), UID, UID, place.cgroup.procs)
    proc, launch, _ = enter.ahead(entry)
    deadline = time.monotonic() + 10
    while not limits.populated(place.cgroup.name) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert limits.populated(place.cgroup.name)  # it joined while its command line was unknown
    launch(None)
    assert proc.wait(timeout=10) == 125
    with pytest.raises(ValueError):
        launch(bwrap.bwrap_argv(place.spec()))  # once only


def test_a_prepared_sandbox_whose_command_is_missing_says_so() -> None:
    if enter.helper() is None:
        pytest.skip("sandgate-enter cannot be built here (no C compiler)")
    box, spec = _held_box("missing")
    try:
        assert box.prepare(enter.Entry(ns.path(box.netns), UID, UID))
        missing = dataclasses.replace(spec, command=("no-such-tool",))
        with pytest.raises(CommandNotFound):
            box.start(missing)
        with pytest.raises(CommandNotFound):  # not a wait on a helper that never gets its line
            box.run(missing, timeout=10)
        box.kill()
        assert box.proc is not None and box.proc.poll() is not None
    finally:
        box.destroy()


def test_parallel_sessions_build_sandgate_enter_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A suite's parallel sessions on a fresh boot all ask for sandgate-enter at once: one
    builds it, the others get the same file (they used to write one partial file together and
    fail with ENOENT or ETXTBSY)."""
    import shutil
    import tempfile
    import threading

    from sandgate.gateway.config import RUN_ROOT

    if shutil.which("gcc") is None and shutil.which("cc") is None:
        pytest.skip("no C compiler")
    RUN_ROOT.mkdir(parents=True, exist_ok=True)
    where = Path(tempfile.mkdtemp(dir=RUN_ROOT, prefix="sg-build-"))
    where.chmod(0o755)
    monkeypatch.setattr(enter, "HELPER_DIR", where)
    enter._helper.cache_clear()
    try:
        start = threading.Barrier(6)
        got: list[object] = []

        def ask() -> None:
            start.wait()
            try:
                got.append(enter.helper())
            except Exception as exc:
                got.append(exc)

        threads = [threading.Thread(target=ask) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert len(set(map(str, got))) == 1, got
        path = got[0]
        assert isinstance(path, str) and Path(path).parent == where, got
        assert os.access(path, os.X_OK)
        assert [p.name for p in where.iterdir()] == [Path(path).name]  # no partial file left
    finally:
        enter._helper.cache_clear()
        shutil.rmtree(where, ignore_errors=True)
