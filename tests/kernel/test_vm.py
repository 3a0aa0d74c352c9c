"""VM guests on the shared test-world gateway: real QEMU boots (TCG here: each is seconds, so
few), each checked for what it reached, what the gateway logged, and what it left behind.

Boots: open mode with and without a NIC (reaches example.com, logged by name), locked mode as
the agent uid (refused, logged by name), prove as root in the guest with and without a NIC, a
runner killed with SIGKILL (cleanup), and a guest that cannot boot in time (a clear error).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from sandgate import cleanup
from sandgate.events.schema import Kind
from sandgate.gateway.config import RUN_ROOT
from sandgate.net import ns
from sandgate.pids import alive
from sandgate.prove.runner import ProveOptions, prove_on
from sandgate.session.stack import Stack
from sandgate.vm import accel, image, qemu
from sandgate.vm.launch import VmOptions
from tests.kernel.conftest import Runner

AGENT_POLICY = Path(__file__).resolve().parents[2] / "examples" / "agent.toml"
VENV_PY = sys.executable
pytestmark = pytest.mark.kernel

if not os.path.exists("/usr/bin/" + qemu.QEMU):
    pytest.skip("QEMU is not installed (./setup.sh test installs it)", allow_module_level=True)


def qemu_of_session(session_prefix: str = "") -> list[int]:
    """QEMU processes of ours (by the -name marker), optionally of one session."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        argv0 = cmd.split(b"\0")[0]
        if argv0.endswith(qemu.QEMU.encode()) and f"{qemu.MARKER}-{session_prefix}".encode() in cmd:
            found.append(int(entry.name))
    return found


def assert_nothing_left(session: str) -> None:
    assert qemu_of_session(session) == [], "a QEMU process outlived its session"
    assert not [n for n in ns.list_ours() if n.endswith(session)], "namespace left"
    assert not (RUN_ROOT / "pids" / f"vm-{session}.json").exists()


@pytest.mark.parametrize("nic", ["tap", "none"])
def test_open_mode_reaches_example_com_and_the_log_names_it(sandbox: Runner, nic: str) -> None:
    result = sandbox.sh(
        "id -u; nproc; "
        "curl -sS -m 20 -o /dev/null -w 'proxied %{http_code}\\n' https://example.com/; "
        "curl -sS -m 20 --noproxy '*' -o /dev/null -w 'direct %{http_code}\\n' http://example.com/",
        mode="open",
        vm=VmOptions(nic="tap" if nic == "tap" else "none"),
        timeout=240,
    )
    out = Path(result.report.output or "").read_text() if result.report.output else ""
    assert out.splitlines()[0] == "0"  # root in the guest by default
    assert out.splitlines()[1] == str(qemu.VCPUS)  # under TCG too: a host thread each
    assert "proxied 200" in out
    # With no NIC, a client that ignores the proxy variables simply has no route.
    assert ("direct 200" in out) == (nic == "tap"), out
    names = {e.name for e in sandbox.events(result) if e.kind in (Kind.HTTP, Kind.DNS)}
    assert "example.com" in names
    # The VM spoke only as its guest: nothing was refused at its link's ingress chain.
    assert not [e for e in sandbox.events(result, Kind.CONN) if e.category == "L2"]
    assert result.report.vm.get("accel") in ("tcg", "kvm")
    assert result.report.vm.get("nic") == nic
    assert "no uid or process" in result.report.vm["attribution"]
    assert_nothing_left(result.session)


def test_locked_mode_refuses_and_the_uid_option_drops_root(sandbox: Runner) -> None:
    # Without a NIC (report 002): the refusal comes from the channel's proxy. A tap guest's
    # refusals, by the gateway's ruleset and proxy, are what prove [tap] below attacks as root.
    result = sandbox.sh(
        "id -u; curl -sS -m 20 -o /dev/null https://example.com/ || echo refused",
        mode="locked",
        uid=61000,
        vm=VmOptions(nic="none", as_uid=True),
        timeout=240,
    )
    out = Path(result.report.output or "").read_text()
    assert out.splitlines()[0] == "61000"
    assert "refused" in out
    denied = [e for e in sandbox.events(result) if e.name == "example.com"]
    assert denied and all(e.verdict == "deny" for e in denied)
    assert_nothing_left(result.session)


def test_nicless_guest_streams_through_the_channel_with_the_key_injected(sandbox: Runner) -> None:
    """Report 002: no NIC, the openai SDK through the channel's proxy door, the real key added
    by the gateway. The server sends event n+1 only once event n was acknowledged (over a
    second connection through the channel): a buffering channel would time out instead."""
    with tempfile.TemporaryDirectory(prefix="sg-vmtest-") as d:
        _stream_through_the_channel(sandbox, Path(d))


def _stream_through_the_channel(sandbox: Runner, work: Path) -> None:
    work.chmod(0o777)  # the session's uid (QEMU runs as it) writes out.txt
    (work / "t.py").write_text(
        textwrap.dedent(
            """
            import os, time, httpx, openai
            key = os.environ["OPENAI_API_KEY"]
            print("placeholder" if key.startswith("sg-openai-") else "REAL KEY VISIBLE")
            client = openai.OpenAI(base_url="https://api.openai.com/v1")
            stream = client.chat.completions.with_raw_response.create(
                model="gpt-sandgate", stream=True, extra_headers={"x-sg-lockstep": "1"},
                messages=[{"role": "user", "content": "one two three"}])
            sid = stream.headers["x-sg-lockstep-id"]
            acks = httpx.Client(headers={"Authorization": "Bearer " + key})
            text, n, gaps, last = "", 0, [], time.monotonic()
            for chunk in stream.parse():
                now = time.monotonic()
                gaps.append(now - last)
                last = now
                acks.post(f"https://api.openai.com/lockstep/{sid}/ack/{n}")
                n += 1
                if chunk.choices:
                    text += chunk.choices[0].delta.content or ""
            print(text)
            print("chunks", n, "max gap ms", round(1000 * max(gaps[1:] or [0])))
            """
        )
    )
    result = sandbox.sh(
        f"{VENV_PY} t.py > out.txt 2>&1",
        workdir=work,
        policy=str(AGENT_POLICY),
        vm=VmOptions(nic="none"),
        timeout=240,
    )
    out = (work / "out.txt").read_text()
    lines = out.splitlines()
    assert lines[:2] == ["placeholder", "echo: one two three"], out
    assert lines[2].startswith("chunks ")
    record = next(e for e in sandbox.events(result, Kind.HTTP) if e.name == "api.openai.com")
    assert record.details["credentials"] == ["injected:openai"]
    assert record.details["tls"] == "inspected"
    assert_nothing_left(result.session)


@pytest.mark.parametrize("nic", ["tap", "none"])
def test_prove_as_root_in_the_vm(stack: Stack, store_path: Path, nic: str) -> None:
    vm = VmOptions(nic="tap" if nic == "tap" else "none")
    result = prove_on(
        stack, ProveOptions(world="test", mode="allowlist", store=str(store_path), vm=vm)
    )
    totals = result.totals()
    assert totals["SKIP"] == 0
    assert len(result.results) >= 80
    assert not result.failed, "\n".join(f"{r.probe}: {r.why}" for r in result.failed)
    if nic == "tap":
        root = [r for r in result.results if r.group == "vm root"]
        assert {r.reason for r in root} >= {
            "deny.spoof_ip",
            "deny.spoof_mac",
            "deny.spoof_arp",
            "deny.ipv6",
            "deny.ethertype",
        }
    else:
        assert len([r for r in result.results if r.group == "vm channel"]) >= 8
        # What goes through the channel is judged and logged as for any guest.
        assert len([r for r in result.results if r.logged == "yes"]) >= 5


def test_a_guest_that_does_not_boot_in_time_is_said_and_removed(sandbox: Runner) -> None:
    result = sandbox("true", mode="locked", vm=VmOptions(boot_timeout=0.5), timeout=60)
    assert result.exit_code == 125
    assert "did not boot within 0.5 s" in (result.message or "")
    assert_nothing_left(result.session)


def test_cleanup_kills_the_qemu_of_a_killed_runner(stack: Stack) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen(
        [sys.executable, "-m", "sandgate", "run", "--instance", stack.instance, "--world",
         "test", "--vm", "--timeout", "300", "-q", "--", "sleep", "250"],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    owned: list[str] = []
    try:
        qemu_pid = None
        deadline = time.monotonic() + 120
        while qemu_pid is None and time.monotonic() < deadline and child.poll() is None:
            for path in (RUN_ROOT / "pids").glob("vm-*.json"):
                raw = json.loads(path.read_text())
                if raw.get("owner") == child.pid and raw.get("pids"):
                    qemu_pid = int(raw["pids"][0])
            time.sleep(0.2)
        assert qemu_pid is not None, child.stderr.read() if child.stderr else ""
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        assert alive(qemu_pid)  # nothing killed it yet: the runner had no chance
        owned = [p.name for p in cleanup.OWNERS.iterdir() if p.read_text() == str(child.pid)]
        netns = [n for n in owned if n.startswith("sg-")]
        assert netns, owned
        result = cleanup.cleanup()
        assert qemu_pid in result.processes, result
        assert not alive(qemu_pid)
        assert set(netns) <= set(result.namespaces), result
        assert not [n for n in netns if ns.exists(n)]
        assert not [c for c in owned if c.startswith("sandgate-") and c not in result.cgroups]
        # The gateway stayed up and still listed the dead session's guest: cleanup took it off.
        sessions = {n.removeprefix("mount-") for n in owned if n.startswith("mount-")}
        assert sessions
        with stack.gateway.client() as ctl:
            guests = ctl.call("status")["guests"]
        assert not [n for n, g in guests.items() if g.get("session") in sessions], guests
        assert [g for g in result.guests if g.startswith(stack.instance + "/")], result
    finally:
        # Should cleanup have missed it, the shared gateway must not keep the slot.
        sessions = {n.removeprefix("mount-") for n in owned if n.startswith("mount-")}
        with stack.gateway.client() as ctl:
            for name, g in ctl.call("status")["guests"].items():
                if g.get("session") in sessions:
                    ctl.call("remove_guest", guest=name)
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(10)


# The guest's job for the boot comparison: its kernel, the boot protocol version its loader
# wrote (boot_params 0x206: the bzImage's own header, or 2.12 from the kernel's PVH entry), its
# command line and its clock.
PROBE_JOB = (
    "cat /proc/sys/kernel/osrelease; od -An -tx1 -j518 -N2 /sys/kernel/boot_params/data; "
    "cat /proc/cmdline; cat /sys/devices/system/clocksource/clocksource0/current_clocksource"
)
PVH_PROTOCOL = "0c 02"  # 2.12, little-endian


def _boot_directly(tmp: Path, kernel: Path, initrd: Path, a: accel.Accel) -> list[str]:
    """One boot of the built-in guest without a gateway or NIC: the job's output lines."""
    share = tmp / "share"
    for area in ("vm", "home", "tmp", "run", "vartmp", "shm"):
        (share / area).mkdir(parents=True, exist_ok=True)
    (tmp / "work").mkdir(exist_ok=True)
    job = qemu.Job(("/bin/sh", "-c", PROBE_JOB), {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    (share / "vm" / "job.sh").write_text(qemu.job_script(job))
    spec = qemu.VmSpec(f"test-boot-{tmp.name}", kernel, initrd, share, tmp / "work", a, None)
    proc = subprocess.run(qemu.argv(spec, tmp / "console.log"), stdin=subprocess.DEVNULL,
                          capture_output=True, timeout=240, check=False)  # fmt: skip
    console = (tmp / "console.log").read_text(errors="replace")
    assert (share / "vm" / "exit").read_text().strip() == "0", console[-2000:]
    return proc.stdout.decode(errors="replace").replace("\r", "").split("\n")


def test_the_unpacked_kernel_boots_as_the_bzimage_does(tmp_path: Path) -> None:
    # Under TCG the guest boots the ELF unpacked from its bzImage (PVH, no decompressor): the
    # same kernel and job result as the bzImage, another loader, the TCG command line, and a
    # TSC clock (acpi=off would leave it on jiffies).
    guest = image.ensure()
    tcg = accel.Accel("tcg", "test")
    assert guest.pvh is not None and guest.boot_kernel(tcg) == guest.pvh
    packed = _boot_directly(tmp_path / "bz", guest.kernel, guest.initrd, tcg)
    pvh = _boot_directly(tmp_path / "pvh", guest.boot_kernel(tcg), guest.initrd, tcg)
    assert packed[0] == pvh[0] == guest.release, (packed, pvh)
    own = guest.kernel.read_bytes()[0x206:0x208].hex(" ")
    assert (packed[1].strip(), pvh[1].strip()) == (own, PVH_PROTOCOL) and own != PVH_PROTOCOL
    assert packed[2] == pvh[2] and " ".join(qemu.TCG_CMDLINE) in pvh[2]
    assert packed[3].startswith("tsc") and pvh[3].startswith("tsc"), (packed, pvh)
