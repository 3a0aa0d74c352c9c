"""The homelab gateway VM (issue 10): throughput and added round trip through it, and the
daemon's memory against report 001's 1 GB VM.

The homelab world (world/homelab.py) is built from the exported files of its policy plus one
allow rule per profile for a bulk source on the LAN (10.77.0.250:9000, bulk.py: sendfile from
the page cache, so the source is not the limit). Measured from the orchestrator's VM (open
mode) through the gateway VM (nftables forward chain, masquerade, the flow logged once), beside
the same from the gateway VM's own namespace (no forwarding, no guest rules): the difference is
what the gateway adds. The single-host gateway's figures for the same kernel path are
``bench/run foundation --only throughput`` ("direct").

    bench/run homelab [--json] [--quick]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import log
from sandgate.net import ns
from sandgate.world import homelab as hl

BULK = "10.77.0.250"
PORT = 9000
BUDGET = 1 << 30  # report 001's gateway VM: 1 vCPU, 1 GB
RTT_SCRIPT = """\
import socket, statistics, sys, time
out = []
for _ in range(int(sys.argv[3])):
    t = time.perf_counter()
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
    out.append((time.perf_counter() - t) * 1e6)
    s.close()
print(statistics.median(out))
"""


def _policy(base: Path) -> Path:
    text = hl.default_policy().read_text()
    rule = f'  {{ host = "{BULK}", port = {PORT}, name = "bench bulk source" }},\n'
    text = text.replace("allow = [\n", "allow = [\n" + rule)
    path = base / "homelab-bench.toml"
    path.write_text(text)
    return path


def _curl_mbps(netns: str, size: int, runs: int) -> float:
    rates = []
    for _ in range(runs):
        done = subprocess.run(
            [
                *ns.nsenter_argv(netns),
                "curl",
                "-sS",
                "--noproxy",
                "*",
                "-o",
                "/dev/null",
                "-w",
                "%{size_download} %{time_total}",
                f"http://{BULK}:{PORT}/",
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        )
        got, seconds = (float(x) for x in done.stdout.split())
        if got != size:
            raise RuntimeError(f"{netns}: {got:.0f} of {size} bytes")
        rates.append(got * 8 / seconds / 1e6)
    return statistics.median(rates)


def _rtt_us(netns: str, n: int) -> float:
    done = subprocess.run(
        [*ns.nsenter_argv(netns), sys.executable, "-c", RTT_SCRIPT, BULK, str(PORT), str(n)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return float(done.stdout)


def _memory(pid: int) -> dict[str, int]:
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    fields = {ln.split(":")[0]: int(ln.split()[1]) * 1024 for ln in status if ln.startswith("Vm")}
    return {"rss": fields.get("VmRSS", 0), "peak_rss": fields.get("VmHWM", 0)}


def main_homelab(quick: bool) -> dict[str, Any]:
    size = (64 if quick else 512) << 20
    runs, connects = (1, 100) if quick else (3, 500)
    with tempfile.TemporaryDirectory(prefix="sg-bench-homelab-") as tmp:
        base = Path(tmp)
        blob = base / "blob"
        with blob.open("wb") as f:
            f.write(os.urandom(1 << 20) * 64)
        lab = hl.Homelab(f"bh{os.getpid() % 10000}", _policy(base))
        with lab:
            src = lab._create(lab.ns("bulk"))
            hl._veth(src, "eth0", lab.world.ns("lan"), "hlbulk", "br0")
            hl._ip(src, "addr", "add", f"{BULK}/24", "dev", "eth0")
            hl._ip(src, "link", "set", "eth0", "up")
            bulk = subprocess.Popen(
                [
                    *ns.nsenter_argv(src),
                    sys.executable,
                    str(Path(__file__).with_name("bulk.py")),
                    BULK,
                    str(PORT),
                    str(size),
                    str(blob),
                ],
                start_new_session=True,
            )
            try:
                time.sleep(1.0)
                guest = lab.guests[1].netns  # the orchestrator: open mode
                log("homelab: throughput and round trip, guest and gateway VM")
                result: dict[str, Any] = {
                    "bytes": size,
                    "throughput_mbps": {
                        "guest_through_gateway_vm": _curl_mbps(guest, size, runs),
                        "gateway_vm_itself": _curl_mbps(lab.gateway_ns, size, runs),
                    },
                    "connect_us": {
                        "guest_through_gateway_vm": _rtt_us(guest, connects),
                        "gateway_vm_itself": _rtt_us(lab.gateway_ns, connects),
                    },
                }
                assert lab.daemon is not None
                mem = _memory(lab.daemon.pid)
                result["daemon_memory"] = {**mem, "of_1GB_budget": mem["peak_rss"] / BUDGET}
            finally:
                hl._stop(bulk)
    c = result["connect_us"]
    c["added"] = c["guest_through_gateway_vm"] - c["gateway_vm_itself"]
    return result


def render(result: dict[str, Any]) -> str:
    t, c, m = result["throughput_mbps"], result["connect_us"], result["daemon_memory"]
    return "\n".join(
        [
            f"homelab gateway VM ({result['bytes'] >> 20} MiB over HTTP, median)",
            f"  throughput  guest via gateway VM {t['guest_through_gateway_vm']:8.0f} Mbit/s"
            f"   gateway VM itself {t['gateway_vm_itself']:8.0f} Mbit/s",
            f"  TCP connect guest via gateway VM {c['guest_through_gateway_vm']:8.0f} µs"
            f"   gateway VM itself {c['gateway_vm_itself']:8.0f} µs   added {c['added']:.0f} µs",
            f"  daemon RSS {m['rss'] / 2**20:.0f} MiB, peak {m['peak_rss'] / 2**20:.0f} MiB "
            f"({m['of_1GB_budget']:.1%} of a 1 GB gateway VM)",
        ]
    )
