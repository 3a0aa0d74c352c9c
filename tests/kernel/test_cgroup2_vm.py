"""cgroup v2, for real: this host has v1 controllers (a stock Debian 12 host is v2 under
systemd), so sandbox/limits.py's v2 path runs inside the built-in VM guest, whose kernel mounts
a unified tree with every controller. One boot (TCG: seconds)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from sandgate.sandbox import limits
from sandgate.vm import qemu
from sandgate.vm.launch import VmOptions
from tests.kernel.conftest import Runner

pytestmark = pytest.mark.kernel
SRC = Path(__file__).resolve().parents[2] / "src" / "sandgate"
SCRIPT = Path(__file__).resolve().parent / "vm_scripts" / "cgroup2_check.py"

if not os.path.exists("/usr/bin/" + qemu.QEMU):
    pytest.skip("QEMU is not installed (./setup.sh test installs it)", allow_module_level=True)


def test_limits_on_a_cgroup_v2_kernel(sandbox: Runner) -> None:
    with tempfile.TemporaryDirectory(prefix="sandgate-cg2-") as tmp:
        work = Path(tmp)
        # The guest sees the host's /usr, /opt (the venv) but not this checkout: a copy in /work.
        shutil.copytree(
            SRC, work / "src" / "sandgate", ignore=shutil.ignore_patterns("__pycache__")
        )
        shutil.copy(SCRIPT, work / "check.py")
        os.chown(tmp, 61000, 61000)  # the session uid writes there (the VM runs as root)
        result = sandbox.sh(
            "mount -t cgroup2 cgroup2 /sys/fs/cgroup && "
            "PYTHONPATH=/work/src PYTHONDONTWRITEBYTECODE=1 /opt/sandgate/venv/bin/python "
            "/work/check.py",
            mode="locked",
            vm=VmOptions(nic="none"),
            workdir=work,
            timeout=300,
        )
        out = Path(result.report.output or "").read_text() if result.report.output else ""
    line = next((x for x in out.splitlines() if x.startswith("CGROUP2 ")), None)
    assert line is not None, f"exit {result.exit_code}: {out[-2000:]}"
    got = json.loads(line.removeprefix("CGROUP2 "))
    assert got["version"] == 2 and {"pids", "memory", "cpu"} <= set(got["controllers"]), got
    pids = got["pids"]
    assert pids["max"] == "40" and pids["cpu.max"] == "50000 100000"
    assert pids["swap.max"] in ("0", None)  # swap off where the kernel accounts it
    assert pids["hit"] == ["limit.pids"] and 30 <= pids["peak"] <= 40, pids
    assert pids["removed"]
    mem = got["memory"]
    assert mem["exit"] == -9 and mem["oom_kills"] >= 1 and mem["hit"] == ["limit.memory"], mem
    assert 40 << 20 <= mem["peak"] <= 48 << 20, mem
    assert mem["removed"]
    gw = got["gateway"]
    assert gw["memory.min"] == str(64 << 20) and gw["holds_daemon"], gw
    assert gw["cpu.weight"] == str(100 * limits.GATEWAY_CPU_WEIGHT), gw
    assert not [n for n in gw["notes"] if "CPU weight" in n], gw
    assert gw["oom_score_adj"] == "-900" and gw["removed"], gw
