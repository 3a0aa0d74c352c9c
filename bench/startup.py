"""Sandbox up-to-exec and teardown, by phase; beside bwrap in a fresh namespace and ``unshare -n``.

A sandgate session is ``run_in`` on the running stack, unchanged: its steps are timed from the
outside by wrapping the functions it calls (Sandbox.create, the control calls, the store, the
files, Sandbox.run, destroy, the report). The command is ``date +%s.%N`` with its standard
output sent to a file, so the instant it runs is known to within the ~1 ms date itself needs.

    up-to-exec  = from calling run_in to the command's first instruction
    teardown    = from the command's exit (Sandbox.run returns) to run_in returning

Peers, same machine, same moment: ``ip netns add`` + the same nsenter/setpriv/bwrap command
line sandgate uses (same binds and files) + ``ip netns delete``, no gateway; and
``unshare -n true`` (a fresh network namespace and nothing else).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import log, median, pct, stdout_to
from bench.stack import BenchStack
from sandgate.events.store import Store
from sandgate.gateway.control import ControlClient
from sandgate.sandbox import bwrap
from sandgate.sandbox.launch import Sandbox
from sandgate.session import runner
from sandgate.session.runner import RunOptions, run_in
from sandgate.session.timings import Timings, cpu_now

UID = 61000

# What run_in calls, and the phase each belongs to. Missing ones are skipped (run_in changes).
TARGETS: list[tuple[Any, str, str]] = [
    (Store, "__init__", "store open"),
    (Sandbox, "create", "netns + dirs (Sandbox.create)"),
    (Sandbox, "make", "netns + dirs (Sandbox.create)"),  # create's body; the runner calls it
    (ControlClient, "__init__", "control connect"),
    (ControlClient, "call", "control {op}"),
    (runner._Removal, "result", "control remove_guest"),  # sent behind the drift snapshot
    (Store, "session_start", "session row"),
    (Sandbox, "etc_files", "sandbox files"),
    (Sandbox, "copy_in", "sandbox files"),
    (runner, "place_secrets", "sandbox files"),
    (Sandbox, "start", "sandbox set-up, held (Sandbox.start)"),
    (Sandbox, "run", "command (Sandbox.run)"),
    (Sandbox, "kill", "kill"),
    (Sandbox, "destroy", "destroy (netns delete, rmtree)"),
    (Store, "session_end", "session row"),
    (Store, "session", "report"),
    (Store, "events", "report"),
    (runner, "build_report", "report"),
    (Store, "close", "store close"),
]


@dataclass
class Timeline:
    spans: list[tuple[str, float, float]] = field(default_factory=list)

    def total(self, label: str, start: float, end: float) -> float:
        """Time spent in ``label`` between two instants (nested spans of one label counted once)."""
        out = 0.0
        for name, a, b in self.spans:
            if name == label and a >= start and b <= end:
                out += b - a
        return out


@contextlib.contextmanager
def instrumented(timeline: Timeline) -> Iterator[None]:
    undo: list[tuple[Any, str, Any]] = []
    depth: dict[str, int] = {}
    try:
        for owner, attr, label in TARGETS:
            try:
                raw = inspect.getattr_static(owner, attr)
            except AttributeError:
                continue
            wrapped = _wrap(raw, label, timeline, depth)
            undo.append((owner, attr, raw))
            setattr(owner, attr, wrapped)
        yield
    finally:
        for owner, attr, raw in reversed(undo):
            setattr(owner, attr, raw)


def _wrap(raw: Any, label: str, timeline: Timeline, depth: dict[str, int]) -> Any:
    func: Callable[..., Any] = raw.__func__ if isinstance(raw, classmethod) else raw

    def timed(*args: Any, **kwargs: Any) -> Any:
        name = label
        if "{op}" in label:
            op = args[1] if len(args) > 1 else kwargs.get("op", "?")
            name = label.format(op=op)
        depth[name] = depth.get(name, 0) + 1
        start = time.time()
        try:
            return func(*args, **kwargs)
        finally:
            depth[name] -= 1
            if depth[name] == 0:  # a phase calling itself (Sandbox.destroy → kill) counts once
                timeline.spans.append((name, start, time.time()))

    return classmethod(timed) if isinstance(raw, classmethod) else timed


UP_PHASES = [
    "store open",
    "netns + dirs (Sandbox.create)",
    "control connect",
    "control take_netns",  # a warm namespace from the gateway's pool (gateway/pool.py)
    "control add_guest",
    "session row",
    "sandbox files",
    "sandbox set-up, held (Sandbox.start)",
]
DOWN_PHASES = [
    "kill",
    "control connect",
    "control remove_guest",
    "destroy (netns delete, rmtree)",
    "session row",
    "report",
    "store close",
]


def sandgate_session(bs: BenchStack, work: Path) -> dict[str, float]:
    out = work / "date.out"
    timeline = Timeline()
    timings = Timings()
    opts = RunOptions(
        command=["date", "+%s.%N"],
        mode="open",
        world="test",
        store=bs.store,
        timeout=30,
        timings=timings,
    )
    with instrumented(timeline), stdout_to(out):
        cpu0 = cpu_now()
        t0 = time.time()
        run_in(bs.stack, opts)
        t_end = time.time()
        cpu = cpu_now() - cpu0
    t_exec = float(out.read_text().split()[0])
    runs = [s for s in timeline.spans if s[0] == "command (Sandbox.run)"]
    run_start, run_end = runs[0][1], runs[0][2]
    phases: dict[str, float] = {"up-to-exec": t_exec - t0, "teardown": t_end - run_end}
    phases["cpu: runner (and its waited children)"] = cpu
    for name in UP_PHASES:
        phases[f"up: {name}"] = timeline.total(name, t0, run_start)
    # The key kept from when Sandbox.run spawned the chain; since the sandbox is set up ahead
    # (Sandbox.start, its own phase) it is the release → the command's exec.
    phases["up: spawn → exec (nsenter, setpriv, bwrap)"] = t_exec - run_start
    phases["up: other"] = phases["up-to-exec"] - sum(
        v for k, v in phases.items() if k.startswith("up: ")
    )
    phases["command and bwrap exit"] = run_end - t_exec
    for name in DOWN_PHASES:
        phases[f"down: {name}"] = timeline.total(name, run_end, t_end)
    phases["down: other"] = phases["teardown"] - sum(
        v for k, v in phases.items() if k.startswith("down: ")
    )
    phases.update(_runner_down(timings))
    return phases


def _runner_down(timings: Timings) -> dict[str, float]:
    """The runner's own phases after the command (``run --timings``), wall and CPU, and the
    gateway's steps of remove_guest: what the outside spans above cannot see (the findings,
    the cgroup, the claim check), under keys of their own (not summed into ``down: other``)."""
    names = [p.name for p in timings.phases]
    if "sandbox exec" not in names:
        return {}
    out: dict[str, float] = {}
    for p in timings.phases[: names.index("sandbox exec")]:
        if p.steps:
            out[f"runner up: {p.name}"] = p.wall_ms / 1e3
        for step, ms in p.steps.items():  # the join's own steps (lock, policy, ..., rules)
            out[f"gateway add_guest: {step}"] = ms / 1e3
    for p in timings.phases[names.index("sandbox exec") + 1 :]:
        out[f"runner down: {p.name}"] = p.wall_ms / 1e3
        out[f"runner down cpu: {p.name}"] = p.cpu_ms / 1e3
        for step, ms in p.steps.items():
            out[f"gateway remove_guest: {step}"] = ms / 1e3
    return out


def task_cpu(pid: int) -> float:
    """CPU seconds of every thread of ``pid`` so far (schedstat: ns, where /proc/PID/stat's
    ticks are 10 ms, as long as a whole removal)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def peer_session(bs: BenchStack, spec_files: dict[str, Path], work: Path) -> dict[str, float]:
    """ip netns add + sandgate's bwrap command line + ip netns delete, no gateway."""
    name = bs.net.name("p")
    out = work / "peer-date.out"
    # Plain subprocess calls here (no setpriv wrapper): they are what is being timed.
    t0 = time.time()
    subprocess.run(["ip", "netns", "add", name], check=True)
    t_ns = time.time()
    try:
        spec = bwrap.SandboxSpec(
            netns=f"/run/netns/{name}",
            uid=UID,
            gid=UID,
            command=("date", "+%s.%N"),
            workdir=work / "pwork",
            home=work / "phome",
            files=spec_files,
        )
        with open(out, "wb") as f:
            subprocess.run(bwrap.argv(spec), stdout=f, check=True, timeout=30)
        t_exit = time.time()
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=True)
    t_end = time.time()
    t_exec = float(out.read_text().split()[0])
    return {
        "up-to-exec": t_exec - t0,
        "teardown": t_end - t_exit,
        "up: ip netns add": t_ns - t0,
        "up: spawn → exec (nsenter, setpriv, bwrap)": t_exec - t_ns,
        "command and bwrap exit": t_exit - t_exec,
        "down: ip netns delete": t_end - t_exit,
    }


def unshare_session() -> dict[str, float]:
    t0 = time.time()
    subprocess.run(["unshare", "-n", "true"], check=True)
    return {"total": time.time() - t0}


def _peer_files(work: Path) -> dict[str, Path]:
    """The same kind of files sandgate binds (resolv.conf, hosts, passwd, group, CA bundle)."""
    etc = work / "petc"
    etc.mkdir(mode=0o755, exist_ok=True)
    passwd, group = bwrap.passwd_lines(
        UID, UID, Path("/etc/passwd").read_text(), Path("/etc/group").read_text()
    )
    files = {
        "/etc/resolv.conf": ("resolv.conf", "nameserver 10.201.0.1\n"),
        "/etc/hosts": ("hosts", "127.0.0.1\tlocalhost\n"),
        "/etc/passwd": ("passwd", passwd),
        "/etc/group": ("group", group),
    }
    out: dict[str, Path] = {}
    for target, (fname, text) in files.items():
        (etc / fname).write_text(text)
        out[target] = etc / fname
    bundle = Path("/etc/ssl/certs/ca-certificates.crt")
    if bundle.exists():
        (etc / "ca.crt").write_bytes(bundle.read_bytes())
        out[str(bundle)] = etc / "ca.crt"
    for p in out.values():
        os.chmod(p, 0o644)
    for d in ("pwork", "phome"):
        (work / d).mkdir(mode=0o700, exist_ok=True)
        os.chown(work / d, UID, UID)
    return out


def summarize(samples: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    keys = list(dict.fromkeys(k for s in samples for k in s))
    return {
        k: {
            "median_ms": median([s[k] for s in samples if k in s]) * 1e3,
            "p90_ms": pct([s[k] for s in samples if k in s], 90) * 1e3,
        }
        for k in keys
    }


def measure(bs: BenchStack, quick: bool) -> dict[str, Any]:
    n = 8 if quick else 30
    work = bs.base / "startup"
    work.mkdir(mode=0o755, exist_ok=True)
    log(
        f"startup: {n} rounds of a sandgate session (date +%s.%N), the peer (ip netns add +"
        " bwrap + ip netns delete) and unshare -n true, interleaved (the same load for each)"
    )
    files = _peer_files(work)
    for _ in range(2):  # warm-up
        sandgate_session(bs, work)
        peer_session(bs, files, work)
    ours, peers, unshare = [], [], []
    gateway = bs.stack.gateway.pid
    for _ in range(n):
        # The gateway's CPU over the whole round: the peers do not use it, and the guest's
        # undoing (after remove_guest's reply) lands here too.
        gw0 = task_cpu(gateway)
        ours.append(sandgate_session(bs, work))
        peers.append(peer_session(bs, files, work))
        unshare.append(unshare_session())
        ours[-1]["cpu: gateway (the round)"] = task_cpu(gateway) - gw0
    return {
        "n": n,
        "sandgate": summarize(ours),
        "bwrap_netns": summarize(peers),
        "unshare_n": summarize(unshare),
    }
