"""Run as root inside the built-in VM guest, where the kernel has a cgroup v2 tree with every
controller (this host's is v1): sandbox/limits.py's v2 path, for real. Prints one JSON line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from sandgate.policy.limits import Limits
from sandgate.sandbox import limits

out: dict[str, object] = {}
h = limits.detect()
out["version"], out["controllers"], out["missing"] = h.version, sorted(h.dirs), list(h.missing)

# A pids limit: 300 sleepers asked for, the cgroup refuses forks past 40.
cg = limits.create("sandgate-v2pids", Limits(pids=40, memory=256 << 20, cpus=0.5), h)
spawn = "i=0; while [ $i -lt 300 ]; do sleep 5 & i=$((i+1)); done 2>/dev/null; echo spawned"
subprocess.run([*cg.prefix_argv(), "/bin/sh", "-c", f"({spawn})"], check=False)
u = cg.usage()
d = cg.dir("pids")
assert d is not None
out["pids"] = {
    "peak": u.pids_peak,
    "hit": u.hit,
    "max": (d / "pids.max").read_text().strip(),
    "cpu.max": (d / "cpu.max").read_text().strip(),
    "swap.max": (d / "memory.swap.max").read_text().strip()
    if (d / "memory.swap.max").exists()
    else None,
    "notes": cg.notes,
}
cg.remove()  # kills what is left in it (the sleepers) and removes the directory
out["pids"]["removed"] = not d.exists()  # type: ignore[index]

# A memory limit: 200 MiB asked for under 48 MiB is killed, and the peak says where.
cg = limits.create("sandgate-v2mem", Limits(pids=64, memory=48 << 20), h)
grab = "b = bytearray(200 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('survived')"
r = subprocess.run([*cg.prefix_argv(), "/opt/sandgate/venv/bin/python", "-c", grab], check=False)
u = cg.usage()
out["memory"] = {
    "exit": r.returncode,
    "peak": u.memory_peak,
    "oom_kills": u.oom_kills,
    "hit": u.hit,
}
d = cg.dir("memory")
cg.remove()
assert d is not None
out["memory"]["removed"] = not d.exists()  # type: ignore[index]

# The gateway's protection: memory.min reserved, and released again.
daemon = subprocess.Popen(["sleep", "60"])  # stands in for the gateway daemon
notes = limits.protect_gateway("v2check", daemon.pid, h)
gw = Path(h.dirs["memory"]) / f"{limits.GATEWAY_PREFIX}v2check"
out["gateway"] = {
    "notes": notes,
    "memory.min": (gw / "memory.min").read_text().strip(),
    "cpu.weight": (gw / "cpu.weight").read_text().strip(),
    "holds_daemon": str(daemon.pid) in (gw / "cgroup.procs").read_text().split(),
    "oom_score_adj": Path(f"/proc/{daemon.pid}/oom_score_adj").read_text().strip(),
}
limits.release_gateway("v2check", h)
daemon.kill()
out["gateway"]["removed"] = not gw.exists()  # type: ignore[index]
print("CGROUP2 " + json.dumps(out))
