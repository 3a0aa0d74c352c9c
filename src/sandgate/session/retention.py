"""How long the kept files of sessions stay: ``$SANDGATE_HOME/sessions/<id>/``.

Two limits, both from the environment: ``SANDGATE_KEEP_DAYS`` (default 30: sessions older than
that go) and ``SANDGATE_KEEP_MB`` (default 2048: the oldest go until the rest fit); 0 turns a
limit off. Applied during every session, while its command runs (session/runner.py), and by
``sandgate cleanup --sessions``. A session that is running is never removed, whatever its age
or size: its runner is alive (cleanup's owner record ``mount-<id>``) or its disk is still mounted.

``plan`` is pure (what to remove, given the sessions and the limits); ``apply`` reads the
folder and removes.
"""

from __future__ import annotations

import math
import os
import shutil
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
    home: Path, limits: Limits | None = None, keep: Iterable[str] = (), now: float | None = None
) -> RetentionResult:
    """Remove the kept folders under ``home``/sessions that ``limits`` say go; ``keep``: names
    never to remove (the session that just ended)."""
    limits = Limits.from_env() if limits is None else limits
    root = home / "sessions"
    result = RetentionResult()
    if not root.is_dir():
        return result
    protect = set(keep)
    mounted = {p.name for p in our_mounts(SESSIONS_ROOT)}
    inside = our_mounts(root)  # a session disk mounted under its kept folder: in use
    found: list[Kept] = []
    for entry in root.iterdir():
        if entry.is_symlink() or not entry.is_dir():
            continue
        running = (
            entry.name in protect
            or entry.name in mounted
            or cleanup.owned(f"mount-{entry.name}")
            or any(m == entry or entry in m.parents for m in inside)
        )
        found.append(Kept(entry.name, entry.lstat().st_mtime, _size(entry), running))
    remove, spared = plan(found, limits, time.time() if now is None else now)
    for k in remove:
        shutil.rmtree(root / k.name, ignore_errors=True)
        if not (root / k.name).exists():
            result.removed.append(k.name)
            result.freed += k.size
    result.kept_running = [k.name for k in spared]
    return result


def _size(path: Path) -> int:
    total = 0
    for folder, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                continue
    return total
