"""The homelab gateway VM (issue 10): the daemon on handed links, configured from exported files
only, proved from every guest before and after a reboot; fail closed when the daemon dies;
bad links refused with nothing applied.

Everything runs in namespaces of the test's own (sg-<instance>-*): the hypervisor, the gateway
VM, the agent VMs, and the test world's LAN and "internet". Nothing reaches the host's network.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandgate.net import handed as hd
from sandgate.net import ns
from sandgate.prove.homelab import GuestProve, prove_homelab
from sandgate.world.homelab import Homelab, default_policy
from sandgate.world.topology import MODEL

pytestmark = pytest.mark.kernel
ROOT = os.geteuid() == 0
REPO = Path(__file__).parents[2]
HOMELAB = REPO / "examples" / "homelab.toml"
SRC = REPO / "src"


@pytest.fixture
def root() -> None:
    if not ROOT:
        pytest.skip("needs root")


def _report_001_holds(proves: list[GuestProve]) -> None:
    for p in proves:
        bad = [(r.probe, r.why) for r in p.result.results if r.result != "PASS"]
        assert not bad, f"{p.guest} boot {p.boot}: {bad}"
        assert Counter(r.result for r in p.result.results)["PASS"] >= 40
        groups = {r.group for r in p.result.results}
        # Report 001's attack list: the NAS, the hypervisor, the router, the other agent, the
        # gateway's own ports, metadata, hardcoded DNS, the LAN broadcast.
        assert {"lan", "hypervisor", "lateral", "gateway", "metadata", "dns"} <= groups
        probes = {r.probe for r in p.result.results}
        assert "LAN broadcast (netbios)" in probes and "NAS 445/tcp" in probes


def test_prove_homelab_from_the_files_and_after_a_reboot(root: None) -> None:
    """The exported example's files, both guests namespaces. The world's own policy is proved
    by the QEMU test below (one guest a namespace, the other a VM)."""
    proves = prove_homelab(str(HOMELAB), f"hp{os.getpid() % 10000}")
    assert {(p.guest, p.boot) for p in proves} == {(g, b) for g in ("eth1", "eth2") for b in (1, 2)}
    _report_001_holds(proves)


@pytest.mark.skipif(not Path("/usr/bin/qemu-system-x86_64").exists(), reason="needs QEMU")
def test_prove_homelab_with_a_qemu_guest(root: None) -> None:
    """--vm: one guest is a real QEMU VM (TCG) on its bridge, the driver in it as root; two
    boots of it, one per gateway boot. Its rows say it is QEMU's; none fail or skip."""
    instance = f"hq{os.getpid() % 10000}"
    proves = prove_homelab(None, instance, vm=True)
    assert {(p.guest, p.boot) for p in proves} == {
        (g, b) for g in ("eth1", "eth2 (qemu vm)") for b in (1, 2)
    }
    _report_001_holds(proves)
    for p in proves:
        assert all(row["guest"] == p.guest for row in p.rows())
    left = subprocess.run(["pgrep", "-f", f"sandgate-vm-homelab-sg-{instance}-"],
                          capture_output=True, check=False)  # fmt: skip
    assert left.returncode == 1, "a QEMU guest outlived the homelab"


def _curl(netns: str, url: str, timeout: int = 3) -> bool:
    done = subprocess.run(
        [*ns.nsenter_argv(netns), "curl", "-s", "-o", "/dev/null", "-m", str(timeout), url],
        capture_output=True,
        check=False,
    )
    return done.returncode == 0


@pytest.fixture
def lab(root: None) -> Iterator[Homelab]:
    with Homelab(f"hf{os.getpid() % 10000}", default_policy()) as running:
        yield running


def test_a_dead_daemon_stops_forwarding_by_itself(lab: Homelab) -> None:
    coder = lab.guests[0]
    model = f"http://{MODEL}:8000/v1/models"
    assert _curl(coder.netns, model)
    lab.kill_daemon()  # SIGKILL: nothing of the daemon runs any more; its tables stay
    deadline = time.monotonic() + hd.ALIVE_FOR + 10
    while time.monotonic() < deadline and _curl(coder.netns, model, timeout=1):
        time.sleep(0.5)
    assert not _curl(coder.netns, model, timeout=2), "forwarding went on without the daemon"
    forwarding = subprocess.run(
        ["ip", "netns", "exec", lab.gateway_ns, "sysctl", "-n", "net.ipv4.ip_forward"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert forwarding.stdout.strip() == "1", "the rule must hold by itself, not the sysctl"
    lab._start_daemon(lab.out / "gateway/etc")  # the unit's Restart=always
    assert _curl(coder.netns, model)


def test_exported_files_pass_nft_check(root: None, tmp_path: Path) -> None:
    out = tmp_path / "llm-gw"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "sandgate",
            "export",
            "gateway-vm",
            "--policy",
            str(HOMELAB),
            "--out",
            str(out),
        ],
        env={**os.environ, "PYTHONPATH": str(SRC)},
        check=True,
        capture_output=True,
    )
    # A namespace of its own that vanishes with the command: the host's ruleset is not read.
    for argv in (
        ["nft", "-c", "-j", "-f", str(out / "gateway/etc/sandgate/sandgate.nft.json")],
        ["nft", "-c", "-f", str(out / "hypervisor/etc/nftables.d/sandgate-host-drop.nft")],
    ):
        done = subprocess.run(["unshare", "-n", *argv], capture_output=True, text=True, check=False)
        assert done.returncode == 0 and not done.stderr.strip(), (argv, done.stderr)


@pytest.fixture
def vm_ns(root: None) -> Iterator[str]:
    """A bare "gateway VM": eth0 and eth1 up with carrier, eth2 whose peer is down."""
    name, peer = f"sg-gwbad{os.getpid() % 10000}", f"sg-gwbadp{os.getpid() % 10000}"
    for n in (name, peer):
        ns.create(n)
    try:
        for ifname in ("eth0", "eth1", "eth2"):
            subprocess.run(
                [
                    "ip",
                    "-n",
                    name,
                    "link",
                    "add",
                    ifname,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    f"p{ifname}",
                    "netns",
                    peer,
                ],
                check=True,
            )
            subprocess.run(["ip", "-n", name, "link", "set", ifname, "up"], check=True)
        for p in ("peth0", "peth1"):
            subprocess.run(["ip", "-n", peer, "link", "set", p, "up"], check=True)
        yield name
    finally:
        for n in (name, peer):
            ns.remove(n)


@pytest.mark.parametrize(
    ("links", "message"),
    [
        (["--uplink", "eth0", "--guest", "eth9=coder"], "no interface eth9"),
        (["--uplink", "eth0", "--guest", "eth2=coder"], "eth2 has no carrier"),
        (["--uplink", "eth0", "--guest", "eth1=coder", "--guest", "eth1=orchestrator"], "twice"),
        (["--uplink", "eth1", "--guest", "eth1=coder"], "the uplink and a guest link"),
    ],
)
def test_bad_links_are_refused_and_nothing_applied(
    vm_ns: str, tmp_path: Path, links: list[str], message: str
) -> None:
    before = _state(vm_ns)
    done = subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            vm_ns,
            sys.executable,
            "-m",
            "sandgate",
            "gateway",
            "--policy",
            str(HOMELAB),
            *links,
        ],
        env={**os.environ, "PYTHONPATH": str(SRC), "SANDGATE_RUN": str(tmp_path / "run")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in " ".join((done.stdout + done.stderr).split())
    assert _state(vm_ns) == before


def _state(netns: str) -> tuple[str, ...]:
    def run(*argv: str) -> str:
        return subprocess.run(
            ["ip", "netns", "exec", netns, *argv], capture_output=True, text=True, check=False
        ).stdout

    return (
        run("nft", "list", "ruleset"),
        run("ip", "-4", "-o", "addr"),
        run("sysctl", "-n", "net.ipv4.ip_forward", "net.ipv6.conf.all.disable_ipv6"),
        run("iptables-nft-save"),
    )


def test_sigterm_leaves_forwarding_closed(lab: Homelab) -> None:
    """A stopped daemon (systemctl stop) leaves no guest able to go anywhere."""
    assert lab.daemon is not None
    lab.daemon.send_signal(signal.SIGTERM)
    lab.daemon.wait(30)
    lab.daemon = None
    assert not _curl(lab.guests[1].netns, f"http://{MODEL}:8000/v1/models", timeout=2)
