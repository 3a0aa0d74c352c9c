"""Report 001's homelab in namespaces (issue 10, part 3), configured from exported files only.

    [sg-I-vm1 "coding VM"] eth0 ─ vmbr11 ─ eth1 ┐  (bridges in sg-I-hv, "the hypervisor")
    [sg-I-vm2 "orchestrator"] eth0 ─ vmbr12 ─ eth2 ┤
                                 [sg-I-gwvm "llm-gw"] eth0 ─ br0 (the test world's LAN) ─ router
                                                          ─ "internet" (world/topology.py)

The hypervisor has one bridge per guest (from the exported ifupdown stanzas: ``bridge-ports
none``, no address, the ``post-up`` sysctls) and loads the exported host-drop table; the
"gateway VM" gets what a VM's own OS gives it (its interfaces, the uplink's address and route,
a resolv.conf) and then *only* the exported files: the sysctl drop-in, the ruleset
(``nft -j -f``), the forwarding switch, and the daemon started with the exported unit's
``ExecStart`` (``/etc/sandgate`` read from the export directory). ``reboot`` deletes the
gateway's namespace (every rule, sysctl and address with it) and does all of that again.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import IO, Any

from sandgate import cleanup
from sandgate.errors import SandgateError
from sandgate.export.gatewayvm import ETC, export_files
from sandgate.net import handed as hd
from sandgate.net import ns
from sandgate.net.compile import GuestLink
from sandgate.policy.load import Policy, load_policy
from sandgate.world.info import WorldInfo
from sandgate.world.topology import GATEWAY_UPLINK, RESOLVER, ROUTER, TestWorld

READY_TIMEOUT = 60.0
UPLINK_PORT = "hlgw0"  # the gateway VM's uplink as a port of the LAN's bridge


@dataclass
class GuestVm:
    """A namespace standing in for an agent VM: root inside, IPv6 on, one NIC on its bridge."""

    netns: str
    guest: hd.HandedGuest
    link: GuestLink
    peer: subprocess.Popen[bytes] | None = None  # a server on 8080: the other agent's target
    qemu: bool = False  # a real QEMU VM: this namespace is only its wire (eth0 bridged to tap0)


@dataclass
class Homelab:
    instance: str
    policy_path: Path
    world: TestWorld = field(init=False)
    info: WorldInfo | None = None
    base: Path | None = None
    policy: Policy | None = None
    links: hd.Handed | None = None
    guests: list[GuestVm] = field(default_factory=list)
    daemon: subprocess.Popen[str] | None = None
    boots: int = 0
    qemu_guest: bool = False  # --vm: the last guest is a real QEMU VM (prove/homelab.py runs it)
    _namespaces: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.world = TestWorld(self.instance)

    def ns(self, role: str) -> str:
        return f"sg-{self.instance}-{role}"

    @property
    def gateway_ns(self) -> str:
        return self.ns("gwvm")

    @property
    def out(self) -> Path:
        assert self.base is not None
        return self.base / "llm-gw"

    @property
    def home(self) -> Path:
        assert self.base is not None
        return self.base / "home"

    @property
    def store(self) -> Path:
        return self.home / "events.db"

    # -- build and tear down ------------------------------------------------------------------

    def up(self) -> Homelab:
        try:
            self._up()
        except BaseException:
            self.down()
            raise
        return self

    def _up(self) -> None:
        # Its sg-<instance>-* namespaces are left alone by `sandgate cleanup` meanwhile (one run
        # beside another: a concurrent cleanup removed a lab's LAN namespace mid-build).
        cleanup.own(f"instance-{self.instance}")
        self.base = Path(tempfile.mkdtemp(prefix=f"sandgate-homelab-{self.instance}-"))
        self.base.chmod(0o755)
        self.policy = load_policy(str(self.policy_path))
        self.links = hd.handed_from(self.policy, None, [])
        exported = export_files(
            self.policy, self.policy_path.read_bytes(), self.links, _sandgate_bin()
        ).files
        for rel, data in exported.items():
            target = self.out / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        self.info = self.world.up()
        self._hypervisor()
        pool = self.policy.file.gateway.pool
        for i, (g, link) in enumerate(zip(self.links.guests, self.links.links(pool), strict=True)):
            self.guests.append(self._guest_vm(f"vm{i + 1}", g, link))
        if self.qemu_guest and self.guests:
            self._qemu_wire(self.guests[-1])
        self.boot()

    def down(self) -> None:
        self.halt()
        for vm in self.guests:
            if vm.peer is not None:
                _stop(vm.peer)
        self.guests.clear()
        for name in reversed(self._namespaces):
            with contextlib.suppress(Exception):
                ns.remove(name)
        self._namespaces.clear()
        shutil.rmtree(Path("/etc/netns") / self.gateway_ns, ignore_errors=True)
        self.world.down()
        if self.base is not None:
            shutil.rmtree(self.base, ignore_errors=True)
            self.base = None
        cleanup.disown(f"instance-{self.instance}")

    def __enter__(self) -> Homelab:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    # -- the hypervisor: its bridges and host-drop table, from the exported files --------------

    def _hypervisor(self) -> None:
        hv = self._create(self.ns("hv"))
        stanzas = (self.out / "hypervisor/etc/network/interfaces.d/sandgate").read_text()
        for bridge, post_up in parse_ifupdown(stanzas):
            _ip(hv, "link", "add", bridge, "type", "bridge", "stp_state", "0", "forward_delay", "0")
            _ip(hv, "link", "set", bridge, "up")
            for line in post_up:
                _in(hv, "sh", "-c", line)
        _in(hv, "nft", "-f", str(self.out / "hypervisor/etc/nftables.d/sandgate-host-drop.nft"))

    def _guest_vm(self, role: str, g: hd.HandedGuest, link: GuestLink) -> GuestVm:
        """An agent VM: a NIC on its bridge, the static address the export's README gives it."""
        vm = self._create(self.ns(role))
        _veth(vm, "eth0", self.ns("hv"), f"{g.bridge}g", g.bridge)
        _ip(vm, "link", "set", "lo", "up")
        _ip(vm, "addr", "add", f"{link.guest}/30", "dev", "eth0")
        _ip(vm, "link", "set", "eth0", "up")
        _ip(vm, "route", "add", "default", "via", str(link.gateway))
        # Raw sockets and ping as root (a VM's root), IPv6 left on as a VM has it.
        peer = subprocess.Popen(
            [*ns.nsenter_argv(vm), sys.executable, "-m", "http.server", "8080"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        return GuestVm(vm, g, link, peer)

    def _qemu_wire(self, vm: GuestVm) -> None:
        """The guest namespace becomes the QEMU VM's wire: eth0 (still the bridge's port) loses
        its address and is bridged to tap0, whose VM takes the guest's address (vm/launch.py)."""
        from sandgate.vm.launch import wire_tap  # only with --vm: QEMU's module stays unloaded

        if vm.peer is not None:
            _stop(vm.peer)
            vm.peer = None
        wire_tap(vm.netns, 0)
        vm.qemu = True

    # -- the gateway VM: its "hardware", its OS's own network setup, then the exported files ----

    def boot(self) -> None:
        assert self.links is not None and self.info is not None
        gw = self._create(self.gateway_ns)
        # A VM's NICs keep their MAC across reboots (the hypervisor's config): so here, or the
        # guests' ARP caches would point at the old gateway for a while.
        _veth(gw, self.links.uplink, self.world.ns("lan"), UPLINK_PORT, "br0", mac=_vm_mac(0))
        for i, g in enumerate(self.links.guests, start=1):
            _veth(gw, g.ifname, self.ns("hv"), f"{g.bridge}p", g.bridge, mac=_vm_mac(i))
        _ip(gw, "link", "set", "lo", "up")
        _ip(gw, "addr", "add", GATEWAY_UPLINK, "dev", self.links.uplink)
        for name in (self.links.uplink, *self.links.ifnames):
            _ip(gw, "link", "set", name, "up")
        _ip(gw, "route", "add", "default", "via", ROUTER)
        etc = Path("/etc/netns") / gw
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "resolv.conf").write_text(f"nameserver {RESOLVER}\n")
        files = self.out / "gateway/etc"
        # What the units and systemd-sysctl do at boot, in their order.
        _ipnetns(gw, "sysctl", "-q", "-p", str(files / "sysctl.d/90-sandgate.conf"))
        _ipnetns(gw, "nft", "-j", "-f", str(files / "sandgate/sandgate.nft.json"))
        _ipnetns(gw, "sysctl", "-q", "-p", str(files / "sandgate/forwarding.conf"))
        self._start_daemon(files)
        self.boots += 1

    def _start_daemon(self, files: Path) -> None:
        unit = (files / "systemd/system/sandgate-gateway.service").read_text()
        line = next(ln for ln in unit.splitlines() if ln.startswith("ExecStart="))
        argv = [
            a.replace(ETC + "/", str(files / "sandgate") + "/")
            for a in shlex.split(line.removeprefix("ExecStart="))
        ]
        env = {
            **os.environ,
            "SANDGATE_HOME": str(self.home),
            "SANDGATE_RUN": str(self.out.parent / "run"),
        }
        self.daemon = subprocess.Popen(
            ["ip", "netns", "exec", self.gateway_ns, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
        _wait_ready(self.daemon)

    def halt(self, sig: signal.Signals = signal.SIGTERM) -> None:
        """Stop the gateway VM: its daemon (``sig``), then the whole machine (its namespace)."""
        if self.daemon is not None:
            _stop(self.daemon, sig)
            self.daemon = None
        gw = self.gateway_ns
        if gw in self._namespaces:
            # Its NICs go with it; the far ends are deleted now, not when the kernel gets to
            # the namespace's cleanup (the next boot makes them again at once).
            with contextlib.suppress(Exception):
                _ip(self.world.ns("lan"), "link", "del", UPLINK_PORT)
            for g in self.links.guests if self.links else ():
                with contextlib.suppress(Exception):
                    _ip(self.ns("hv"), "link", "del", f"{g.bridge}p")
            with contextlib.suppress(Exception):
                ns.remove(gw)
            self._namespaces.remove(gw)

    def kill_daemon(self) -> None:
        """SIGKILL the daemon only; the gateway VM (its tables, its forwarding) stays."""
        if self.daemon is not None:
            _stop(self.daemon, signal.SIGKILL)
            self.daemon = None

    def reboot(self) -> None:
        self.halt()
        self.boot()

    # -- helpers --------------------------------------------------------------------------------

    def _create(self, name: str) -> str:
        with contextlib.suppress(SandgateError):
            ns.remove(name)
        ns.create(name)
        self._namespaces.append(name)
        return name


def default_policy() -> Path:
    """The world's homelab policy (report 001's profiles, the test world's LAN addresses)."""
    return Path(str(resources.files("sandgate.world").joinpath("homelab.toml")))


def parse_ifupdown(text: str) -> list[tuple[str, list[str]]]:
    """(bridge, post-up commands) of each ``iface NAME inet manual`` stanza (pure)."""
    out: list[tuple[str, list[str]]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("iface "):
            out.append((line.split()[1], []))
        elif line.startswith("post-up ") and out:
            out[-1][1].append(line.removeprefix("post-up ").strip())
    return out


def _sandgate_bin() -> str:
    found = shutil.which("sandgate")
    if found:
        return found
    return str(Path(sys.executable).with_name("sandgate"))


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SandgateError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")


def _in(netns: str, *argv: str) -> None:
    _run([*ns.nsenter_argv(netns), *argv])


def _ipnetns(netns: str, *argv: str) -> None:
    """Like ``_in``, with the namespace's /etc/netns files (its resolv.conf) in place."""
    _run(["ip", "netns", "exec", netns, *argv])


def _ip(netns: str, *argv: str) -> None:
    _run(["ip", "-n", netns, *argv])


def _vm_mac(nic: int) -> str:
    return f"02:53:47:ff:00:{nic:02x}"


def _veth(
    netns: str, ifname: str, peer_ns: str, peer: str, master: str, mac: str | None = None
) -> None:
    """A veth ``ifname`` in ``netns`` whose peer is a port of ``master`` in ``peer_ns``."""
    own = ["address", mac] if mac else []
    _ip(netns, "link", "add", ifname, *own, "type", "veth", "peer", "name", peer, "netns", peer_ns)
    _ip(peer_ns, "link", "set", peer, "master", master)
    _ip(peer_ns, "link", "set", peer, "up")


def _wait_ready(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    deadline = time.monotonic() + READY_TIMEOUT
    out: IO[str] = proc.stdout
    while time.monotonic() < deadline:
        line = out.readline()
        if line.startswith("READY "):
            return
        if not line and proc.poll() is not None:
            err = proc.stderr.read() if proc.stderr else ""
            raise SandgateError(f"the gateway VM's daemon did not start: {err.strip()}")
    _stop(proc)
    raise SandgateError("the gateway VM's daemon did not report READY in time")


def _stop(proc: subprocess.Popen[Any], sig: signal.Signals = signal.SIGTERM) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)  # each was started in a session of its own
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


__all__ = ["GuestVm", "Homelab", "default_policy", "parse_ifupdown"]
