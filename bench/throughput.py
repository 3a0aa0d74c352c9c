"""1 GiB over HTTP through the gateway, beside the same transfer routed by the kernel alone.

Two pairs, each fetched with curl three times (median):

``web``: ``http://203.0.113.10/bytes/1073741824`` from the test world's web server, the path an
agent's HTTP takes: from inside a sandbox in open mode, TCP 80 is redirected to the gateway's
egress proxy (user space), which relays it out through the world's LAN and router.

``direct``: ``http://10.77.0.250:9000/`` from a sendfile server on the world's LAN (bulk.py; the
kernel does the sending), on a port no proxy takes, with ``curl --noproxy '*'`` (the sandbox's
environment names the gateway's explicit proxy): allowed for the session with
``--allow 10.77.0.250:9000``, so this is the gateway's kernel path alone (nftables forward chain,
masquerade, the new flow logged once).

The peer for both: the peer guest namespace through the peer gateway namespace, a plain router
(ip_forward, no nftables at all) on the same LAN, to the same servers.

CPU is sampled while each transfer runs (web server process, gateway process, softirq, whole
machine) and curl's own CPU comes from bash's ``time``, so the table says which side saturates.
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Any

from bench.common import Sampler, log, run, spawn_ready
from bench.stack import UPSTREAM, BenchStack
from sandgate.session.runner import RunOptions, run_in
from sandgate.world.topology import HOSTS

UID = 61000
SIZE = 1 << 30
URL = f"http://{HOSTS['example.com']}/bytes/{SIZE}"
BULK_PORT = 9000
BULK_URL = f"http://{UPSTREAM}:{BULK_PORT}/"

SCRIPT = """\
TIMEFORMAT='CPU %R %U %S'
out=$1; shift
for i in $(seq "$1"); do
  s=$(date +%s.%N)
  { time curl -sS -o /dev/null -w 'CURL %{size_download} %{time_total}\\n' "${@:2}" \\
      >> "$out" ; } 2>> "$out"
  echo "WIN $s $(date +%s.%N)" >> "$out"
done
"""


def parse(path: Path) -> list[dict[str, float]]:
    """One dict per transfer: bytes, seconds, start, end, curl CPU seconds."""
    runs: list[dict[str, float]] = []
    cur: dict[str, float] = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if parts[:1] == ["CURL"]:
            cur = {"bytes": float(parts[1]), "seconds": float(parts[2])}
        elif parts[:1] == ["CPU"]:
            cur["curl_cpu"] = float(parts[2]) + float(parts[3])
        elif parts[:1] == ["WIN"]:
            cur.update(start=float(parts[1]), end=float(parts[2]))
            runs.append(cur)
            cur = {}
    return runs


def judge(runs: list[dict[str, float]], sampler: Sampler) -> dict[str, Any]:
    rates, rows = [], []
    for r in runs:
        mbs = r["bytes"] / r["seconds"] / 1e6 if r.get("seconds") else 0.0
        w = sampler.window(r["start"], r["end"])
        wall = max(r["end"] - r["start"], 1e-9)
        # CPU per GB of the path's own processes (curl, the server, the gateway daemon): a
        # veth hands each packet on in its sender's softirq, so the forwarding, conntrack and
        # NAT of a direction are in these. It travels; MB/s moves with the neighbours.
        own = r.get("curl_cpu", 0.0) + wall * (
            w.get("server_cores", 0.0) + w.get("gateway_cores", 0.0)
        )
        rows.append(
            {
                "cpu_s_per_GB": own / (r["bytes"] / 1e9) if r.get("bytes") else float("nan"),
                "MB_s": mbs,
                "bytes": r["bytes"],
                "seconds": r["seconds"],
                "curl_cores": r.get("curl_cpu", float("nan")) / wall,
                "server_cores": w.get("server_cores", float("nan")),
                "gateway_cores": w.get("gateway_cores", float("nan")),
                "softirq_cores": w["softirq_cores"],
                "system_busy_cores": w["system_busy_cores"],
            }
        )
        rates.append(mbs)
    med = statistics.median(rates) if rates else float("nan")
    mid = rows[rates.index(med)] if med in rates else (rows[0] if rows else {})
    cpu = statistics.median(x["cpu_s_per_GB"] for x in rows) if rows else float("nan")
    return {
        "median_MB_s": med,
        "cpu_s_per_GB": cpu,
        "runs": rows,
        "at_median": mid,
        "limit": limit(mid),
    }


def limit(row: dict[str, Any]) -> str:
    """Which side saturates, in words (2 cores: 1.0 is one core busy)."""
    if not row:
        return "no data"
    parts = []
    if row.get("server_cores", 0) >= 0.85:
        parts.append(f"the server saturates ({row['server_cores']:.2f} cores)")
    if row.get("gateway_cores", 0) >= 0.85:
        parts.append(f"the gateway process saturates ({row['gateway_cores']:.2f} cores)")
    if row.get("curl_cores", 0) >= 0.85:
        parts.append(f"curl saturates ({row['curl_cores']:.2f} cores)")
    if row.get("system_busy_cores", 0) >= 1.85:
        parts.append(f"both cores busy ({row['system_busy_cores']:.2f})")
    return "; ".join(parts) or "no single process saturates"


def pair(
    bs: BenchStack,
    work: Path,
    tag: str,
    curl_args: list[str],
    n: int,
    pids: dict[str, int],
    allow: list[str],
) -> dict[str, Any]:
    log(f"throughput {tag}: sandgate, {n} x 1 GiB")
    out = work / f"sandgate-{tag}.out"
    opts = RunOptions(
        command=["bash", "/work/tp.sh", f"/work/{out.name}", str(n), *curl_args],
        mode="open",
        allow=allow,
        world="test",
        store=bs.store,
        workdir=work,
        timeout=120,
        label=f"bench throughput {tag}",
    )
    with Sampler(dict(pids)) as sampler:
        run_in(bs.stack, opts)
    ours = judge(parse(out), sampler)
    log(f"throughput {tag}: kernel routing without sandgate, {n} x 1 GiB")
    out = work / f"kernel-{tag}.out"
    with Sampler(dict(pids)) as sampler:
        script = [str(work / "tp.sh"), str(out), str(n), *curl_args]
        run(["ip", "netns", "exec", bs.client_ns, "bash", *script], timeout=120)
    peer = judge(parse(out), sampler)
    return {"curl": " ".join(curl_args), "sandgate": ours, "kernel": peer}


def measure(bs: BenchStack, quick: bool) -> dict[str, Any]:
    n = 1 if quick else 3
    work = bs.base / "throughput"
    work.mkdir(mode=0o755, exist_ok=True)
    os.chown(work, UID, UID)
    (work / "tp.sh").write_text(SCRIPT)
    bulk = spawn_ready(
        bs.net,
        bs.net.name("up"),
        [
            "python3",
            str(Path(__file__).with_name("bulk.py")),
            *(UPSTREAM, str(BULK_PORT), str(SIZE), str(work / "bulk.data")),
        ],
    )
    gw = bs.stack.gateway.pid
    try:
        web = pair(bs, work, "web", [URL], n, {"server": bs.world_pid("web"), "gateway": gw}, [])
        direct = pair(
            bs, work, "direct", ["--noproxy", "*", BULK_URL], n,
            {"server": bulk.pid, "gateway": gw}, [f"{UPSTREAM}:{BULK_PORT}"],
        )  # fmt: skip
    finally:
        (work / "bulk.data").unlink(missing_ok=True)
    return {"n": n, "size": SIZE, "web": web, "direct": direct}
