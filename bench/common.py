"""What every benchmark here shares: statistics, CPU accounting, processes, namespaces of our own.

Network safety: every namespace made here is named ``sg-<instance>-<role>`` after the bench's
own stack (instance ``b…``), so ``sandgate cleanup`` treats it as owned while the bench runs
and removes it after a crash; every link is created inside such a namespace (never in the
host's); every process is started by us, killed by its pid, and gets SIGKILL if we die.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandgate.net import ns

DIE_WITH_US = ("setpriv", "--pdeathsig", "KILL", "--")
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    """Progress goes to stderr: stdout carries the table (or the JSON object)."""
    sys.stderr.write(f"[bench] {msg}\n")
    sys.stderr.flush()


# -- statistics -------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    """What a run's figures were measured on, with the machine's speed that hour: CPU-bound
    figures (µs a query, CPU s a run) differ 2-3x between days of one shared machine, so a
    comparison across runs divides by ``python_loop_ns`` (one bench's rows are side by side)."""
    return {
        "cpus": os.cpu_count(),
        "loadavg_start": os.getloadavg(),
        "kernel": os.uname().release,
        "python_loop_ns": python_loop_ns(),
    }


def python_loop_ns(rounds: int = 5, n: int = 1_000_000) -> float:
    """CPU ns per iteration of a bare Python loop (best of ``rounds``): the interpreter's speed
    on this machine now (31 ns here on 2026-12-02)."""
    best = math.inf
    for _ in range(rounds):
        t0 = time.process_time()
        total = 0
        for i in range(n):
            total += i
        best = min(best, time.process_time() - t0)
    return round(best / n * 1e9, 1)


def pct(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0..100), linear between closest ranks."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def paired(ours: Sequence[dict[str, Any]], peer: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Round by round against the peer's transfer of the same round (the rounds' ends
    alternate): MB/s ratio and added CPU per GB, median and p10-p90. Failed rounds are left
    out; {} when the rounds do not line up."""
    if not ours or len(ours) != len(peer):
        return {}
    both = [
        (a, b)
        for a, b in zip(ours, peer, strict=True)
        if a.get("ok", True) and b.get("ok", True) and b["MB_s"]
    ]
    ratios = [a["MB_s"] / b["MB_s"] for a, b in both]
    added = [a["cpu_s_per_GB"] - b["cpu_s_per_GB"] for a, b in both]
    return {
        "ratio": median(ratios),
        "ratio_p10": pct(ratios, 10),
        "ratio_p90": pct(ratios, 90),
        "ratios": ratios,
        "added_cpu_s_per_GB": median(added),
        "added_cpu_p10": pct(added, 10),
        "added_cpu_p90": pct(added, 90),
    }


def summary_ms(values: Sequence[float]) -> dict[str, float]:
    """Seconds in, milliseconds out: median and p90."""
    return {"median_ms": median(values) * 1e3, "p90_ms": pct(values, 90) * 1e3}


# -- CPU ----------------------------------------------------------------------------------------


def proc_cpu(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a live process, all its threads; zeros if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0, 0.0
    fields = raw.rsplit(")", 1)[1].split()
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def group_cpu(pids: int | tuple[int, ...]) -> tuple[float, float]:
    """proc_cpu of one process, or the sum over several."""
    if isinstance(pids, int):
        return proc_cpu(pids)
    each = [proc_cpu(pid) for pid in pids]
    return sum(u for u, _ in each), sum(s for _, s in each)


def gateway_pids(gateway: Any) -> tuple[int, ...]:
    """The gateway daemon's processes: itself and its store's writer (events/writer.py), whose
    work was the daemon's own until it moved out (so it counts in every gateway figure)."""
    with gateway.client() as ctl:
        writer = ctl.call("metrics").get("store_writer_pid")
    return (gateway.pid, writer) if writer else (gateway.pid,)


def system_cpu() -> tuple[float, float, float]:
    """(busy, softirq, total) jiffies over all CPUs since boot."""
    parts = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    v = [int(x) for x in parts]
    user, nice, system, idle, iowait, irq, softirq, steal = v[:8]
    total = user + nice + system + idle + iowait + irq + softirq + steal
    return float(total - idle - iowait), float(softirq), float(total)


@dataclass
class Sample:
    t: float
    busy: float
    softirq: float
    total: float
    procs: dict[str, tuple[float, float]]


@dataclass
class Sampler:
    """Samples system and per-process CPU every ``interval`` s, so any window can be judged."""

    # name -> a pid, or several summed (the gateway and its store's writer: gateway_pids)
    pids: Mapping[str, int | tuple[int, ...]] = field(default_factory=dict)
    # name -> (user, system) seconds of something that is not one process (srt's tree);
    # replace the whole dict to add one while sampling
    extra: dict[str, Callable[[], tuple[float, float]]] = field(default_factory=dict)
    interval: float = 0.05
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _take(self) -> None:
        busy, softirq, total = system_cpu()
        procs = {name: group_cpu(pid) for name, pid in self.pids.items()}
        procs.update({name: read() for name, read in self.extra.items()})
        self.samples.append(Sample(time.time(), busy, softirq, total, procs))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._take()

    def __enter__(self) -> Sampler:
        self._take()
        self._thread = threading.Thread(target=self._run, daemon=True, name="cpu-sampler")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._take()

    def window(self, start: float, end: float) -> dict[str, float]:
        """CPU use between two wall-clock instants, in cores (1.0 = one core busy)."""
        a = _at(self.samples, start)
        b = _at(self.samples, end)
        wall = max(b.t - a.t, 1e-9)
        ncpu = os.cpu_count() or 1
        share = (b.total - a.total) or 1.0
        out = {
            "system_busy_cores": (b.busy - a.busy) / share * ncpu,
            "softirq_cores": (b.softirq - a.softirq) / share * ncpu,
        }
        for name in [*self.pids, *self.extra]:
            (au, asys), (bu, bsys) = a.procs.get(name, (0.0, 0.0)), b.procs.get(name, (0.0, 0.0))
            # Never below zero: the clock-tick counters and the window's ends are both coarse.
            out[f"{name}_cores"] = max(0.0, (bu + bsys - au - asys) / wall)
            out[f"{name}_sys_cores"] = max(0.0, (bsys - asys) / wall)
        return out


def _at(samples: list[Sample], t: float) -> Sample:
    """The sample closest to ``t``."""
    return min(samples, key=lambda s: abs(s.t - t))


# -- processes ----------------------------------------------------------------------------------


def spawn(argv: Sequence[str], **kw: Any) -> subprocess.Popen[bytes]:
    """A child that gets SIGKILL if the bench dies (nothing keeps running after a crash).

    ``setpriv --pdeathsig`` sets that up and execs the command (no ``preexec_fn``: the bench
    has threads, and Python code between fork and exec is not safe then)."""
    return subprocess.Popen([*DIE_WITH_US, *argv], **kw)


def run(argv: Sequence[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    check = kw.pop("check", True)
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    return subprocess.run([*DIE_WITH_US, *argv], check=check, **kw)


def stop(proc: subprocess.Popen[bytes] | None) -> None:
    """Stop a child we started, by its pid: SIGTERM, then SIGKILL."""
    if proc is None or proc.poll() is not None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, sig)
        try:
            proc.wait(timeout=3)
            return
        except subprocess.TimeoutExpired:
            continue


@contextlib.contextmanager
def stdout_to(path: Path) -> Iterator[None]:
    """Point file descriptor 1 (inherited by sandboxed commands) at ``path`` for a while."""
    sys.stdout.flush()
    saved = os.dup(1)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.dup2(fd, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
        os.close(fd)


# -- namespaces of our own -----------------------------------------------------------------------


@dataclass
class BenchNet:
    """Namespaces ``sg-<instance>-<role>`` and veths between them; ``close()`` removes them all.

    Every ``ip`` command names the namespace it acts in (``ip -n``): the host's links, routes
    and rules are never touched. Deleting a namespace deletes its links, and with them the
    peers of those links (also the ports we add to the test world's bridge).
    """

    instance: str
    made: list[str] = field(default_factory=list)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def name(self, role: str) -> str:
        return f"sg-{self.instance}-{role}"

    def netns(self, role: str) -> str:
        name = self.name(role)
        ns.check_ours(name)
        run(["ip", "netns", "add", name])
        self.made.append(name)
        self.ip(name, "link", "set", "lo", "up")
        self.sysctl(name, "net.ipv6.conf.all.disable_ipv6", "1")
        self.sysctl(name, "net.ipv6.conf.default.disable_ipv6", "1")
        return name

    def ip(self, netns: str, *args: str) -> None:
        ns.check_ours(netns)
        run(["ip", "-n", netns, *args])

    def sysctl(self, netns: str, key: str, value: str) -> None:
        ns.check_ours(netns)
        run(["ip", "netns", "exec", netns, "sysctl", "-q", "-w", f"{key}={value}"])

    def veth(self, a: str, a_if: str, b: str, b_if: str) -> None:
        """A veth made inside namespace ``a`` with its peer placed straight into ``b``."""
        ns.check_ours(a)
        ns.check_ours(b)
        self.ip(a, "link", "add", a_if, "type", "veth", "peer", "name", b_if, "netns", b)

    def address(self, netns: str, ifname: str, cidr: str) -> None:
        self.ip(netns, "addr", "add", cidr, "dev", ifname)
        self.ip(netns, "link", "set", ifname, "up")

    def spawn_in(self, netns: str, argv: Sequence[str], **kw: Any) -> subprocess.Popen[bytes]:
        ns.check_ours(netns)
        proc = spawn(["ip", "netns", "exec", netns, *argv], **kw)
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in reversed(self.procs):
            stop(proc)
        self.procs.clear()
        for name in reversed(self.made):
            with contextlib.suppress(Exception):
                ns.remove(name)
        self.made.clear()


def wait_udp_port(netns: str, address: str, port: int, timeout: float = 5.0) -> None:
    """Wait until something listens on udp ``address:port`` inside ``netns``."""
    deadline = time.monotonic() + timeout
    want = f"{address}:{port}"
    while time.monotonic() < deadline:
        out = run(["ip", "netns", "exec", netns, "ss", "-Hlun"], check=False).stdout
        if want in out:
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on udp {want} in {netns}")


def spawn_ready(net: BenchNet, netns: str, argv: Sequence[str]) -> subprocess.Popen[bytes]:
    """Start a server in ``netns`` that prints a line starting READY when it serves."""
    proc = net.spawn_in(netns, argv, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith(b"READY"):
        stop(proc)
        raise RuntimeError(f"{argv[0]} did not start in {netns}")
    return proc
