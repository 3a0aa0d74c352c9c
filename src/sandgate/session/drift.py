"""Drift: what an agent might change to get online, snapshotted before and after a session.

Report 000 snapshotted the firewall, the resolver, pip, apt, git and proxy settings around each
session and diffed them by hand. Here a snapshot is a dict of label -> text (``None`` when the
file is absent); ``diff`` compares two. The gateway's part comes from its ``snapshot`` control
op (its ruleset as canonical lines, its resolver settings, forwarding); the sandbox's part from
the files the sandbox saw: its resolv.conf and hosts, its home's client configuration, and the
system's (read-only to the agent, so a change there was made by someone else, which is also
worth knowing). Pure apart from reading files: the runner does the I/O around it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sandgate import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

MAX_TEXT = 64 << 10

# Client configuration in an agent's home that can route, proxy or redirect its traffic.
HOME_FILES = (
    ".gitconfig",
    ".config/git/config",
    ".config/pip/pip.conf",
    ".pip/pip.conf",
    ".pydistutils.cfg",
    ".condarc",
    ".npmrc",
    ".yarnrc",
    ".curlrc",
    ".wgetrc",
    ".netrc",
    ".ssh/config",
    ".docker/config.json",
    ".bashrc",
    ".profile",
    ".bash_profile",
    ".config/uv/uv.toml",
)
# The system's, as the sandbox sees it (bound read-only from the host).
SYSTEM_FILES = (
    "/etc/pip.conf",
    "/etc/gitconfig",
    "/etc/environment",
    "/etc/wgetrc",
    "/etc/apt/apt.conf",
    "/etc/apt/sources.list",
    "/etc/nsswitch.conf",
)
SYSTEM_DIRS = ("/etc/apt/apt.conf.d", "/etc/apt/sources.list.d", "/etc/profile.d")


@dataclass
class DriftItem:
    """One thing that changed during a session, with its diff."""

    what: str  # the label: "gateway ruleset", "/home/agent/.gitconfig", ...
    change: str  # "added", "removed", "changed"
    diff: str  # unified diff (may be cut short)
    gateway: bool = False  # part of the gateway (restored by the runner when changed)


@dataclass
class Drift:
    """Everything that changed during a session, and whether the gateway was restored."""

    items: list[DriftItem] = field(default_factory=list)
    gateway_changed: bool = False
    gateway_restored: bool | None = None  # None: nothing to restore
    gateway_problems: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def read_text(path: Path | str) -> str | None:
    """The file's first MAX_TEXT bytes as text; None when it is absent, a note when it cannot
    be read (a directory in its place, say). os calls, not pathlib's: a snapshot reads ~40
    paths twice a session, and pathlib's objects were two thirds of its ~1.1 ms (issue 13)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        return f"<unreadable: {exc.strerror}>"
    try:
        chunks: list[bytes] = []
        left = MAX_TEXT
        while left > 0 and (chunk := os.read(fd, left)):
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:  # EISDIR comes at the read
        return f"<unreadable: {exc.strerror}>"
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace")


def _files_in(folder: str) -> list[str]:
    """The names of the files (symlinks to files too, hidden ones too) in ``folder``, sorted,
    as ``sorted(Path(folder).glob("*"))`` with ``is_file()`` lists them."""
    try:
        with os.scandir(folder) as entries:
            return sorted(e.name for e in entries if e.is_file())
    except OSError:
        return []


def sandbox_snapshot(home: Path, etc: Path, system_root: Path = Path("/")) -> dict[str, str | None]:
    """The sandbox's view: its resolver and hosts files, its home's and the system's configs."""
    snap: dict[str, str | None] = {
        "/etc/resolv.conf": read_text(f"{etc}/resolv.conf"),
        "/etc/hosts": read_text(f"{etc}/hosts"),
    }
    for rel in HOME_FILES:
        snap[f"/home/agent/{rel}"] = read_text(f"{home}/{rel}")
    root = str(system_root).rstrip("/")
    for path in SYSTEM_FILES:
        snap[path] = read_text(root + path)
    for folder in SYSTEM_DIRS:
        for name in _files_in(root + folder):
            snap[f"{folder}/{name}"] = read_text(f"{root}{folder}/{name}")
    return snap


def gateway_snapshot(raw: dict[str, Any]) -> dict[str, str | None]:
    """The gateway's ``snapshot`` answer as labelled texts."""
    settings = {k: raw.get(k) for k in ("resolver", "proxy", "forwarding")}
    return {
        "gateway ruleset": "\n".join(raw.get("ruleset", [])) + "\n",
        "gateway settings": json.dumps(settings, indent=1, sort_keys=True) + "\n",
    }


def diff(before: dict[str, str | None], after: dict[str, str | None]) -> list[DriftItem]:
    items: list[DriftItem] = []
    for label in _labels(before, after):
        old, new = before.get(label), after.get(label)
        if old == new:
            continue
        change = "added" if old is None else "removed" if new is None else "changed"
        import difflib  # only where something changed: most sessions change nothing

        text = "".join(
            difflib.unified_diff(
                (old or "").splitlines(keepends=True),
                (new or "").splitlines(keepends=True),
                f"{label} (before)",
                f"{label} (after)",
                n=1,
            )
        )
        items.append(DriftItem(label, change, text[:8000], gateway=label.startswith("gateway ")))
    return items


def _labels(*snaps: dict[str, str | None]) -> Iterable[str]:
    seen: dict[str, None] = {}
    for snap in snaps:
        seen.update(dict.fromkeys(snap))
    return seen
