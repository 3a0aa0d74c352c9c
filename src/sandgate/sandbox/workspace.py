"""A session's files: one bounded tmpfs holding every place the agent may write.

    /var/tmp/sandgate/<session>/      tmpfs, size-limited (--disk): the session's whole disk
        work/    -> /work             fresh, copied from --fixtures (unless --workdir is given)
        home/    -> /home/agent       fresh, copied from --home-template
        tmp/     -> /tmp              \
        vartmp/  -> /var/tmp           } scratch areas
        shm/     -> /dev/shm           }
        run/     -> /run              /
        etc/, files/                  read-only files the gateway and the runner hand in

The system (/usr, /etc, /opt, /var) is bound read-only and the agent runs as an uid that owns
nothing on the host, so these areas are the only writable places outside /work. That is the
"overlay or an equivalent" of issue 5: after the session every write to them (home: compared
with what was copied in) is a *stray write*, listed with size and hash and moved to the
session's quarantine, and the tmpfs is unmounted. One session filling its disk fills only its
own tmpfs.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sandgate import TYPE_CHECKING
from sandgate.errors import SandboxError
from sandgate.sandbox.tree import (
    Change,
    Entry,
    compare,
    copy_tree,
    manifest,
    mirror_changes,
)

if TYPE_CHECKING:
    from typing import Any

MiB = 1 << 20
DEFAULT_DISK = 1024 * MiB
DEFAULT_QUARANTINE = 256 * MiB
DEFAULT_KEEP_WORK = 256 * MiB
MOUNT_SOURCE = "sandgate"
SESSIONS_ROOT = Path(os.environ.get("SANDGATE_SESSIONS", "/var/tmp/sandgate"))
# Writable areas outside /work: host folder name -> path inside the sandbox.
SCRATCH = {"tmp": "/tmp", "vartmp": "/var/tmp", "shm": "/dev/shm", "run": "/run"}
AREAS = {"home": "/home/agent", **SCRATCH}

MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND = 2, 4, 8, 32, 4096
MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass
class Stray:
    """One write outside the work dir."""

    path: str  # as the sandbox saw it
    change: str  # new, changed, deleted
    kind: str  # file, dir, link, other
    size: int = 0
    sha256: str | None = None
    target: str | None = None  # a link's target
    kept: str | None = None  # where the quarantine holds it (relative to the session folder)
    framework: bool = False  # in the agent framework's own state folder


@dataclass
class WriteFindings:
    """What a session wrote outside its workspace, and where it was kept."""

    strays: list[Stray] = field(default_factory=list)
    stray_bytes: int = 0
    quarantine: str | None = None
    not_kept: int = 0  # strays the quarantine had no room for
    disk_full: bool = False
    disk_limit: int = 0
    disk_used: int = 0
    kept_writes: str | None = None  # --keep-writes: where home's changes were written back
    work_kept: str | None = None
    notes: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class WorkspaceSpec:
    """What a session's files are made from, and their limits."""

    fixtures: Path | None = None
    home_template: Path | None = None
    home_layers: tuple[Path, ...] = ()  # copied into the home first (an agent's own config)
    copy_links: bool = False
    disk: int = DEFAULT_DISK
    quarantine: int = DEFAULT_QUARANTINE
    keep_writes: bool = False
    keep_work: int = DEFAULT_KEEP_WORK
    # Where the agent framework keeps its own state (sandbox paths): its writes there are
    # listed as the framework's, apart from what the agent's commands wrote.
    framework_paths: tuple[str, ...] = ()


def mount_tmpfs(target: Path, size: int) -> None:
    opts = f"size={size},mode=0711".encode()
    if (
        _libc.mount(
            MOUNT_SOURCE.encode(), str(target).encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts
        )
        != 0
    ):
        err = ctypes.get_errno()
        raise SandboxError(f"cannot mount the session's tmpfs on {target}: {os.strerror(err)}")


def bind_noexec(target: Path) -> None:
    """``target`` (a folder of the session's disk) as a noexec mount of its own (issue 14):
    nothing the agent writes there runs as a program or maps as a library. bwrap's bind of it
    keeps the flag (a bind mount has its source mount's flags). The disk's other folders
    (the runner's read-only files, e.g. the privilege stubs) keep exec; unmounting the disk
    (MNT_DETACH) takes these with it."""
    path = str(target).encode()
    if _libc.mount(path, path, None, MS_BIND, None) != 0 or (
        _libc.mount(
            None, path, None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV | MS_NOEXEC, None
        )
        != 0
    ):
        err = ctypes.get_errno()
        raise SandboxError(f"cannot make {target} noexec: {os.strerror(err)}")


def unmount(target: Path) -> None:
    _libc.umount2(str(target).encode(), MNT_DETACH)


def our_mounts(root: Path) -> list[Path]:
    """tmpfs mounts of ours under ``root`` (from the mount table; for cleanup after a crash)."""
    found: list[Path] = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        after = line.split(" - ", 1)[1].split()
        mountpoint = Path(fields[4].replace("\\040", " "))
        if after[:2] == ["tmpfs", MOUNT_SOURCE] and root in mountpoint.parents:
            found.append(mountpoint)
    return found


@dataclass
class Workspace:
    """A session's folders and mounts, made by ``create`` and undone by ``destroy``."""

    dir: Path
    uid: int
    spec: WorkspaceSpec
    mounted: bool = False
    noexec_binds: list[Path] = field(default_factory=list)  # folders noexec bound
    workdir: Path = field(default_factory=Path)
    own_workdir: bool = True
    home_before: dict[str, Entry] = field(default_factory=dict)
    work_before: dict[str, Entry] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def home(self) -> Path:
        return self.dir / "home"

    def scratch(self) -> dict[str, Path]:
        return {inside: self.dir / name for name, inside in SCRATCH.items()}

    def create(self, workdir: Path | None) -> None:
        """Mount the session's disk and fill it: work dir, home, scratch areas."""
        self.dir.mkdir(mode=0o711)
        mount_tmpfs(self.dir, self.spec.disk)
        self.mounted = True
        try:
            self._populate(workdir)
        except OSError as exc:
            if exc.errno == 28:  # ENOSPC
                raise SandboxError(
                    f"the fixtures and home do not fit the session's disk "
                    f"({self.spec.disk // MiB} MiB)",
                    "raise --disk or copy less in",
                ) from exc
            raise

    def noexec(self) -> None:
        """No program or library from anywhere the agent can write (a given --workdir keeps
        its own mount's flags: it is not on the session's disk)."""
        if not self.mounted:
            return
        own = [self.workdir] if self.own_workdir else []
        for folder in (*own, self.home, *self.scratch().values()):
            bind_noexec(folder)
            self.noexec_binds.append(folder)

    def exec_again(self) -> None:
        """Undo ``noexec`` (made ahead of the gateway's answer, for a profile that opts out)."""
        while self.noexec_binds:
            unmount(self.noexec_binds.pop())

    def _populate(self, workdir: Path | None) -> None:
        (self.dir / "etc").mkdir(mode=0o755)
        self.home.mkdir(mode=0o700)
        os.chown(self.home, self.uid, self.uid)
        layers = [*self.spec.home_layers]
        if self.spec.home_template is not None:
            layers.append(self.spec.home_template)
        for layer in layers:
            self.notes += copy_tree(layer, self.home, self.uid, copy_links=self.spec.copy_links)
        for name in SCRATCH:
            path = self.dir / name
            path.mkdir(mode=0o700)
            os.chown(path, self.uid, self.uid)
        if workdir is None:
            self.workdir = self.dir / "work"
            self.workdir.mkdir(mode=0o700)
            os.chown(self.workdir, self.uid, self.uid)
            if self.spec.fixtures is not None:
                self.notes += copy_tree(
                    self.spec.fixtures, self.workdir, self.uid, copy_links=self.spec.copy_links
                )
        else:
            self.workdir, self.own_workdir = workdir.resolve(), False
        self.home_before = manifest(self.home)
        if self.own_workdir:
            self.work_before = manifest(self.workdir)

    def changes(self, mountpoints: set[str]) -> list[tuple[str, Path, Change]]:
        """Every write outside the work dir: (area in the sandbox, its host folder, change).

        ``mountpoints`` are sandbox paths bwrap created to bind files onto (not the agent's)."""
        out: list[tuple[str, Path, Change]] = []
        home_changes = compare(self.home_before, manifest(self.home))
        out += [(AREAS["home"], self.home, c) for c in home_changes]
        for name, inside in SCRATCH.items():
            for c in compare({}, manifest(self.dir / name)):
                sandbox_path = f"{inside}/{c.path}"
                if sandbox_path in mountpoints or _is_bind_parent(sandbox_path, mountpoints, c):
                    continue
                out.append((inside, self.dir / name, c))
        return out

    def work_after(self) -> dict[str, Entry] | None:
        """The fresh work dir as the session left it (None for a --workdir of the user's: it
        has no "before", and hashing someone's whole tree is not ours to do)."""
        return manifest(self.workdir) if self.own_workdir else None

    def collect(
        self,
        keep_dir: Path,
        changes: list[tuple[str, Path, Change]],
        work_after: dict[str, Entry] | None,
    ) -> WriteFindings:
        """After the session: list every stray write (``changes``), quarantine it, keep the
        work dir (``work_after``: its manifest, for its size)."""
        out = WriteFindings(notes=list(self.notes), disk_limit=self.spec.disk)
        with contextlib.suppress(OSError):
            st = os.statvfs(self.dir)
            out.disk_used = (st.f_blocks - st.f_bfree) * st.f_frsize
            out.disk_full = st.f_bavail * st.f_frsize < MiB
        home_changes = [c for inside, _, c in changes if inside == AREAS["home"]]
        quarantine = keep_dir / "quarantine"
        room = self.spec.quarantine
        for inside, root, c in changes:
            stray = Stray(
                path=f"{inside}/{c.path}",
                change=c.change,
                kind=c.entry.kind,
                size=c.entry.size,
                sha256=c.entry.sha256,
                target=c.entry.target,
            )
            stray.framework = any(
                stray.path == p or stray.path.startswith(p.rstrip("/") + "/")
                for p in self.spec.framework_paths
            )
            if c.change != "deleted" and c.entry.kind == "file":
                out.stray_bytes += c.entry.size
                if c.entry.size <= room:
                    rel = Path("quarantine") / stray.path.lstrip("/")
                    with contextlib.suppress(OSError):
                        (keep_dir / rel).parent.mkdir(parents=True, exist_ok=True)
                        shutil.copyfile(root / c.path, keep_dir / rel, follow_symlinks=False)
                        os.chmod(keep_dir / rel, 0o600)
                        stray.kept = str(rel)
                        room -= c.entry.size
                if stray.kept is None:
                    out.not_kept += 1
            out.strays.append(stray)
        if quarantine.is_dir():
            out.quarantine = str(quarantine)
        if self.spec.keep_writes and self.spec.home_template is not None and home_changes:
            mirror_changes(home_changes, self.home, self.spec.home_template)
            out.kept_writes = str(self.spec.home_template)
        if work_after is not None:
            size = sum(e.size for e in work_after.values() if e.kind == "file")
            out.work_kept = self._keep_work(keep_dir, out, size)
        return out

    def _keep_work(self, keep_dir: Path, out: WriteFindings, size: int) -> str | None:
        if size > self.spec.keep_work:
            out.notes.append(
                f"the work dir ({size // MiB} MiB) is larger than --keep-work; not kept"
            )
            return None
        target = keep_dir / "work"
        try:
            shutil.copytree(self.workdir, target, symlinks=True)
        except (OSError, shutil.Error) as exc:
            out.notes.append(f"the work dir could not be kept: {exc}")
            return None
        return str(target)

    def destroy(self) -> None:
        if self.mounted:
            unmount(self.dir)
            self.mounted = False
        if self.dir == Path():
            return
        # The disk's mount point is empty once the disk is unmounted: one rmdir, where rmtree
        # added a stat, an open and a listing (~0.1-0.3 ms on this ext4; issue 13). Anything
        # else (a disk never mounted, an unmount that failed) is removed as before.
        try:
            os.rmdir(self.dir)
        except FileNotFoundError:
            return
        except OSError:
            shutil.rmtree(self.dir, ignore_errors=True)


def stray_files(changes: list[tuple[str, Path, Change]]) -> list[tuple[str, Path, Entry]]:
    """Stray files as (sandbox path, host path, entry), for the claim check."""
    return [
        (f"{inside}/{c.path}", root / c.path, c.entry)
        for inside, root, c in changes
        if c.change != "deleted"
    ]


def _is_bind_parent(path: str, mountpoints: set[str], c: Change) -> bool:
    """A directory bwrap made only to hold a mount point (e.g. /run/sandgate for a file)."""
    return c.entry.kind == "dir" and any(m.startswith(path + "/") for m in mountpoints)
