"""A sandbox set up before the gateway answers (issue 13): bwrap makes its namespaces and
mounts while the guest joins, and waits in sandgate-enter --late for the command and its
environment. It must be the same sandbox as one set up at once (a fast path that disagrees
with the slow one is a bug), run nothing until released, and a failure in either half (the
sandbox's set-up, the gateway's join) must leave nothing behind."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import pytest

from sandgate import cleanup
from sandgate.errors import SandgateError
from sandgate.net import ns
from sandgate.sandbox import bwrap, enter, limits
from sandgate.sandbox.launch import Sandbox
from sandgate.sandbox.workspace import SESSIONS_ROOT
from sandgate.session import runner
from tests.kernel.conftest import Runner

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")

UID = 61078
# What the command is: its environment, its open descriptors, who it is, where it runs.
STATE = (
    "env | sort; ls /proc/self/fd; grep -E '^(Uid|Gid|Groups|Cap...|NoNewPrivs):' "
    "/proc/self/status; cat /proc/self/cgroup; readlink /proc/self/ns/net; pwd; touch /work/ran"
)


def _box(name: str) -> tuple[Sandbox, bwrap.SandboxSpec]:
    box = Sandbox.create(f"ahead-{name}-{os.getpid()}", "ahead", None, UID)
    spec = bwrap.SandboxSpec(
        netns=ns.path(box.netns),
        uid=UID,
        gid=UID,
        command=("/bin/sh", "-c", STATE),
        workdir=box.workdir,
        home=box.home,
        # And more than a pipe holds (64 KiB): the line is sent as the waiter reads it.
        env={"HTTPS_PROXY": "http://10.9.9.1:3128", "EMPTY": "", "SPACED": "a b"}
        | {f"BIG{i}": str(i) * 40_000 for i in range(3)},
    )
    return box, spec


def _run(late: bool, tmp_path: Path) -> str:
    """The command's view of itself, set up ahead (``late``) or at once, in a cgroup."""
    if enter.helper() is None:
        pytest.skip("sandgate-enter cannot be built here (no C compiler)")
    box, spec = _box("late" if late else "once")
    cg = limits.make(f"{limits.PREFIX}ahead-{os.getpid()}-{int(late)}")
    out = tmp_path / f"out-{int(late)}"
    try:
        entry = enter.Entry(spec.netns, UID, UID, cg.procs, limits.SANDBOX_OOM_SCORE)
        if late:  # as the runner does it: started before the namespace is known
            entry = dataclasses.replace(entry, netns=enter.LATER)
            assert box.prepare(entry, capture=out, echo=False, late=True)
            box.start(dataclasses.replace(spec, env={}), capture=out, echo=False)
            time.sleep(0.3)  # set up and waiting: nothing of the command has run
            assert box.proc is not None and box.proc.poll() is None
            assert not (box.workdir / "ran").exists()
        code = box.run(spec, timeout=20, capture=out, echo=False, cgroups=cg.procs, oom_score=500)
        assert code == 0, out.read_text()
        netns = f"net:[{os.stat(spec.netns).st_ino}]"  # the guest's, under either way
        return out.read_text().replace(cg.name, "CG").replace(netns, "net:[guest]")
    finally:
        box.destroy()
        cg.remove()


def test_a_sandbox_set_up_ahead_is_the_sandbox_set_up_at_once(tmp_path: Path) -> None:
    ahead, once = _run(True, tmp_path), _run(False, tmp_path)
    assert ahead == once
    lines = ahead.splitlines()
    assert "HTTPS_PROXY=http://10.9.9.1:3128" in lines and "SPACED=a b" in lines
    assert "EMPTY=" in lines and "BIG2=" + "2" * 40_000 in lines
    fds = lines[lines.index("0") : lines.index("0") + 5]
    assert fds[:4] == ["0", "1", "2", "3"] and not fds[4].isdigit()  # ls's own, nothing else
    assert f"Uid:\t{UID}\t{UID}\t{UID}\t{UID}" in lines and "NoNewPrivs:\t1" in lines
    assert "net:[guest]" in lines


def test_a_sandbox_set_up_ahead_and_killed_never_runs_its_command() -> None:
    if enter.helper() is None:
        pytest.skip("sandgate-enter cannot be built here (no C compiler)")
    box, spec = _box("killed")
    try:
        assert box.prepare(enter.Entry(spec.netns, UID, UID), late=True)
        box.start(dataclasses.replace(spec, env={}))
        time.sleep(0.3)
        assert box.proc is not None
        tree = [box.proc.pid]
        while kids := Path(f"/proc/{tree[-1]}/task/{tree[-1]}/children").read_text().split():
            tree.append(int(kids[0]))
        assert len(tree) == 3  # outer bwrap, bwrap as pid 1, the waiter
        box.kill()  # our end of the pipe closes: the waiter reads nothing and runs nothing
        assert box.proc.poll() is not None
        time.sleep(0.2)
        assert not (box.workdir / "ran").exists()
        assert not [p for p in tree if Path(f"/proc/{p}").exists()]
    finally:
        box.destroy()


def _mine() -> set[str]:
    """What this process owns (cgroups, namespaces, mounts), and its sandbox processes."""
    owned = {p.name for p in cleanup.OWNERS.glob("*") if p.read_text().strip() == str(os.getpid())}
    kids = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text().split()
    return owned | {f"pid {k}" for k in kids}


def _gone(sid: str) -> None:
    assert limits.PREFIX + sid not in limits.ours()
    assert not (SESSIONS_ROOT / sid).exists()


def test_a_refused_join_leaves_nothing_of_the_sandbox_set_up_ahead(
    sandbox: Runner, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = f"{runner.new_session_id()}-r"
    monkeypatch.setattr(runner, "new_session_id", lambda: sid)
    started: list[Sandbox] = []
    real = Sandbox.start

    def start(self: Sandbox, *a: object, **kw: object) -> None:
        real(self, *a, **kw)  # type: ignore[arg-type]
        started.append(self)

    monkeypatch.setattr(Sandbox, "start", start)
    before = _mine()
    with pytest.raises(SandgateError):
        sandbox("true", profile="no-such-profile")
    assert started, "the sandbox was not set up before the join"
    assert _mine() == before
    _gone(sid)


def test_a_sandbox_set_up_ahead_that_fails_leaves_nothing_behind(
    sandbox: Runner, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    sid = f"{runner.new_session_id()}-f"
    monkeypatch.setattr(runner, "new_session_id", lambda: sid)
    source = tmp_path / "f"
    source.write_text("x")
    before = _mine()
    # bwrap cannot make a mount point inside the read-only /usr: its set-up fails.
    r = sandbox("true", files={"/usr/sg-no-such-dir/f": source})
    assert r.exit_code != 0
    assert _mine() == before
    _gone(sid)


def test_a_command_not_found_is_said_and_leaves_nothing_behind(sandbox: Runner) -> None:
    before = _mine()
    r = sandbox("sg-no-such-tool")
    assert r.exit_code == 127 and r.message is not None and "not found" in r.message
    assert _mine() == before
