"""`sandgate up`'s keeping loop and `sandgate down`'s stop, without a gateway: a fake stack and
real child processes (the pid check reads their real /proc entries)."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from sandgate import pids
from sandgate.errors import SandgateError
from sandgate.gateway import config
from sandgate.session import stack as stack_mod

SLEEP = "import time; print('ready', flush=True); time.sleep(30)"


def _start(*argv: str) -> subprocess.Popen[str]:
    """A child that has exec'd (until then /proc shows the parent's command line)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


class _Gateway:
    def __init__(self, lives: list[bool]) -> None:
        self.lives = lives

    def alive(self) -> bool:
        return self.lives.pop(0) if self.lives else True


class _Stack:
    def __init__(self, lives: list[bool], fail: bool = False) -> None:
        self.instance = "t-up"
        self.gateway = _Gateway(lives)
        self.restarts = 0
        self.fail = fail

    def restart_gateway(self) -> None:
        if self.fail:
            raise SandgateError("no")
        self.restarts += 1


@pytest.fixture
def run_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(config, "RUN_ROOT", tmp_path)
    (tmp_path / "t-up").mkdir()
    return tmp_path


def test_keep_up_restarts_a_dead_gateway_and_records_its_pid(run_root: Path) -> None:
    stopping = threading.Event()
    fake = _Stack([True, False, True])
    told: list[str] = []

    def restarted() -> None:
        told.append("restarted")
        stopping.set()

    stack_mod.keep_up(
        fake,  # type: ignore[arg-type]
        stopping, died=lambda: told.append("died"), restarted=restarted, poll=0.01,
    )  # fmt: skip
    assert fake.restarts == 1
    assert told == ["died", "restarted"]
    assert (run_root / "t-up" / stack_mod.UP_PID).read_text().isdigit()


def test_keep_up_raises_when_a_restart_fails(run_root: Path) -> None:
    with pytest.raises(SandgateError):
        stack_mod.keep_up(
            _Stack([False], fail=True),  # type: ignore[arg-type]
            threading.Event(), died=lambda: None, restarted=lambda: None, poll=0.01,
        )  # fmt: skip


def test_stop_up_signals_only_a_sandgate_process(run_root: Path) -> None:
    ours = _start(sys.executable, "-c", SLEEP, "sandgate", "up")
    # not from the venv (its path says "sandgate"): the system's Python
    other = _start("/usr/bin/python3", "-c", SLEEP)
    try:
        pid_file = run_root / "t-up" / stack_mod.UP_PID
        pid_file.write_text(str(other.pid))
        assert not stack_mod.stop_up("t-up", timeout=1)
        assert other.poll() is None  # a reused pid is left alone
        pid_file.write_text(str(ours.pid))
        assert stack_mod.stop_up("t-up", timeout=5)
        assert ours.wait(5) == -15
        assert not pids.is_ours(ours.pid, "sandgate")  # gone (reaped)
        assert not stack_mod.stop_up("absent")
    finally:
        for p in (ours, other):
            p.kill()
            p.wait()


def test_is_ours_wants_the_marker_and_a_live_process() -> None:
    child = _start(sys.executable, "-c", SLEEP, "sandgate.world.servers.web")
    try:
        assert pids.is_ours(child.pid, "sandgate.world.servers")
        assert not pids.is_ours(child.pid, "sandgate.gateway.daemon")
        assert pids.kill(child.pid)
        assert not pids.is_ours(child.pid, "sandgate.world.servers")  # a zombie is not alive
    finally:
        child.kill()
        child.wait()
    assert not pids.alive(0)
    assert not pids.alive(-1)
