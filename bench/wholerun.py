"""The whole ``sandgate run --instance I -q -- true`` as a user times it, beside srt (issue 13).

Whole processes, paired (one of each per round, alternating, so both meet the same load):
wall by ``perf_counter``, CPU by ``getrusage(RUSAGE_CHILDREN)`` (the process and every child
it waited for). The peer is srt (npm ``@anthropic-ai/sandbox-runtime``, the sandbox Claude
Code uses; it needs ``socat`` and ``ripgrep``), installed under /opt/sandgate/bench-srt:

    apt-get install socat ripgrep
    mkdir -p /opt/sandgate/bench-srt && cd /opt/sandgate/bench-srt && \\
        npm install @anthropic-ai/sandbox-runtime@0.0.83

srt starts its HTTP/SOCKS proxies in the namespace it is started in: it runs in a fresh network
namespace with only loopback up (``unshare -n``), so nothing it starts is reachable from or
reaches anywhere else. Our side also reports ``run --timings``' phases of one extra run.

``homes``: the same run, paired, in a fresh ``SANDGATE_HOME`` and in one holding ``KEPT`` kept
sessions (``kept_home``), both the bench's own: what a run costs as a user's home fills up.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import log, median
from bench.stack import BenchStack

SRT = Path("/opt/sandgate/bench-srt/node_modules/.bin/srt")
KEPT = 1000  # kept sessions in the full home


def _timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(argv, check=False, env=env, stdin=subprocess.DEVNULL, capture_output=True)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise RuntimeError(f"{argv[0]} failed ({p.returncode}): {p.stderr.decode()[-300:]}")
    return wall, (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)


def _sandgate_argv(instance: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "sandgate", "run", "--instance", instance, "-q", *extra, "--"]


def measure(bs: BenchStack, quick: bool) -> dict[str, Any]:
    n = 4 if quick else 10
    # What a user's shell gives: bytecode caches written (a fresh shell has no such flag).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    ours_argv = [*_sandgate_argv(bs.instance), "true"]
    srt_argv = ["unshare", "-n", "sh", "-c", f'ip link set lo up && exec "{SRT}" -c true']
    have_srt = SRT.exists()
    peer_name = " and srt -c true" if have_srt else ""
    log(f"whole run: {n} paired rounds of `sandgate run -q -- true`{peer_name}")
    ours: list[tuple[float, float]] = []
    peer: list[tuple[float, float]] = []
    for i in range(n + 1):
        o = _timed(ours_argv, env)
        s = _timed(srt_argv, env) if have_srt else None
        if i == 0:
            continue  # warm-up: bytecode, page cache
        ours.append(o)
        if s is not None:
            peer.append(s)
    timing = subprocess.run(
        [*_sandgate_argv(bs.instance, "--json", "--timings"), "true"],
        check=False, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
    )  # fmt: skip
    phases = json.loads(timing.stdout).get("timings") if timing.returncode == 0 else None
    out: dict[str, Any] = {
        "n": n,
        "sandgate": {
            "wall_median_s": median([w for w, _ in ours]),
            "cpu_median_s": median([c for _, c in ours]),
        },
        "timings": phases,
        "loadavg": os.getloadavg(),
    }
    out["homes"] = _homes(bs, n, env, ours_argv)
    if peer:
        out["srt"] = {
            "wall_median_s": median([w for w, _ in peer]),
            "cpu_median_s": median([c for _, c in peer]),
            "command": "unshare -n (lo up) srt -c true",
        }
    else:
        out["srt"] = None
        out["srt_missing"] = f"{SRT} not installed (this module's docstring says how)"
    return out


def _homes(bs: BenchStack, n: int, env: dict[str, str], argv: list[str]) -> dict[str, Any]:
    homes = {"fresh": bs.base / "home-fresh", "kept": bs.base / "home-kept"}
    homes["fresh"].mkdir(exist_ok=True)
    log(f"whole run: a home with {KEPT} kept sessions and a fresh one, {n} paired rounds")
    kept_home(homes["kept"], KEPT)
    runs: dict[str, list[tuple[float, float]]] = {tag: [] for tag in homes}
    for i in range(n + 1):
        for tag, home in homes.items():
            r = _timed(argv, {**env, "SANDGATE_HOME": str(home)})
            if i:  # the first: warm-up, and the kept home's size index written
                runs[tag].append(r)
    timing = subprocess.run(
        [*_sandgate_argv(bs.instance, "--json", "--timings"), "true"],
        check=False, env={**env, "SANDGATE_HOME": str(homes["kept"])},
        stdin=subprocess.DEVNULL, capture_output=True, text=True,
    )  # fmt: skip
    return {
        tag: {
            "kept_sessions": len([p for p in (home / "sessions").iterdir() if p.is_dir()]),
            "wall_median_s": median([w for w, _ in runs[tag]]),
            "cpu_median_s": median([c for _, c in runs[tag]]),
            **(
                {"timings": json.loads(timing.stdout).get("timings")}
                if tag == "kept" and timing.returncode == 0
                else {}
            ),
        }
        for tag, home in homes.items()
    }


def kept_home(home: Path, n: int, seed: int = 13) -> Path:
    """A home with ``n`` kept sessions shaped as runs leave them (``output.log``, the OCSF
    export, a ``work/`` copy with a file or two), spread over the last 20 days: what a user's
    home holds after weeks of runs (issue 13: retention must not cost per kept session)."""
    import random

    rng = random.Random(seed)
    sessions = home / "sessions"
    now = time.time()
    for i in range(n):
        t = now - 86400 * 20 * (n - i) / n
        folder = sessions / (time.strftime("%Y%m%d-%H%M%S", time.gmtime(t)) + f"-{i:04x}")
        (folder / "work").mkdir(parents=True, exist_ok=True)
        (folder / "output.log").write_bytes(b"x" * rng.randrange(0, 4096))
        (folder / "events.ocsf.jsonl").write_bytes(b"{}\n" * rng.randrange(0, 3000))
        for j in range(rng.randrange(0, 3)):
            (folder / "work" / f"f{j}").write_bytes(b"y" * rng.randrange(0, 2048))
        for path in (*folder.rglob("*"), folder):
            os.utime(path, (t, t))
    return home
