"""HTTP through the gateway, beside the same transfer routed by the kernel alone, in pairs.

Two pairs:

``web``: ``http://203.0.113.10/bytes/N`` from the test world's web server, the path an agent's
HTTP takes: from inside a sandbox in open mode, TCP 80 is redirected to the gateway's egress
proxy (user space), which relays it out through the world's LAN and router.

``direct``: ``http://10.77.0.250:9000/`` from a sendfile server on the world's LAN (bulk.py; the
kernel does the sending), on a port no proxy takes, with ``curl --noproxy '*'`` (the sandbox's
environment names the gateway's explicit proxy): allowed for the session with
``--allow 10.77.0.250:9000``, so this is the gateway's kernel path alone (nftables forward chain,
masquerade, the new flow logged once).

The peer for both: the peer guest namespace through the peer gateway namespace, a plain router
(ip_forward, no nftables at all) on the same LAN, to the same servers.

The method (issue 13: a ratio of two kernel paths with one curl at ~1 core, on 2 shared cores
whose speed moves 2x within an hour, read 0.73x and 1.17x an hour apart). Both clients stay
put (proxy_agents.py: one sandbox session, one shell in the peer guest), and each round is a
pair of transfers taken back to back, the first of the pair alternating round by round, so a
neighbour's load falls on both sides of a pair alike. The row's ratio is the median of the
per-pair ratios, with their p10-p90 beside it. Transfers are 256 MiB (``SIZE``): a
transfer's fixed part (connect, the new flow's verdicts, first byte: ``setup_ms``, 4 ms
through sandgate, 1.5 ms routed on 2026-12-02) is 1-2 % of it, so twelve short pairs fit where
three long ones did (256 MiB vs 1 GiB pairs: docs/NOTES.md).

CPU per GB, each side: the client (bash's ``time`` around the step: exact), the server and the
gateway daemon (/proc ticks, sampled every 50 ms), the machine's softirq and busy time (which
include the neighbours'). The figure that travels to a free machine is the sandgate path's
added CPU per GB over the kernel path's (``added_cpu_s_per_GB``, median of the pairs). A side
whose client is at >= 0.9 of a core is marked client-bound (``limit``): its MB/s says what curl
can take, not what the path can carry. ``streams`` > 1 runs that many curls at once (each
``SIZE``), for a client that is not the bottleneck.
"""

from __future__ import annotations

import math
import os
import threading
from pathlib import Path
from typing import Any

from bench.common import (
    Sampler,
    gateway_pids,
    log,
    median,
    paired,
    pct,
    spawn_ready,
    stdout_to,
)
from bench.proxy_agents import SCRIPT_LIB, Agent, Step, read_steps, words
from bench.stack import UPSTREAM, BenchStack
from sandgate.session.runner import RunOptions
from sandgate.world.topology import HOSTS

UID = 61000
SIZE = int(os.environ.get("SANDGATE_TP_SIZE", str(256 << 20)))  # bytes a transfer (each stream)
ROUNDS, QUICK_ROUNDS = int(os.environ.get("SANDGATE_TP_ROUNDS", "12")), 4
STREAMS = int(os.environ.get("SANDGATE_TP_STREAMS", "1"))
BULK_PORT = 9000
BULK_URL = f"http://{UPSTREAM}:{BULK_PORT}/"
CLIENT_BOUND = 0.9  # cores: at this, curl is the bottleneck of its side
CURL_FMT = r"%{size_download} %{time_total} %{time_starttransfer}\n"

# ``par N cmd...``: N copies at once (bash's ``time`` counts every child it reaped).
LIB = SCRIPT_LIB + 'par() { n=$1; shift; for _ in $(seq "$n"); do "$@" & done; wait; }\n'


def web_url(size: int) -> str:
    return f"http://{HOSTS['example.com']}/bytes/{size}"


def transfer_line(tag: str, side: str, url: str, curl: list[str], streams: int) -> str:
    argv = ["curl", "-sS", *curl, "-o", "/dev/null", "-w", CURL_FMT, url]
    return words(["step", "bulk", f"{tag}.{side}", "par", str(streams), *argv])


# -- judging ---------------------------------------------------------------------------------


def judge_step(step: Step, sampler: Sampler, server: str) -> dict[str, Any]:
    """One transfer (all its streams): MB/s over the step's wall time, and CPU per side."""
    got = [line.split() for line in step.out.splitlines() if len(line.split()) == 3]
    nbytes = sum(float(f[0]) for f in got)
    wall = max(step.end - step.start, 1e-9)
    # One stream: curl's own time (no bash fork in it); several: the step's wall clock.
    seconds = float(got[0][1]) if len(got) == 1 else wall
    # Until the first byte: connect, the new flow's logging and verdicts, the request.
    setup = max((float(f[2]) for f in got), default=math.nan)
    w = sampler.window(step.start, step.end)
    cores = {
        "client": step.cpu / wall,
        "server": w.get(f"{server}_cores", math.nan),
        "gateway": w.get("gateway_cores", math.nan),
        "softirq": w["softirq_cores"],
        "all": w["system_busy_cores"],
    }
    gb = nbytes / 1e9
    per_gb = {k: v * wall / gb if gb else math.nan for k, v in cores.items()}
    # Ours: client, server, gateway daemon (a veth runs the forwarding in its sender's softirq,
    # so a direction's forwarding, conntrack and NAT are in these); softirq and all include
    # the neighbours'.
    own = step.cpu + wall * (cores["server"] + cores["gateway"])
    return {
        "MB_s": nbytes / seconds / 1e6 if seconds > 0 else 0.0,
        "bytes": nbytes,
        "seconds": seconds,
        "setup_ms": setup * 1e3,
        "ok": len(got) >= 1 and all(float(f[0]) >= SIZE for f in got),
        "error": step.err.strip()[:300],
        "cores": cores,
        "cpu_s_per_GB_by": per_gb,
        "cpu_s_per_GB": own / gb if gb else math.nan,
        "first": False,
    }


def side_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    rates = [r["MB_s"] for r in runs]
    med = median(rates)
    at = min(runs, key=lambda r: abs(r["MB_s"] - med)) if runs else {}
    by = {k: median([r["cpu_s_per_GB_by"][k] for r in runs]) for k in runs[0]["cores"]}
    cores = {k: median([r["cores"][k] for r in runs]) for k in runs[0]["cores"]}
    return {
        "median_MB_s": med,
        "p10_MB_s": pct(rates, 10),
        "p90_MB_s": pct(rates, 90),
        "cpu_s_per_GB": median([r["cpu_s_per_GB"] for r in runs]),
        "setup_ms": median([r["setup_ms"] for r in runs]),
        "cpu_s_per_GB_by": by,  # client, server, gateway, softirq, all (medians)
        "cores": cores,  # medians over the runs
        "runs": runs,
        "at_median": {f"{k}_cores": v for k, v in at.get("cores", {}).items()},
        "client_bound": cores["client"] >= CLIENT_BOUND,
        "limit": limit(cores),
        "errors": [r["error"] for r in runs if not r["ok"] and r["error"]],
    }


def limit(c: dict[str, float]) -> str:
    """Which side saturates, in words (2 cores: 1.0 is one core busy)."""
    parts = []
    if c.get("client", 0) >= CLIENT_BOUND:
        parts.append(f"client-bound: curl {c['client']:.2f} cores")
    for key, name in (("server", "the server"), ("gateway", "the gateway process")):
        if c.get(key, 0) >= 0.85:
            parts.append(f"{name} saturates ({c[key]:.2f} cores)")
    if c.get("all", 0) >= 1.85:
        parts.append(f"both cores busy ({c['all']:.2f})")
    return "; ".join(parts) or "no single process saturates"


# -- the run ------------------------------------------------------------------------------------


def sandbox_agent(bs: BenchStack, work: Path, allow: list[str], failures: list[str]) -> Agent:
    """One open-mode session for every round: the sandbox's client stays put."""
    agent = Agent.prepare("sandgate", work, UID)
    (work / "agent.sh").write_text((work / "agent.sh").read_text().replace(SCRIPT_LIB, LIB))
    opts = RunOptions(
        command=["bash", "/work/agent.sh", "/work"],
        mode="open",
        allow=allow,
        world="test",
        store=bs.store,
        workdir=work,
        timeout=900,
        uid=UID,
        label="bench throughput",
        stop=threading.Event(),
    )
    agent.start_session(bs.stack, opts, failures)
    return agent


def peer_agent(bs: BenchStack, work: Path) -> Agent:
    agent = Agent.prepare("kernel", work, 0)
    (work / "agent.sh").write_text((work / "agent.sh").read_text().replace(SCRIPT_LIB, LIB))
    agent.start_in_netns(bs.net, bs.client_ns)
    return agent


def measure(bs: BenchStack, quick: bool) -> dict[str, Any]:
    rounds = QUICK_ROUNDS if quick else ROUNDS
    work = bs.base / "throughput"
    work.mkdir(mode=0o755, exist_ok=True)
    bulk = spawn_ready(
        bs.net,
        bs.net.name("up"),
        [
            "python3",
            str(Path(__file__).with_name("bulk.py")),
            *(UPSTREAM, str(BULK_PORT), str(SIZE), str(work / "bulk.data")),
        ],
    )
    gw = gateway_pids(bs.stack.gateway)
    pids: dict[str, int | tuple[int, ...]] = {
        "gateway": gw,
        "web": bs.world_pid("web"),
        "bulk": bulk.pid,
    }
    pairs = {  # curl's arguments (the URL last), the session's --allow, the server's name
        "web": ([web_url(SIZE)], [], "web"),
        "direct": (["--noproxy", "*", BULK_URL], [f"{UPSTREAM}:{BULK_PORT}"], "bulk"),
    }
    # SANDGATE_TP_PAIRS=direct: only that pair (to iterate on one of them).
    only = [k for k in os.environ.get("SANDGATE_TP_PAIRS", "").split(",") if k]
    tags = [t for t in pairs if not only or t in only]
    failures: list[str] = []
    out: dict[str, Any] = {
        "n": rounds,
        "size": SIZE,
        "streams": STREAMS,
        "method": "pairs back to back, first alternating; ratio = median of per-pair ratios",
    }
    allow = [a for t in tags for a in pairs[t][1]]
    agents: list[Agent] = []
    try:
        with Sampler(pids) as sampler, stdout_to(bs.base / "throughput.out"):
            ours = sandbox_agent(bs, work / "sandgate", allow, failures)
            agents.append(ours)
            peer = peer_agent(bs, work / "kernel")
            agents.append(peer)
            for tag in tags:
                curl = pairs[tag][0]
                log(f"throughput {tag}: {rounds} pairs of {STREAMS} x {SIZE >> 20} MiB")
                url = curl[-1]
                for r in range(rounds):
                    order = [("sandgate", ours), ("kernel", peer)]
                    for side, agent in order if r % 2 == 0 else order[::-1]:
                        agent.do(transfer_line(tag, side, url, curl[:-1], STREAMS))
        steps = {a.side: read_steps(a.work) for a in agents}
    finally:
        for agent in agents:
            agent.close()
        (work / "bulk.data").unlink(missing_ok=True)
    for tag in tags:
        sides: dict[str, list[dict[str, Any]]] = {}
        for side in ("sandgate", "kernel"):
            mine = [s for s in steps.get(side, []) if s.key == f"{tag}.{side}"]
            sides[side] = [judge_step(s, sampler, pairs[tag][2]) for s in mine]
            for r, run in enumerate(sides[side]):
                run["first"] = (r % 2 == 0) == (side == "sandgate")
        if not sides["sandgate"] or len(sides["sandgate"]) != len(sides["kernel"]):
            failures.append(f"{tag}: {len(sides['sandgate'])} vs {len(sides['kernel'])} runs")
            continue
        out[tag] = {
            "curl": " ".join(pairs[tag][0]),
            "sandgate": side_summary(sides["sandgate"]),
            "kernel": side_summary(sides["kernel"]),
            "pairs": paired(sides["sandgate"], sides["kernel"]),
        }
    out["failures"] = failures
    return out
