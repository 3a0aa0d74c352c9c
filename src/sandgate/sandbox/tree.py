"""Copying directory trees into a sandbox and telling afterwards what changed in them.

Two jobs, both about files rather than processes:

* ``copy_tree`` makes a session's fresh work dir (from ``--fixtures``) and fresh agent home
  (from ``--home-template``). A symbolic link is the dangerous part: report 000's pip installs
  escaped into the framework's own Python through a link in the agent's home that pointed back
  into a shared directory. Here a link that stays inside the source tree is recreated as a
  relative link inside the copy; a link that points outside is refused (or, when asked, what
  it points to is copied in). Nothing in the copy ever leads back to the source.
* ``manifest`` and ``compare`` tell which files a session created, changed or deleted.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sandgate.errors import SandboxError

HASH_CHUNK = 1 << 20


@dataclass(frozen=True)
class Entry:
    """What one path was: its kind and enough to tell a change (content hash for files)."""

    kind: str  # "file", "dir", "link", "other"
    size: int = 0
    sha256: str | None = None
    target: str | None = None  # a link's target


@dataclass(frozen=True)
class Change:
    """One path that differs between two snapshots of a tree."""

    path: str  # relative to the tree's root
    change: str  # "new", "changed", "deleted"
    entry: Entry  # the new entry (the old one for "deleted")


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def walk(root: Path) -> Iterator[tuple[str, os.stat_result]]:
    """Every path under ``root`` (not ``root`` itself), without following links."""
    stack = [root]
    while stack:
        current = stack.pop()
        try:
            entries = sorted(os.scandir(current), key=lambda e: e.name)
        except OSError:
            continue
        for item in entries:
            try:
                st = item.stat(follow_symlinks=False)
            except OSError:
                continue
            yield os.path.relpath(item.path, root), st
            if stat.S_ISDIR(st.st_mode):
                stack.append(Path(item.path))


def manifest(root: Path, skip: frozenset[str] = frozenset()) -> dict[str, Entry]:
    out: dict[str, Entry] = {}
    if not root.is_dir():
        return out
    for rel, st in walk(root):
        if rel in skip:
            continue
        out[rel] = _entry(root / rel, st)
    return out


def _entry(path: Path, st: os.stat_result) -> Entry:
    if stat.S_ISLNK(st.st_mode):
        return Entry("link", target=os.readlink(path))
    if stat.S_ISDIR(st.st_mode):
        return Entry("dir")
    if stat.S_ISREG(st.st_mode):
        try:
            return Entry("file", st.st_size, sha256_of(path))
        except OSError:
            return Entry("file", st.st_size)
    return Entry("other", st.st_size)


def compare(before: dict[str, Entry], after: dict[str, Entry]) -> list[Change]:
    """Files and links created, changed or deleted (directories only when new and empty-ish
    matter less: they are listed as new so an agent's mkdir shows, but never as changed)."""
    changes: list[Change] = []
    for rel, entry in after.items():
        old = before.get(rel)
        if old is None:
            changes.append(Change(rel, "new", entry))
        elif old != entry and not (old.kind == entry.kind == "dir"):
            changes.append(Change(rel, "changed", entry))
    for rel, entry in before.items():
        if rel not in after:
            changes.append(Change(rel, "deleted", entry))
    return sorted(changes, key=lambda c: c.path)


def copy_tree(source: Path, dest: Path, uid: int, *, copy_links: bool = False) -> list[str]:
    """Copy ``source`` into the existing directory ``dest``, owned by ``uid`` (what is already
    there stays, unless ``source`` has an entry of the same name: layers, later wins).

    Returns notes on what was not copied as-is (links whose target was copied in, special
    files skipped). Raises SandboxError for a link that points outside ``source`` unless
    ``copy_links``; nothing is ever a link back into ``source``.
    """
    root = Path(os.path.realpath(source))
    if not root.is_dir():
        raise SandboxError(f"{source} is not a directory", "give a directory to copy from")
    notes: list[str] = []
    _copy_dir(root, root, dest, uid, copy_links, notes, depth=0)
    return notes


def _copy_dir(
    root: Path, src: Path, dst: Path, uid: int, copy_links: bool, notes: list[str], depth: int
) -> None:
    if depth > 64:
        raise SandboxError(f"{src}: directories nested too deep (a link loop?)")
    for item in sorted(os.scandir(src), key=lambda e: e.name):
        path, target = Path(item.path), dst / item.name
        st = item.stat(follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            _copy_link(root, path, target, uid, copy_links, notes, depth)
        elif stat.S_ISDIR(st.st_mode):
            target.mkdir(mode=_safe_mode(st.st_mode) | 0o700, exist_ok=True)
            _copy_dir(root, path, target, uid, copy_links, notes, depth + 1)
            os.chown(target, uid, uid)
        elif stat.S_ISREG(st.st_mode):
            _copy_file(path, target, uid, st)
        else:
            notes.append(f"{path.relative_to(root)}: special file skipped")


def _copy_link(
    root: Path,
    link: Path,
    target: Path,
    uid: int,
    copy_links: bool,
    notes: list[str],
    depth: int,
) -> None:
    rel = link.relative_to(root)
    pointed = Path(os.path.realpath(link))
    if pointed == root or root in pointed.parents:
        # Inside the tree: the same place in the copy, written relative so it stays there.
        inside = pointed.relative_to(root)
        relative = os.path.relpath(inside, rel.parent)
        _clear(target)
        os.symlink(relative, target)
        os.lchown(target, uid, uid)
        return
    if not copy_links:
        raise SandboxError(
            f"{link} is a link to {os.readlink(link)}, outside {root}: a sandbox must not "
            "reach back into a shared directory through it",
            "remove the link, or pass --copy-links to copy what it points to",
        )
    if not pointed.exists():
        notes.append(f"{rel}: link to {os.readlink(link)} (outside, missing) skipped")
        return
    st = os.stat(pointed)
    if stat.S_ISDIR(st.st_mode):
        target.mkdir(mode=0o700)
        _copy_dir(pointed, pointed, target, uid, True, notes, depth + 1)
        os.chown(target, uid, uid)
    elif stat.S_ISREG(st.st_mode):
        _copy_file(pointed, target, uid, st)
    else:
        notes.append(f"{rel}: link to a special file skipped")
        return
    notes.append(f"{rel}: link to {os.readlink(link)} (outside) replaced by a copy")


def _clear(target: Path) -> None:
    """Make room for a later layer's entry (a home made of several templates)."""
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.is_dir():
        shutil.rmtree(target)


def _copy_file(src: Path, dst: Path, uid: int, st: os.stat_result) -> None:
    _clear(dst)
    with open(src, "rb") as fin, open(dst, "xb") as fout:
        shutil.copyfileobj(fin, fout, HASH_CHUNK)
    os.chmod(dst, _safe_mode(st.st_mode))
    os.chown(dst, uid, uid)


def _safe_mode(mode: int) -> int:
    """Permission bits without setuid/setgid/sticky, and always readable/writable by the owner."""
    return (stat.S_IMODE(mode) & 0o777) | 0o600


def mirror_changes(changes: list[Change], source: Path, dest: Path) -> None:
    """Apply ``changes`` (computed on ``source``) to ``dest``: the --keep-writes write-back."""
    for c in changes:
        src, dst = source / c.path, dest / c.path
        if c.change == "deleted":
            if dst.is_symlink() or dst.is_file():
                dst.unlink()
            elif dst.is_dir():
                shutil.rmtree(dst, ignore_errors=True)
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        if c.entry.kind == "dir":
            dst.mkdir(exist_ok=True)
        elif c.entry.kind == "link" and c.entry.target is not None:
            if dst.is_symlink() or dst.exists():
                dst.unlink()
            os.symlink(c.entry.target, dst)
        elif c.entry.kind == "file":
            if dst.is_symlink():
                dst.unlink()
            shutil.copyfile(src, dst, follow_symlinks=False)
