"""Where the sandboxed curl's extra CPU per GB goes: perf profiles of both curls, same bytes.

``bench/run foundation --only throughput`` shows the sandboxed curl spending more CPU per GB
than the peer guest's curl on the same transfer from ``bulk.py``. This takes one 1 GiB transfer
a side per round (the first alternating), each under a system-wide ``perf record -e
cpu-clock`` (software sampling: this machine has no hardware counters), and counts the samples
taken in curl's context by what its call chain holds: packet processing run in curl's context
(``net_rx_action``/``process_backlog``: the far end's receive of the ACKs curl sends, forwarded
through every namespace on the way), the netfilter hooks on it (``nf_hook_slow``), and the copy
to user space. A sample is 1/FREQ s of curl's CPU.

    PYTHONPATH=src:. /opt/sandgate/venv/bin/python -m bench.curlprofile [ROUNDS] [--json]

Needs ``perf`` (Debian's linux-perf). Loopback and the bench's own namespaces only.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import throughput as tp
from bench.common import log, median, spawn_ready
from bench.proxy_agents import Agent, read_steps
from bench.stack import UPSTREAM, bench_stack

SIZE = 1 << 30
FREQ = 2999  # Hz, off the timer tick's multiples
# What a sample's call chain holds, by the bucket it counts in (a sample may count in several).
BUCKETS = {
    "softirq_rx": re.compile(r"\b(net_rx_action|process_backlog)\b"),
    "netfilter": re.compile(r"\bnf_hook_slow\b"),
    "copy_to_user": re.compile(r"\b_copy_to_iter\b"),
}


def count(data: Path) -> dict[str, int]:
    """Samples in curl's context, all and by bucket, from one ``perf record`` file."""
    out = subprocess.run(
        ["perf", "script", "-i", str(data), "--comm", "curl", "-F", "comm,ip,sym"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    counts = {"samples": 0, **dict.fromkeys(BUCKETS, 0)}
    for chain in out.split("\n\n"):
        if not chain.strip():
            continue
        counts["samples"] += 1
        for name, pattern in BUCKETS.items():
            counts[name] += bool(pattern.search(chain))
    return counts


def profile(agent: Agent, side: str, data: Path) -> None:
    perf = subprocess.Popen(
        ["perf", "record", "-q", "-a", "-g", "-e", "cpu-clock", "-F", str(FREQ), "-o", str(data)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.5)  # perf's own start, outside the transfer
        agent.do(tp.transfer_line("direct", side, tp.BULK_URL, ["--noproxy", "*"], 1))
    finally:
        perf.send_signal(signal.SIGINT)
        perf.wait(timeout=60)


def measure(rounds: int) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {"sandgate": [], "kernel": []}
    with bench_stack() as bs, tempfile.TemporaryDirectory(prefix="sg-perf-") as tmp:
        work = bs.base / "curlprofile"
        work.mkdir(mode=0o755)
        bulk = spawn_ready(
            bs.net,
            bs.net.name("up"),
            ["python3", str(Path(__file__).with_name("bulk.py")), UPSTREAM, str(tp.BULK_PORT),
             str(SIZE), str(work / "bulk.data")],
        )  # fmt: skip
        failures: list[str] = []
        ours = tp.sandbox_agent(bs, work / "sandgate", [f"{UPSTREAM}:{tp.BULK_PORT}"], failures)
        peer = tp.peer_agent(bs, work / "kernel")
        try:
            for r in range(rounds):
                order = [("sandgate", ours), ("kernel", peer)]
                for side, agent in order if r % 2 == 0 else order[::-1]:
                    data = Path(tmp) / f"{side}-{r}.data"
                    profile(agent, side, data)
                    runs[side].append(count(data))
                    data.unlink()
            for agent in (ours, peer):
                for step, run in zip(read_steps(agent.work), runs[agent.side], strict=False):
                    run["curl_cpu_s"] = round(step.cpu, 3)
                    run["MB_s"] = round(SIZE / max(step.real, 1e-9) / 1e6)
        finally:
            ours.close()
            peer.close()
            bulk.terminate()
            bulk.wait(10)
            (work / "bulk.data").unlink(missing_ok=True)
    summary = {
        side: {k: median([float(r[k]) for r in rs]) for k in rs[0]} for side, rs in runs.items()
    }
    extra = {k: summary["sandgate"][k] - summary["kernel"][k] for k in BUCKETS.keys() | {"samples"}}
    return {"freq_hz": FREQ, "size": SIZE, "runs": runs, "median": summary,
            "extra_samples": extra, "failures": failures}  # fmt: skip


def main(argv: list[str]) -> int:
    rounds = int(next((a for a in argv if a.isdigit()), "4"))
    out = measure(rounds)
    if "--json" in argv:
        print(json.dumps(out, indent=1))
        return 0
    log(f"curl's samples at {FREQ} Hz, median of {rounds} x 1 GiB a side")
    for side, s in out["median"].items():
        share = {k: f"{100 * s[k] / max(s['samples'], 1):.0f}%" for k in BUCKETS}
        buckets = "  ".join(f"{k} {v}" for k, v in share.items())
        print(
            f"  {side:9} {s['samples']:6.0f} samples ({s['curl_cpu_s']:.3f} s, "
            f"{s['MB_s']:.0f} MB/s)  {buckets}"
        )
    e = out["extra_samples"]
    print("  extra    " + "  ".join(f"{k} {e[k]:+.0f}" for k in ("samples", *BUCKETS)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
