"""VM guests beside a namespace guest on the same test-world gateway (issue 9's benchmarks).

For each kind (namespace, ``--vm --nic tap``, ``--vm --nic none``), sessions of
``date +%s.%N > /work/t; curl ... x N`` through ``run_in``, unchanged:

    up-to-exec  = from calling run_in to the command's first instruction (the ``date``)
    teardown    = from the command's last instruction to run_in returning (the VM's poweroff,
                  QEMU's exit, the namespace, the report)
    request     = curl's time_total for GET http://10.77.0.10:8000/v1/models (the model server,
                  open in every mode), from inside: directly on a link, through the channel's
                  proxy door without one
    throughput  = curl's speed_download for one GET of SIZE bytes from the test world's web
                  server (http://example.com/bytes/N): through the VM's tap (TCG emulates the
                  guest's virtio-net and TCP stack) vs a namespace guest's veth, same gateway
Guest time to init's "up" line comes from the VM's console log. Ratios, not asserted.
"""

from __future__ import annotations

import math
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import log, median
from sandgate.session.runner import RunOptions, run_in
from sandgate.session.stack import Stack, stack_for
from sandgate.vm.accel import detect
from sandgate.vm.launch import VmOptions

KINDS = ("namespace", "vm-tap", "vm-none")
URL = "http://10.77.0.10:8000/v1/models"
BULK = "http://example.com/bytes/{size}"


def _script(requests: int, size: int) -> str:
    curl = f"curl -s -o /dev/null -w '%{{time_total}}\\n' {URL}"
    bulk = f"curl -s -m 240 -o /dev/null -w '%{{speed_download}}\\n' {BULK.format(size=size)}"
    return (
        "date +%s.%N > /work/t0; "
        f"for i in $(seq {requests}); do {curl} >> /work/req; done; date +%s.%N > /work/t1; "
        f"{bulk} > /work/bulk"
    )


def one(stack: Stack, kind: str, requests: int, size: int = 32 << 20) -> dict[str, Any]:
    vm = None if kind == "namespace" else VmOptions(nic="tap" if kind == "vm-tap" else "none")
    with tempfile.TemporaryDirectory(prefix="sg-benchvm-", dir="/var/tmp") as d:
        work = Path(d)
        work.chmod(0o777)
        start = time.time()
        result = run_in(
            stack,
            RunOptions(
                command=["sh", "-c", _script(requests, size)],
                world="test",
                mode="open",
                workdir=work,
                timeout=300,
                vm=vm,
                echo=False,
            ),
        )
        end = time.time()
        t0, t1 = (float((work / n).read_text()) for n in ("t0", "t1"))
        reqs = [float(x) * 1000 for x in (work / "req").read_text().split()]
        bulk = (work / "bulk").read_text().split() if (work / "bulk").exists() else []
    up = None
    console = Path(result.report.output or "").with_name("vm-console.log")
    if console.exists():
        found = re.search(r"sandgate-init: up at ([0-9.]+) s", console.read_text())
        up = float(found.group(1)) if found else None
    return {
        "exit": result.exit_code,
        "up_to_exec_s": t0 - start,
        "teardown_s": end - t1,
        "guest_up_s": up,
        "request_ms": median(reqs),
        "throughput_mbit": float(bulk[0]) * 8 / 1e6 if bulk else None,
    }


def main_vm(quick: bool) -> dict[str, Any]:
    runs, requests, size = (1, 5, 32 << 20) if quick else (3, 20, 128 << 20)
    out: dict[str, Any] = {"accel": detect().name, "accel_why": detect().why, "kinds": {}}
    with stack_for("test") as stack:
        for kind in KINDS:
            rows = []
            for i in range(runs):
                log(f"vm bench: {kind} {i + 1}/{runs}")
                rows.append(one(stack, kind, requests, size))
            out["kinds"][kind] = {
                key: median([r[key] for r in rows if r[key] is not None] or [float("nan")])
                for key in (
                    "up_to_exec_s",
                    "teardown_s",
                    "guest_up_s",
                    "request_ms",
                    "throughput_mbit",
                )
            }
            out["kinds"][kind]["runs"] = runs
    return out


def render(result: dict[str, Any]) -> str:
    lines = [f"VM guests (accelerator {result['accel']}: {result['accel_why']}), medians"]
    lines.append(
        f"{'kind':<10} {'up-to-exec':>11} {'teardown':>9} {'guest up':>9} {'request':>9} "
        f"{'throughput':>12}"
    )
    for kind, r in result["kinds"].items():
        up = r["guest_up_s"]
        up_text = f"{up:>8.2f}s" if not math.isnan(up) else "        -"  # no console: no VM
        lines.append(
            f"{kind:<10} {r['up_to_exec_s']:>10.2f}s {r['teardown_s']:>8.2f}s "
            f"{up_text} {r['request_ms']:>7.1f}ms {r['throughput_mbit']:>7.0f} Mbit/s"
        )
    return "\n".join(lines)
