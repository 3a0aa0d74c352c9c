"""How long the kept files of sessions stay: ``$SANDGATE_HOME/sessions/<id>/``.

Two limits, both from the environment: ``SANDGATE_KEEP_DAYS`` (default 30: sessions older than
that go) and ``SANDGATE_KEEP_MB`` (default 2048: the oldest go until the rest fit); 0 turns a
limit off. Applied during every session, while its command runs (session/runner.py), and by
``sandgate cleanup --sessions``. A session that is running is never removed, whatever its age
or size: its runner is alive (cleanup's owner record ``mount-<id>``) or its disk is still mounted.

``plan`` is pure (what to remove, given the sessions and the limits); ``scan`` reads the
folder; ``apply`` removes. A run does not walk every kept folder for its size: finished folders'
sizes are recorded once in ``sessions/.sizes.json`` (``SizeIndex``), so a run's retention costs
a listing and a stat per kept session, plus a walk of what is new (issue 13). ``cleanup
--sessions`` walks everything and rewrites that index.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from sandgate import cleanup
from sandgate.errors import SandgateError
from sandgate.sandbox.workspace import SESSIONS_ROOT, our_mounts

DEFAULT_DAYS = 30.0
DEFAULT_MB = 2048.0
DAY = 86400.0


@dataclass(frozen=True)
class Limits:
    """How long and how much of the kept sessions stay."""

    days: float = DEFAULT_DAYS  # 0: no age limit
    mb: float = DEFAULT_MB  # 0: no size limit

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Limits:
        env = dict(os.environ) if env is None else env
        return cls(
            _number(env, "SANDGATE_KEEP_DAYS", DEFAULT_DAYS),
            _number(env, "SANDGATE_KEEP_MB", DEFAULT_MB),
        )


def _number(env: dict[str, str], key: str, default: float) -> float:
    raw = env.get(key, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value < 0:
        raise SandgateError(
            f"{key}={raw!r} is not a number of {'days' if 'DAYS' in key else 'MB'}",
            f"set {key} to a number ≥ 0 (0: no limit), or unset it for {default:g}",
        )
    return value


@dataclass(frozen=True)
class Kept:
    """One session's kept folder, as ``plan`` sees it."""

    name: str
    mtime: float
    size: int  # bytes
    running: bool


@dataclass
class RetentionResult:
    """What a retention pass removed, and what it kept because it runs."""

    removed: list[str] = field(default_factory=list)
    freed: int = 0  # bytes
    kept_running: list[str] = field(default_factory=list)  # over a limit, but running


def plan(
    sessions: Iterable[Kept], limits: Limits, now: float
) -> tuple[list[Kept], list[Kept]]:
    """(to remove, oldest first; running sessions a limit would have removed). Age first,
    then the oldest of the rest until the total fits ``limits.mb``; running ones count
    toward the total but are never removed."""
    ordered = sorted(sessions, key=lambda k: (k.mtime, k.name))
    remove: list[Kept] = []
    spared: list[Kept] = []
    rest: list[Kept] = []
    for k in ordered:
        if limits.days and now - k.mtime > limits.days * DAY:
            (spared if k.running else remove).append(k)
        else:
            rest.append(k)
    if limits.mb:
        budget = limits.mb * 1024 * 1024
        total = sum(k.size for k in rest) + sum(k.size for k in spared)
        for k in rest:
            if total <= budget:
                break
            if k.running:
                spared.append(k)
                continue
            remove.append(k)
            total -= k.size
    return sorted(remove, key=lambda k: (k.mtime, k.name)), spared


def apply(
    home: Path,
    limits: Limits | None = None,
    keep: Iterable[str] = (),
    now: float | None = None,
    full: bool = False,
) -> RetentionResult:
    """Remove the kept folders under ``home``/sessions that ``limits`` say go; ``keep``: names
    never to remove (the session that just ended). ``full``: measure every folder by walking
    it (``sandgate cleanup --sessions``) instead of trusting the size index, and rewrite it."""
    limits = Limits.from_env() if limits is None else limits
    root = home / "sessions"
    result = RetentionResult()
    if not root.is_dir():
        return result
    now = time.time() if now is None else now
    found, sizes = scan(root, keep, now, full)
    remove, spared = plan(found, limits, now)
    if any(_size(root / k.name) != k.size for k in remove if k.name in sizes.trusted):
        # A victim's recorded size is not what its files hold: the index is stale. Decide
        # again from a full walk (the victims are walked anyway: rmtree reads their trees).
        found, sizes = scan(root, keep, now, full=True)
        remove, spared = plan(found, limits, now)
    for k in remove:
        shutil.rmtree(root / k.name, ignore_errors=True)
        if not (root / k.name).exists():
            result.removed.append(k.name)
            result.freed += k.size
            sizes.forget(k.name)
    sizes.save()
    result.kept_running = [k.name for k in spared]
    return result


def scan(
    root: Path, keep: Iterable[str], now: float, full: bool = False
) -> tuple[list[Kept], SizeIndex]:
    """Every kept folder under ``root`` as ``plan`` sees it, sorted by name, and the size index
    brought up to date. Age and "running" are always read fresh; a size comes from the index
    only for a finished folder whose own inode, mtime and ctime are what was recorded, and that
    settled ``SETTLE`` seconds before; every other folder is walked (``full``: all of them)."""
    protect = set(keep)
    sizes = SizeIndex.load(root) if not full else SizeIndex(root, {}, dirty=True)
    entries: list[tuple[str, os.stat_result]] = []
    with os.scandir(root) as listing:
        for entry in listing:
            if not entry.is_dir(follow_symlinks=False):
                if entry.name.startswith(f"{INDEX}.") and _stale(entry, now):
                    Path(entry.path).unlink(missing_ok=True)  # a save that was cut short
                continue
            try:
                entries.append((entry.name, entry.stat(follow_symlinks=False)))
            except OSError:
                continue  # removed meanwhile
    # Listed after the folders: a session owns its mount record before its folder exists,
    # so a folder seen above whose record is missing here has ended (cleanup.owned's answer).
    mounts = our_mounts(Path("/"))  # the mount table read once for both questions
    running = protect | _owned_mounts()
    running |= {m.name for m in mounts if SESSIONS_ROOT in m.parents}
    for m in mounts:  # a session disk mounted under its kept folder: in use
        if root in m.parents:
            running.add(m.relative_to(root).parts[0])
    found: list[Kept] = []
    seen: set[str] = set()
    for name, st in sorted(entries, key=lambda e: e[0]):
        seen.add(name)
        is_running = name in running
        key = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
        recorded = sizes.entries.get(name)
        settled = not is_running and now - st.st_mtime > SETTLE
        if settled and recorded is not None and tuple(recorded[:3]) == key:
            size = recorded[3]
            sizes.trusted.add(name)
        else:
            size = _size(root / name)
            if settled:
                sizes.record(name, key, size)
            else:
                sizes.forget(name)
        found.append(Kept(name, st.st_mtime, size, is_running))
    for gone in set(sizes.entries) - seen:
        sizes.forget(gone)
    return found, sizes


# Seconds a finished folder is left unchanged before its size is recorded. Timestamps are
# coarse (a jiffy, ≤ 10 ms): a change within the same tick as the last one before a recording
# would keep the key; seconds later it cannot. It was 300 s, and every session of a suite or
# bench then walked every folder of the last five minutes: 4-6 ms of CPU a run at 50 of them,
# on a thread that, outliving a short command, held the GIL from the teardown (issue 13).
SETTLE = 5.0
TMP_STALE = 300.0  # seconds after which a temporary index file is a save that was cut short
INDEX = ".sizes.json"  # in the sessions folder: a cache, rebuilt from the folders when wrong
_INDEX_VERSION = 1


@dataclass
class SizeIndex:
    """The sizes of finished sessions' folders, recorded once, so a run does not walk every
    kept session (issue 13: 540 kept sessions cost 20–25 ms CPU per run). Keyed by each
    folder's (inode, mtime_ns, ctime_ns): a folder replaced, or with an entry added, removed
    or renamed at its top, is walked again. Not seen: a file deeper down rewritten in place
    after its session ended (sandgate does not do that): retention then keeps more than the
    full walk would, never less, until ``cleanup --sessions``; a victim's recorded size is
    checked before anything is removed. A missing, unreadable or foreign file is an empty
    index."""

    root: Path
    entries: dict[str, list[int]]  # name -> [ino, mtime_ns, ctime_ns, size]
    dirty: bool = False
    trusted: set[str] = field(default_factory=set)  # sizes taken from here in this scan

    @classmethod
    def load(cls, root: Path) -> SizeIndex:
        try:
            data = json.loads((root / INDEX).read_bytes())
            raw = data["sessions"] if data.get("version") == _INDEX_VERSION else {}
            entries = {
                str(name): [int(x) for x in row]
                for name, row in raw.items()
                if isinstance(row, list) and len(row) == 4
            }
        except (OSError, ValueError, TypeError, AttributeError, KeyError):
            return cls(root, {}, dirty=True)
        return cls(root, entries)

    def record(self, name: str, key: tuple[int, int, int], size: int) -> None:
        self.entries[name] = [*key, size]
        self.dirty = True

    def forget(self, name: str) -> None:
        if self.entries.pop(name, None) is not None:
            self.dirty = True

    def save(self) -> None:
        """Written whole under a temporary name and renamed: a reader sees the old or the new
        index, never half of one; two runs saving at once lose at most a record (walked again)."""
        if not self.dirty:
            return
        tmp = self.root / f"{INDEX}.{os.getpid()}.{threading.get_ident()}"
        data = json.dumps({"version": _INDEX_VERSION, "sessions": self.entries}).encode()
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, self.root / INDEX)
        except OSError:
            tmp.unlink(missing_ok=True)  # a cache we cannot write: walked again next time
            return
        self.dirty = False


def _stale(entry: os.DirEntry[str], now: float) -> bool:
    try:
        return now - entry.stat(follow_symlinks=False).st_mtime > TMP_STALE
    except OSError:
        return False


def _owned_mounts() -> set[str]:
    """Sessions whose runner is alive: its ``mount-<id>`` owner record names a live process."""
    try:
        names = [n for n in os.listdir(cleanup.OWNERS) if n.startswith("mount-")]
    except OSError:
        return set()
    return {n.removeprefix("mount-") for n in names if cleanup.owned(n)}


def _size(path: Path) -> int:
    total = 0
    for folder, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                continue
    return total
