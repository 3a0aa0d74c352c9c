"""Session retention (session/retention.py): by age and total size, oldest first, never a
running session; with a temporary SANDGATE_HOME."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from sandgate import cleanup
from sandgate.errors import SandgateError
from sandgate.session.retention import DAY, Kept, Limits, apply, plan

MB = 1024 * 1024
NOW = 1_800_000_000.0


def k(name: str, days_old: float, mb: float, running: bool = False) -> Kept:
    return Kept(name, NOW - days_old * DAY, int(mb * MB), running)


def names(kept: list[Kept]) -> list[str]:
    return [x.name for x in kept]


def test_age_then_size_oldest_first() -> None:
    sessions = [k("new", 0.1, 40), k("mid", 3, 40), k("old", 10, 40), k("ancient", 40, 1)]
    remove, spared = plan(sessions, Limits(days=30, mb=100), NOW)
    assert names(remove) == ["ancient", "old"] and spared == []  # 80 MB left fit in 100


def test_a_running_session_is_never_removed_but_counts() -> None:
    sessions = [k("old-running", 40, 60, running=True), k("mid", 3, 30), k("new", 0, 30)]
    remove, spared = plan(sessions, Limits(days=30, mb=100), NOW)
    assert names(remove) == ["mid"]  # 60 + 30 + 30 > 100: the oldest that may go, goes
    assert names(spared) == ["old-running"]


def test_zero_turns_a_limit_off() -> None:
    sessions = [k("a", 400, 5000), k("b", 1, 5000)]
    assert plan(sessions, Limits(days=0, mb=0), NOW) == ([], [])
    assert names(plan(sessions, Limits(days=0, mb=6000), NOW)[0]) == ["a"]


@pytest.mark.parametrize("value", ["-1", "ten", "nan", "inf"])
def test_bad_limits_are_an_error_naming_the_variable(value: str) -> None:
    with pytest.raises(SandgateError, match="SANDGATE_KEEP_MB"):
        Limits.from_env({"SANDGATE_KEEP_MB": value})
    assert Limits.from_env({}) == Limits(30, 2048)
    assert Limits.from_env({"SANDGATE_KEEP_DAYS": "7", "SANDGATE_KEEP_MB": "0.5"}) == Limits(7, 0.5)


def _session(home: Path, name: str, days_old: float, mb: float) -> Path:
    d = home / "sessions" / name
    (d / "work").mkdir(parents=True)
    (d / "work" / "output.log").write_bytes(b"x" * int(mb * MB))
    t = time.time() - days_old * DAY
    os.utime(d, (t, t))
    return d


def test_apply_on_a_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDGATE_HOME", str(tmp_path))
    monkeypatch.setenv("SANDGATE_KEEP_DAYS", "30")
    monkeypatch.setenv("SANDGATE_KEEP_MB", "3")
    _session(tmp_path, "s-ancient", 45, 0.1)
    _session(tmp_path, "s-running", 44, 0.5)  # old, but its runner is alive
    _session(tmp_path, "s-old", 5, 1.5)
    _session(tmp_path, "s-mid", 2, 1.5)
    _session(tmp_path, "s-last", 0, 1)  # the session that just ended
    (tmp_path / "sessions" / "stray-file").write_text("not a session")
    owner = "mount-s-running"
    cleanup.own(owner)
    try:
        result = apply(tmp_path, keep={"s-last"})
    finally:
        cleanup.disown(owner)
    assert result.removed == ["s-ancient", "s-old"]  # 0.5 + 1.5 + 1 fits in 3 MB
    assert result.kept_running == ["s-running"]
    left = sorted(p.name for p in (tmp_path / "sessions").iterdir())
    assert left == ["s-last", "s-mid", "s-running", "stray-file"]
    assert result.freed == int(0.1 * MB) + int(1.5 * MB)
    # Once its runner is gone, the old session goes too.
    assert apply(tmp_path).removed == ["s-running"]


def test_apply_without_a_sessions_folder(tmp_path: Path) -> None:
    assert apply(tmp_path, Limits()).removed == []
