"""Per-session limits through cgroups: v2 where the host has a unified hierarchy, else v1.

One cgroup per session, ``sandgate-<session>`` (in every v1 controller's hierarchy, or once in
v2), holding a pids limit, a memory limit with swap off for it, a CPU quota (``--cpus``) and an
I/O weight where the kernel offers one. The sandbox's first process joins it before it execs
(enter.py, between fork and exec of bwrap; ``prefix_argv``, a root shell writing its own pid into
``cgroup.procs`` and raising its OOM score, for a VM's QEMU), so nothing the sandbox starts is
ever outside. The gateway daemon gets a
cgroup of its own (``sandgate-gw-<instance>``) with reserved memory and an OOM score of -900.

A limit that cannot be applied (controller absent, no delegation) is a ``LimitsError`` naming
what is missing: never a silent unlimited run.

Measured 2026-12-01 on this machine (v1, kernel 6.18, 2 shared cores): creating, limiting,
reading and removing one session's cgroups ~4.5 ms; the pre-exec step (a shell joining four
hierarchies) ~4.7 ms over a bare exec: ~9 ms added to a session's start. Later the same day, at
a load of 3-6: joining waits 5-17 ms (the first hierarchy's write waits out an RCU grace
period; the others mostly ride on it), no CPU: the runner makes the cgroup (``make``) before
the gateway answers and the sandbox's first process joins it meanwhile; ``apply`` sets the
limits once they are known, before any command runs. A 3,000-process spawn
grew the host's process count by 965-970 under the default 1,024; a 2 GiB bytearray under
``--memory 256M`` was killed at a recorded peak of 256.0 MiB (exit 137).
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from sandgate import TYPE_CHECKING
from sandgate.errors import SetupError
from sandgate.policy.limits import Limits

if TYPE_CHECKING:
    from typing import Any

ROOT = Path("/sys/fs/cgroup")
PREFIX = "sandgate-"
GATEWAY_PREFIX = "sandgate-gw-"
CPU_PERIOD_US = 100_000
SANDBOX_OOM_SCORE = 500  # the kernel's OOM killer picks a sandbox before anything else
GATEWAY_OOM_SCORE = -900  # and the gateway daemon last
TOO_SMALL = 32 << 20  # an OOM kill under this much: the command could not even start
GATEWAY_RESERVE = 64 << 20  # memory reclaim leaves the daemon this much (memory.min / soft)
# The gateway's CPU weight, as a multiple of a sandbox's (the kernel's default): every agent's
# DNS, proxy and logging wait on its threads, so a sandbox that keeps both cores busy
# (`make -j`) must not make them wait their turn as one group among many (issue 13, NOTES).
GATEWAY_CPU_WEIGHT = 8
REASON_PIDS = "limit.pids"
REASON_MEMORY = "limit.memory"
V1_CONTROLLERS = ("pids", "memory", "cpu", "blkio")


class LimitsError(SetupError):
    """A limit that this host cannot apply: what is missing, and what to do."""


@dataclass(frozen=True)
class Hierarchy:
    """The host's cgroup tree(s) that sandgate makes its cgroups in."""

    version: int  # 2: one unified tree; 1: a tree per controller
    dirs: dict[str, Path]  # controller -> the directory sandgate's cgroups are made in
    missing: tuple[str, ...] = ()  # controllers this host lacks (or does not delegate to us)


def detect(root: Path = ROOT) -> Hierarchy:
    """Which cgroup hierarchy this host has, and which controllers it gives us."""
    if (root / "cgroup.controllers").is_file():
        have = set((root / "cgroup.controllers").read_text().split())
        wanted = ("pids", "memory", "cpu", "io")
        present = [c for c in wanted if c in have]
        return Hierarchy(2, dict.fromkeys(present, root), tuple(c for c in wanted if c not in have))
    dirs: dict[str, Path] = {}
    for name in V1_CONTROLLERS:
        d = root / name
        if (d / "cgroup.procs").is_file():
            dirs[name] = d.resolve()
    return Hierarchy(1, dirs, tuple(c for c in V1_CONTROLLERS if c not in dirs))


def host_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@dataclass
class Usage:
    """What the session used and which limits it hit (read before the cgroup is removed)."""

    pids_peak: int = 0
    pids_hits: int = 0  # forks refused at the limit
    memory_peak: int = 0  # bytes
    oom_kills: int = 0
    memory_hits: int = 0  # v1: times usage hit the limit (failcnt)

    @property
    def hit(self) -> list[str]:
        out = []
        if self.pids_hits:
            out.append(REASON_PIDS)
        if self.oom_kills:
            out.append(REASON_MEMORY)
        return out


@dataclass
class Cgroup:
    """One sandbox's cgroup: its directories and the limits set on them."""

    name: str
    hierarchy: Hierarchy
    limits: Limits
    notes: list[str] = field(default_factory=list)  # what could not be set, said, not hidden
    _peak: int = 0
    _sampler: threading.Thread | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    def dir(self, controller: str) -> Path | None:
        base = self.hierarchy.dirs.get(controller)
        return None if base is None else base / self.name

    @property
    def dirs(self) -> list[Path]:
        return sorted({base / self.name for base in self.hierarchy.dirs.values()})

    def prefix_argv(self, oom_score: int = SANDBOX_OOM_SCORE) -> list[str]:
        """Run before the sandbox's command: join every cgroup, raise the OOM score, exec."""
        script = (
            'echo "$1" > /proc/self/oom_score_adj || exit 125; shift; '
            'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
        )
        return ["/bin/sh", "-c", script, "sandgate-limits", str(oom_score), *self.procs, "--"]

    @property
    def procs(self) -> tuple[str, ...]:
        """The cgroup.procs file of each of the session's cgroups (what a joining process
        writes itself into; enter.py does it between fork and exec for a sandbox)."""
        return tuple(str(d / "cgroup.procs") for d in self.dirs)

    def as_json(self) -> dict[str, Any]:
        return {
            "cgroup": self.name,
            "version": self.hierarchy.version,
            "pids": self.limits.pids,
            "memory": self.limits.memory,
            "cpus": self.limits.cpus,
            "notes": list(self.notes),
        }

    def start_sampling(self, every: float = 0.05) -> None:
        """Where the kernel keeps no pids peak (v1 on older kernels; this machine's
        6.18 keeps one in v1 too): sample
        pids.current while the session runs. Where it does (pids.peak, read by ``usage``), no
        thread: its start, its wakeups through the session and its join at the teardown cost
        the runner ~0.2 ms each end and miss what lived between two samples (issue 13)."""
        path = self.dir("pids")
        if path is None or os.path.exists(f"{path}/pids.peak"):
            return

        def loop() -> None:
            while not self._stop.wait(every):
                with contextlib.suppress(OSError, ValueError):
                    self._peak = max(self._peak, int((path / "pids.current").read_text()))

        self._sampler = threading.Thread(target=loop, name="sandbox-pids", daemon=True)
        self._sampler.start()

    def usage(self) -> Usage:
        self._stop.set()
        if self._sampler is not None:
            self._sampler.join(timeout=1)
        # Read with os calls on str paths: a pathlib read costs ~3x the syscalls' time here,
        # and teardown reads 5-7 of these files (issue 13).
        u = Usage(pids_peak=self._peak)
        pids = self.dir("pids")
        if pids is not None:
            base = f"{pids}/"
            u.pids_hits = _keyed(base + "pids.events").get("max", 0)
            u.pids_peak = max(u.pids_peak, _int(base + "pids.peak"), _int(base + "pids.current"))
        mem = self.dir("memory")
        if mem is not None and self.hierarchy.version == 2:
            base = f"{mem}/"
            u.memory_peak = _int(base + "memory.peak")
            events = _keyed(base + "memory.events")
            u.oom_kills = events.get("oom_kill", 0)
            u.memory_hits = events.get("max", 0)
        elif mem is not None:
            base = f"{mem}/"
            u.memory_peak = max(
                _int(base + "memory.max_usage_in_bytes"),
                _int(base + "memory.memsw.max_usage_in_bytes"),
            )
            u.oom_kills = _keyed(base + "memory.oom_control").get("oom_kill", 0)
            u.memory_hits = _int(base + "memory.failcnt")
        return u

    def remove(self) -> None:
        self._stop.set()
        for d in self.dirs:
            _remove_dir(d)


def create(name: str, limits: Limits, hierarchy: Hierarchy | None = None) -> Cgroup:
    """Make the session's cgroup with ``limits`` (every field set) applied, or say what is
    missing. On any failure what was made is removed again."""
    cg = make(name, hierarchy)
    try:
        apply(cg, limits)
    except BaseException:
        cg.remove()
        raise
    return cg


def make(name: str, hierarchy: Hierarchy | None = None) -> Cgroup:
    """Make the session's cgroup, no limits yet (``apply`` them before anything but the
    sandbox's first process, waiting to exec, is in it). On any failure it is removed again."""
    h = hierarchy or detect()
    _need(h, ["pids", "memory"])
    cg = Cgroup(name, h, Limits())
    try:
        if h.version == 2:
            _enable_v2(h.dirs["pids"], ["pids", "memory", "cpu", "io"])
        for d in cg.dirs:
            d.mkdir()
    except OSError as exc:
        cg.remove()
        raise _cannot(exc) from exc
    except BaseException:
        cg.remove()
        raise
    return cg


def apply(cg: Cgroup, limits: Limits) -> None:
    """Set ``limits`` (every field set) on a cgroup ``make`` made; once."""
    _need(cg.hierarchy, ["cpu"] if limits.cpus is not None else [])
    cg.limits = limits
    try:
        _apply(cg)
    except OSError as exc:
        raise _cannot(exc) from exc


def _need(h: Hierarchy, controllers: list[str]) -> None:
    absent = [c for c in controllers if c not in h.dirs]
    if absent:
        kind = "cgroup v2 controller" if h.version == 2 else "cgroup v1 controller"
        raise LimitsError(
            f"cannot limit this session: {kind}(s) {', '.join(absent)} missing on this host",
            "mount them (v1: /sys/fs/cgroup/<controller>) or enable them in the parent's "
            "cgroup.subtree_control (v2)",
        )


def _cannot(exc: OSError) -> LimitsError:
    return LimitsError(
        f"cannot apply limits in {exc.filename or 'the cgroup tree'}: {exc.strerror}",
        "sandgate needs root and a cgroup tree it may write (delegated to it)",
    )


def _enable_v2(parent: Path, controllers: list[str]) -> None:
    have = set((parent / "cgroup.controllers").read_text().split())
    enabled = set((parent / "cgroup.subtree_control").read_text().split())
    for c in controllers:
        if c in have and c not in enabled:
            try:
                (parent / "cgroup.subtree_control").write_text(f"+{c}")
            except OSError as exc:
                why = " (processes live in that cgroup)" if exc.errno == errno.EBUSY else ""
                raise LimitsError(
                    f"cgroup v2: cannot enable the {c} controller in "
                    f"{parent}/cgroup.subtree_control: {exc.strerror}{why}",
                    "run sandgate where the cgroup tree is delegated to it",
                ) from exc


def _apply(cg: Cgroup) -> None:
    lim = cg.limits
    v2 = cg.hierarchy.version == 2
    pids, mem, cpu = cg.dir("pids"), cg.dir("memory"), cg.dir("cpu")
    assert pids is not None and mem is not None
    if lim.pids is not None:
        _write(pids / "pids.max", lim.pids)
    if lim.memory is not None:
        if v2:
            _write(mem / "memory.max", lim.memory)
            if (mem / "memory.swap.max").exists():
                _write(mem / "memory.swap.max", 0)
            else:
                cg.notes.append("swap: memory.swap.max absent (no swap accounting)")
        else:
            _write(mem / "memory.limit_in_bytes", lim.memory)
            _write(mem / "memory.soft_limit_in_bytes", 0)  # reclaimed before the gateway
            if (mem / "memory.memsw.limit_in_bytes").exists():
                # memsw counts RAM and swap together: equal to the RAM limit means no swap.
                _write(mem / "memory.memsw.limit_in_bytes", lim.memory)
            else:
                _write(mem / "memory.swappiness", 0)
                cg.notes.append("swap: memory.memsw absent (swapaccount off); swappiness 0")
    if lim.cpus is not None:
        assert cpu is not None
        quota = max(1000, int(lim.cpus * CPU_PERIOD_US))
        if v2:
            _write(cpu / "cpu.max", f"{quota} {CPU_PERIOD_US}")
        else:
            _write(cpu / "cpu.cfs_period_us", CPU_PERIOD_US)
            _write(cpu / "cpu.cfs_quota_us", quota)
    io = cg.dir("io" if v2 else "blkio")
    weight = next(
        (
            io / f
            for f in ("io.weight", "io.bfq.weight", "blkio.weight", "blkio.bfq.weight")
            if io is not None and (io / f).exists()
        ),
        None,
    )
    if weight is not None:
        # Below the default (100): a sandbox's I/O yields to the host's and the gateway's.
        _write(weight, "default 50" if weight.name == "io.weight" else 50)
    else:
        cg.notes.append("I/O weight: not available on this host (no io/bfq weight)")


def protect_gateway(instance: str, pid: int, hierarchy: Hierarchy | None = None) -> list[str]:
    """Give the gateway daemon its own cgroup with reserved memory, GATEWAY_CPU_WEIGHT times a
    sandbox's CPU weight, and an OOM score of -900.
    Returns what could not be done (the daemon still runs: it is protected as far as the host
    allows, and says how far)."""
    notes: list[str] = []
    try:
        Path(f"/proc/{pid}/oom_score_adj").write_text(str(GATEWAY_OOM_SCORE))
    except OSError as exc:
        # Lowering a score needs CAP_SYS_RESOURCE (some containers drop it); sandboxes at +500
        # are still the OOM killer's first choice.
        notes.append(f"oom_score_adj {GATEWAY_OOM_SCORE}: {exc.strerror} (CAP_SYS_RESOURCE?)")
    h = hierarchy or detect()
    if "memory" not in h.dirs:
        return ["memory controller missing: no reserve for the gateway"]
    cg = Cgroup(GATEWAY_PREFIX + instance, h, Limits())
    try:
        for d in cg.dirs:
            d.mkdir(exist_ok=True)
        mem = cg.dir("memory")
        assert mem is not None
        if h.version == 2:
            _write(mem / "memory.min", GATEWAY_RESERVE)
        else:
            # v1 has no memory.min. Global reclaim takes first from groups over their soft
            # limit: the gateway keeps none (unlimited) and every sandbox's is 0 (_apply).
            notes.append("cgroup v1: no memory.min; sandboxes are reclaimed first (soft limit 0)")
        for d in cg.dirs:
            _write(d / "cgroup.procs", pid)
    except OSError as exc:
        notes.append(f"gateway cgroup: {exc.strerror} ({exc.filename})")
        return notes
    cpu = cg.dir("cpu")
    if cpu is not None:  # v2 cpu.weight (default 100), v1 cpu.shares (default 1024)
        knob, base = ("cpu.weight", 100) if h.version == 2 else ("cpu.shares", 1024)
        try:
            if h.version == 2:  # the gateway may come up before any sandbox enabled it
                _enable_v2(h.dirs["cpu"], ["cpu"])
            _write(cpu / knob, base * GATEWAY_CPU_WEIGHT)
        except LimitsError as exc:
            notes.append(f"gateway CPU weight: {exc}")
        except OSError as exc:
            notes.append(f"gateway CPU weight: {exc.strerror} ({exc.filename})")
    return notes


def release_gateway(instance: str, hierarchy: Hierarchy | None = None) -> None:
    h = hierarchy or detect()
    for base in h.dirs.values():
        _remove_dir(base / (GATEWAY_PREFIX + instance), kill=False)


def ours(hierarchy: Hierarchy | None = None) -> list[str]:
    """Names of the sandgate cgroups on this host (for cleanup and the leak checks)."""
    h = hierarchy or detect()
    names: set[str] = set()
    for base in set(h.dirs.values()):
        with contextlib.suppress(OSError):
            names.update(p.name for p in base.iterdir() if p.is_dir() and p.name.startswith(PREFIX))
    return sorted(names)


def populated(name: str, hierarchy: Hierarchy | None = None) -> bool:
    h = hierarchy or detect()
    return any(_procs(base / name) for base in set(h.dirs.values()))


def remove(name: str, hierarchy: Hierarchy | None = None) -> None:
    if not name.startswith(PREFIX):
        raise ValueError(f"not a sandgate cgroup: {name}")
    h = hierarchy or detect()
    for base in set(h.dirs.values()):
        _remove_dir(base / name, kill=not name.startswith(GATEWAY_PREFIX))


def _remove_dir(d: Path, kill: bool = True) -> None:
    """rmdir a cgroup; its processes (all ours: the sandbox's) are killed first. No stat
    first: a missing one is the rmdir's ENOENT (one syscall a hierarchy less; issue 13)."""
    deadline = time.monotonic() + 5
    while True:
        try:
            os.rmdir(d)
            return
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                raise
        if kill:
            for pid in _procs(d):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        else:
            _move_out(d)
        time.sleep(0.02)


def _move_out(d: Path) -> None:
    for pid in _procs(d):
        with contextlib.suppress(OSError):
            (d.parent / "cgroup.procs").write_text(str(pid))


def _procs(d: Path) -> list[int]:
    try:
        return [int(x) for x in (d / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _write(path: Path, value: object) -> None:
    path.write_text(f"{value}\n")


def _read(path: str | Path) -> str:
    """A cgroup file's text, "" if it cannot be read (absent on this kernel, or gone)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        return os.read(fd, 65536).decode(errors="replace")
    except OSError:
        return ""
    finally:
        os.close(fd)


def _int(path: str | Path) -> int:
    try:
        return int(_read(path).split()[0])
    except (ValueError, IndexError):
        return 0


def _keyed(path: str | Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in _read(path).splitlines():
        key, _, value = line.partition(" ")
        with contextlib.suppress(ValueError):
            out[key] = int(value)
    return out
