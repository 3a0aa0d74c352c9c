"""NFLOG events lost at 20,000 drops per second.

From inside a sandbox (open mode), a paced sender fires UDP packets at the NAS
(10.77.0.20:9, private, so denied) at 20k/s for 5 s. Every one is dropped at the gateway's
deny site, which counts it exactly (nftables counter) and logs it through NFLOG, rate-limited
by ``drop_log_rate`` (the bench gateway raises it to 100k/s so no drop is suppressed by
design; the default, 500/s per site, would keep ~3,500 of 100,000).

    sent        what the sender's sendto() accepted
    counted     the gateway's counter for the site (from remove_guest's reply)
    logged      sum of ``count`` over the session's conn events for 10.77.0.20:9 that came
                from the drop log (events ``decide()`` inferred from the guest side's records
                are counted apart: they stand for flows whose drops were not logged)
    lost        ``nflog_lost`` (sequence gaps) of the control ``status``, before and after
    suppressed  counted - logged - lost: what the rate limit kept out, by design
"""

from __future__ import annotations

import os
from typing import Any

from bench.common import Sampler, gateway_pids, log
from bench.stack import DROP_LOG_RATE, BenchStack
from sandgate.events.schema import Kind
from sandgate.events.store import Store
from sandgate.session.runner import RunOptions, run_in
from sandgate.world.topology import NAS

UID = 61000
PORT = 9
RATE = 20_000

FLOOD = """\
import socket, sys, time
dst, port, rate = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
secs, out = float(sys.argv[4]), sys.argv[5]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
payload = b"sandgate-bench" * 2
sent = errors = 0
start = time.time()
t0 = time.perf_counter()
end = t0 + secs
while True:
    now = time.perf_counter()
    if now >= end:
        break
    due = int((now - t0) * rate)
    while sent + errors < due:
        try:
            s.sendto(payload, (dst, port))
            sent += 1
        except OSError:
            errors += 1
    time.sleep(0.0005)
with open(out, "w") as f:
    f.write(f"{sent} {errors} {start} {time.time()}\\n")
"""


def measure(bs: BenchStack, quick: bool) -> dict[str, Any]:
    seconds = 2.0 if quick else 5.0
    work = bs.base / "nflog"
    work.mkdir(mode=0o755, exist_ok=True)
    os.chown(work, UID, UID)
    (work / "flood.py").write_text(FLOOD)
    out = work / "flood.out"
    with bs.stack.gateway.client() as ctl:
        before = ctl.call("status")
    log(f"nflog: {RATE}/s UDP drops to {NAS}:{PORT} for {seconds:g} s from a sandbox")
    opts = RunOptions(
        command=[
            "python3",
            "/work/flood.py",
            *(NAS, str(PORT), str(RATE), str(seconds), f"/work/{out.name}"),
        ],
        mode="open",
        world="test",
        store=bs.store,
        workdir=work,
        timeout=seconds + 60,
        label="bench nflog",
    )
    with Sampler({"gateway": gateway_pids(bs.stack.gateway)}) as sampler:
        result = run_in(bs.stack, opts)
    with bs.stack.gateway.client() as ctl:
        after = ctl.call("status")
    sent, errors, start, end = out.read_text().split()
    store = Store(bs.store)
    try:
        # The exact counters remove_guest read, as the session's row keeps them for its report
        # (the runner's removal is pipelined behind the drift snapshot: no call to wrap).
        row = store.session(result.session)
        counters: dict[str, Any] = dict((row.details if row else {}).get("counters") or {})
        events = [
            e
            for e in store.events(session=result.session, kinds=[Kind.CONN])
            if e.dst == NAS and e.port == PORT
        ]
    finally:
        store.close()
    # The site(s) that dropped them: named in the events, else every deny site of the guest.
    sites = {e.details.get("site") for e in events} & set(counters)
    counted = sum(
        int(c["packets"])
        for prefix, c in counters.items()
        if (prefix in sites if sites else c.get("verdict") == "deny")
    )
    inferred = sum(e.count for e in events if e.details.get("inferred"))
    logged = sum(e.count for e in events if not e.details.get("inferred"))
    lost = int(after.get("nflog_lost", 0)) - int(before.get("nflog_lost", 0))
    w = sampler.window(float(start), float(end))
    return {
        "rate": RATE,
        "seconds": seconds,
        "drop_log_rate": DROP_LOG_RATE,
        "sent": int(sent),
        "send_errors": int(errors),
        "achieved_pps": int(sent) / max(float(end) - float(start), 1e-9),
        "counted": counted,
        "logged": logged,
        "events": len(events),
        "inferred": inferred,
        "lost": lost,
        "suppressed": counted - logged - lost,
        "gateway_cores": w.get("gateway_cores", float("nan")),
        "system_busy_cores": w["system_busy_cores"],
        "counters": counters,
    }
