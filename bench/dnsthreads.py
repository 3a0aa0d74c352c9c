"""Where a cached-20k session's DNS tail comes from: the gateway's threads, 25 ms at a time.

``python -m bench.dnsthreads [ROUNDS] [OUT.json]`` (as root) brings up a bench stack and runs
dnsperf's ``cached 20k`` load (bench/dnsperf.py) ROUNDS times, each a session of its own, while
a thread here reads every gateway thread's ``/proc/PID/task/TID/schedstat`` every 2 ms: the CPU
each ran, and how long the event loop's thread waited for a core, per 25 ms from dnsperf's
start. Against that, the p99 of the answers to the questions sent in each 25 ms (dnsperf's
answers in order: at a steady 20k offered, the i-th was sent about i/20,000 s after its
start). Prints a line per round (p99 of the first 0.25 s and of the rest) and writes the whole
time-line as JSON. Thread ids, not names: the loop's is the gateway's pid, the netlink thread
the first started after it; a session's hold thread is new each round.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench import dnsperf
from bench.common import machine, median, pct
from bench.stack import bench_stack

BUCKET = 0.025  # seconds
Snapshot = tuple[float, dict[int, tuple[int, int]]]  # when, tid -> (run ns, wait ns)


def _sample(pid: int, stop: threading.Event, rows: list[Snapshot]) -> None:
    while not stop.is_set():
        snap: dict[int, tuple[int, int]] = {}
        now = time.time()
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    fields = f.read().split()
                snap[int(tid)] = (int(fields[0]), int(fields[1]))
            except (OSError, ValueError, IndexError):
                continue  # the thread ended meanwhile
        rows.append((now, snap))
        time.sleep(0.002)


def _timeline(rows: list[Snapshot], start: float, loop_tid: int) -> dict[str, dict[int, float]]:
    """ms of CPU per thread (and "wait": the loop's wait for a core) per bucket from start."""
    out: dict[str, dict[int, float]] = {}
    for (t0, s0), (_, s1) in itertools.pairwise(rows):
        b = int((t0 - start) // BUCKET)
        for tid, (run1, wait1) in s1.items():
            run0, wait0 = s0.get(tid, (run1, wait1))
            cell = out.setdefault(str(tid), {})
            cell[b] = cell.get(b, 0.0) + (run1 - run0) / 1e6
            if tid == loop_tid:
                waits = out.setdefault("wait", {})
                waits[b] = waits.get(b, 0.0) + (wait1 - wait0) / 1e6
    return out


def main(rounds: int, out_path: str) -> None:
    load = next(x for x in dnsperf.loads(False) if x.name == "cached 20k")
    report: dict[str, Any] = {"machine": machine(), "rounds": []}
    with bench_stack() as bs:
        work = bs.base / "dns"
        work.mkdir(mode=0o755, exist_ok=True)
        os.chown(work, dnsperf.UID, dnsperf.UID)
        (work / "wrap.sh").write_text(dnsperf.WRAPPER)
        gw = bs.stack.gateway.pid
        report["gateway_pid"] = gw
        for r in range(rounds):
            rows: list[Snapshot] = []
            stop = threading.Event()
            sampler = threading.Thread(target=_sample, args=(gw, stop, rows))
            sampler.start()
            try:
                run = dnsperf.sandgate_run(bs, load, work)
            finally:
                stop.set()
                sampler.join()
            out = work / "out-sandgate-cached-20k.txt"
            lat = [
                float(line.split()[-1])
                for line in out.read_text().splitlines()
                if line.startswith("> ") and not line.startswith("> T ")
            ]
            start, _, _ = dnsperf.parse_window(Path(f"{out}.win"))
            first = int(0.25 * dnsperf.GOAL_QPS)
            sent: dict[int, list[float]] = {}
            for i, x in enumerate(lat):
                sent.setdefault(int(i / dnsperf.GOAL_QPS / BUCKET), []).append(x)
            line = {
                "p50_ms": median(lat) * 1e3,
                "p99_ms": pct(lat, 99) * 1e3,
                "p99_first_ms": pct(lat[:first], 99) * 1e3,
                "p99_rest_ms": pct(lat[first:], 99) * 1e3,
                "lost": run.lost,
                "cpu_us_per_query": run.as_dict()["cpu_us_per_query"],
                "load": os.getloadavg()[0],
                "p99_ms_by_bucket": {b: pct(v, 99) * 1e3 for b, v in sorted(sent.items())},
                "cpu_ms_by_bucket": _timeline(rows, start, gw),
            }
            report["rounds"].append(line)
            sys.stderr.write(
                f"round {r}: p50 {line['p50_ms']:.2f} p99 {line['p99_ms']:.1f} first 0.25 s"
                f" {line['p99_first_ms']:.1f} rest {line['p99_rest_ms']:.1f} lost {run.lost}"
                f" load {line['load']:.2f}\n"
            )
            time.sleep(0.5)
    report["machine"]["loadavg_end"] = os.getloadavg()
    Path(out_path).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main(
        int(sys.argv[1]) if len(sys.argv) > 1 else 4,
        sys.argv[2] if len(sys.argv) > 2 else "dnsthreads.json",
    )
