"""Session retention (session/retention.py): by age and total size, oldest first, never a
running session; with a temporary SANDGATE_HOME."""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from pathlib import Path

import pytest

from sandgate import cleanup
from sandgate.errors import SandgateError
from sandgate.session.retention import DAY, INDEX, SETTLE, Kept, Limits, apply, plan, scan

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
    left = sorted(p.name for p in (tmp_path / "sessions").iterdir() if p.name != INDEX)
    assert left == ["s-last", "s-mid", "s-running", "stray-file"]
    assert result.freed == int(0.1 * MB) + int(1.5 * MB)
    # Once its runner is gone, the old session goes too.
    assert apply(tmp_path).removed == ["s-running"]


def test_apply_without_a_sessions_folder(tmp_path: Path) -> None:
    assert apply(tmp_path, Limits()).removed == []


# The size index (issue 13): a cache that must never change a decision the full walk makes.


def _random_home(root: Path, rng: random.Random, now: float) -> set[str]:
    """A few kept folders of random ages (some inside SETTLE, some past the age limit) and
    sizes, strays beside them; returns the names to treat as running (``keep``)."""
    for i in range(rng.randrange(0, 14)):
        d = root / f"s{i:02d}-{rng.randrange(1 << 16):04x}"
        (d / "work").mkdir(parents=True)
        (d / "output.log").write_bytes(b"x" * rng.randrange(0, 5000))
        for j in range(rng.randrange(0, 3)):
            (d / "work" / f"f{j}").write_bytes(b"y" * rng.randrange(0, 3000))
        t = now - rng.choice([10.0, SETTLE / 2, SETTLE * 2, DAY, 5 * DAY, 40 * DAY])
        t -= rng.random() * 100
        os.utime(d, (t, t))
    if rng.random() < 0.3:
        (root / "stray").write_text("not a session")
    names = sorted(p.name for p in root.iterdir() if p.is_dir())
    return set(rng.sample(names, min(len(names), rng.randrange(0, 3))))


def _mutate(root: Path, rng: random.Random, now: float) -> None:
    """What happens between two runs: folders removed, added at the top, replaced under the
    same name and time, new sessions; the index itself damaged."""
    folders = sorted(p for p in root.iterdir() if p.is_dir())
    for d in folders:
        roll = rng.random()
        st = d.lstat()
        if roll < 0.15:
            shutil.rmtree(d)
        elif roll < 0.3:
            (d / "late.jsonl").write_bytes(b"z" * rng.randrange(1, 4000))
            os.utime(d, ns=(st.st_atime_ns, st.st_mtime_ns))  # same mtime, new ctime
        elif roll < 0.4:
            shutil.rmtree(d)
            (d / "work").mkdir(parents=True)
            (d / "output.log").write_bytes(b"w" * rng.randrange(0, 9000))
            os.utime(d, ns=(st.st_atime_ns, st.st_mtime_ns))
    for i in range(rng.randrange(0, 3)):
        d = root / f"t{i}-{rng.randrange(1 << 16):04x}"
        d.mkdir()
        (d / "output.log").write_bytes(b"n" * rng.randrange(0, 3000))
        t = now - rng.choice([5.0, 2 * DAY])
        os.utime(d, (t, t))
    index = root / INDEX
    roll = rng.random()
    if roll < 0.1:
        index.unlink(missing_ok=True)
    elif roll < 0.2:
        index.write_text('{"version": 1, "sessions": {"s00": [1, 2]')  # cut short
    elif roll < 0.25:
        index.write_text('{"version": 1, "sessions": []}')


@pytest.mark.parametrize("seed", range(40))
def test_the_index_chooses_what_the_full_walk_chooses(tmp_path: Path, seed: int) -> None:
    """Differential: random homes, the index primed, the home changed, the index maybe
    damaged; scan with the index sees exactly what the full walk sees, and apply removes
    exactly the full walk's victims."""
    rng = random.Random(seed)
    now = time.time()
    root = tmp_path / "sessions"
    root.mkdir()
    keep = _random_home(root, rng, now)
    if rng.random() < 0.8:
        apply(tmp_path, Limits(0, 0), keep, now)  # a run that removed nothing, index written
        time.sleep(0.011)  # past the kernel's timestamp tick: a change after it is a new ctime
    _mutate(root, rng, now)
    full, _ = scan(root, keep, now, full=True)
    indexed, _ = scan(root, keep, now)
    assert indexed == full
    total = sum(k.size for k in full)
    limits = Limits(rng.choice([0, 3, 30]), rng.choice([0, total * rng.random() / MB]))
    victims = names(plan(full, limits, now)[0])
    assert apply(tmp_path, limits, keep, now).removed == victims
    assert scan(root, keep, now)[0] == scan(root, keep, now, full=True)[0]
    recorded = set(json.loads((root / INDEX).read_text())["sessions"])
    assert recorded <= {p.name for p in root.iterdir() if p.is_dir()} - keep  # no ghosts


def test_a_stale_index_never_removes_a_running_or_too_new_session(tmp_path: Path) -> None:
    """An index whose keys still match but whose sizes are wrong (a file rewritten in place
    after its session ended) must not make retention remove what the full walk keeps: not the
    running session, not the one that just settled, not the old ones either."""
    now = time.time()
    root = tmp_path / "sessions"
    ages = [("a-old", 10 * DAY), ("b-old", 5 * DAY), ("c-run", 3 * DAY), ("d-new", SETTLE / 2)]
    for name, age in ages:
        (root / name).mkdir(parents=True)
        (root / name / "output.log").write_bytes(b"x" * 1000)
        os.utime(root / name, (now - age, now - age))
    apply(tmp_path, Limits(0, 0), now=now)
    index = json.loads((root / INDEX).read_text())
    assert sorted(index["sessions"]) == ["a-old", "b-old", "c-run"]  # d-new: not settled yet
    for name in ("a-old", "b-old", "c-run"):
        index["sessions"][name][3] = 10**12  # a terabyte each, by the stale record
    st = (root / "d-new").lstat()
    index["sessions"]["d-new"] = [st.st_ino, st.st_mtime_ns, st.st_ctime_ns, 10**12]
    (root / INDEX).write_text(json.dumps(index))
    limits = Limits(days=30, mb=0.01)  # 4,000 bytes fit in 10 KiB: the full walk removes none
    assert names(plan(scan(root, {"c-run"}, now, full=True)[0], limits, now)[0]) == []
    result = apply(tmp_path, limits, keep={"c-run"}, now=now)
    assert result.removed == []
    left = sorted(p.name for p in root.iterdir() if p.is_dir())
    assert left == ["a-old", "b-old", "c-run", "d-new"]
    # The stale sizes were caught and the index rewritten from the folders.
    assert {r[3] for r in json.loads((root / INDEX).read_text())["sessions"].values()} == {1000}


def test_a_running_or_unsettled_session_is_always_measured(tmp_path: Path) -> None:
    """Records that say a running session and one that just ended are empty (they grew since,
    or the record is forged) are not believed: their files count, and the old go."""
    now = time.time()
    root = tmp_path / "sessions"
    ages = [("a-old", 10 * DAY, 1000), ("c-run", 3 * DAY, MB), ("d-new", SETTLE / 2, MB)]
    for name, age, size in ages:
        (root / name).mkdir(parents=True)
        (root / name / "output.log").write_bytes(b"x" * size)
        os.utime(root / name, (now - age, now - age))
    rows = {}
    for name in ("a-old", "c-run", "d-new"):
        st = (root / name).lstat()
        rows[name] = [st.st_ino, st.st_mtime_ns, st.st_ctime_ns, 0 if name != "a-old" else 1000]
    (root / INDEX).write_text(json.dumps({"version": 1, "sessions": rows}))
    limits = Limits(days=30, mb=2)  # 2 MiB + 1000 bytes do not fit: a-old goes
    assert apply(tmp_path, limits, keep={"c-run"}, now=now).removed == ["a-old"]


def test_cleanup_sessions_walks_every_folder(tmp_path: Path) -> None:
    """The one gap of the index: a finished folder's file rewritten in place, deeper than its
    top (its key unchanged), stays at its recorded size until ``cleanup --sessions``
    (``full``) walks everything: retention keeps more than it should, never less."""
    now = time.time()
    root = tmp_path / "sessions"
    for name, age in [("a-old", 10 * DAY), ("b-mid", 5 * DAY)]:
        (root / name / "work").mkdir(parents=True)
        (root / name / "work" / "big").write_bytes(b"x" * 1000)
        os.utime(root / name, (now - age, now - age))
    apply(tmp_path, Limits(0, 0), now=now)
    (root / "a-old" / "work" / "big").write_bytes(b"x" * 2 * MB)  # the top is not touched
    cut = root / f"{INDEX}.123.456"  # a save cut short, long ago: removed
    cut.write_text("{")
    os.utime(cut, (now - DAY, now - DAY))
    limits = Limits(days=30, mb=1)
    assert apply(tmp_path, limits, now=now).removed == []  # believed 1000 bytes
    assert not cut.exists()
    assert apply(tmp_path, limits, now=now, full=True).removed == ["a-old"]
