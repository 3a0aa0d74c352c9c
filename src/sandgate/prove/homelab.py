"""``sandgate prove --world homelab``: report 001's homelab attacked from every agent VM, on a
gateway configured from its exported files only, before and after a reboot (issue 10).

Each guest is a namespace standing in for a VM: root inside, IPv6 on. It runs the same probe
driver as ``prove`` (as root, as a VM's agent could be) over the catalogue's network probes
(the sandbox's own probes, capabilities and sockets, do not apply to a VM) plus report 001's
homelab attacks: the hypervisor over IPv6 link-local and over ARP from a spoofed LAN address,
the router, the gateway VM's SSH on both sides, the LAN broadcast. Expected verdicts are
``decide()``'s on the guest's profile, made as the daemon makes it (net/handed.py); the
gateway's record of each attempt is read from its store, by guest link.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sandgate import cleanup
from sandgate.errors import SandgateError
from sandgate.events.schema import Event
from sandgate.events.store import Store
from sandgate.gateway.proxy.server import EXPLICIT_PORT
from sandgate.net import handed as hd
from sandgate.net import ns
from sandgate.net.links import guest_mac
from sandgate.policy.decide import Attempt, decide, decide_answer
from sandgate.policy.model import Protocol
from sandgate.policy.profile import Profile
from sandgate.prove.catalogue import ROUTER, Context, Match, Probe, catalogue
from sandgate.prove.invariants import Wiring
from sandgate.prove.runner import ProveResult, _judge, _observed, _session_invariants
from sandgate.world.homelab import GuestVm, Homelab, default_policy
from sandgate.world.servers.launch import read_log
from sandgate.world.topology import GATEWAY_UPLINK, LAN, resolve_name

# What a VM's agent does over the network; the sandbox probes (local commands, sockets on the
# host, raw sockets refused) are about bubblewrap and do not describe a VM.
VM_ACTIONS = frozenset({"tcp", "udp", "icmp", "dns", "http", "tls", "connect"})
SPOOFED_LAN = "10.77.0.99"  # a LAN address the guest pretends to be
SETTLE = 0.5  # the daemon flushes its events every 0.1 s


@dataclass
class GuestProve:
    guest: str  # the gateway's link to it
    profile: str
    boot: int  # 1: first boot from the files, 2: after the reboot
    result: ProveResult

    def rows(self) -> list[dict[str, Any]]:
        label = {"guest": self.guest, "profile": self.profile, "boot": self.boot}
        return [{**label, **r.as_json()} for r in self.result.results]


def prove_homelab(
    policy: str | None = None, instance: str | None = None, vm: bool = False
) -> list[GuestProve]:
    """Build the homelab from exported files, prove from every guest, reboot, prove again.
    ``vm``: the last guest is a real QEMU VM on its bridge, the driver run in it as root."""
    path = Path(policy) if policy else default_policy()
    lab = Homelab(instance or f"h{int(time.time()) % 100000}", path, qemu_guest=vm)
    if vm:
        from sandgate.vm.launch import VmOptions, preflight

        preflight(VmOptions())  # QEMU and the built-in guest, before anything is made
    out: list[GuestProve] = []
    with lab:
        for boot in (1, 2):
            if boot == 2:
                lab.reboot()
            for guest in lab.guests:
                out.append(_prove_guest(lab, guest, boot))
    return out


def _prove_guest(lab: Homelab, vm: GuestVm, boot: int) -> GuestProve:
    assert lab.policy is not None and lab.info is not None
    profile = hd.guest_profile(lab.policy, vm.guest, vm.link)
    others = [o for o in lab.guests if o is not vm]
    ctx = Context(
        profile=profile,
        gateway=str(vm.link.gateway),
        proxy=f"http://{vm.link.gateway}:{EXPLICIT_PORT}",
        world=True,
        peer=str(others[0].link.guest) if others else None,
        nonce=f"{vm.guest.ifname}b{boot}{int(time.time() * 1000) % 10**6}",
    )
    probes = [
        with_answers(p, profile) for p in catalogue(ctx) if p.action in VM_ACTIONS
    ] + homelab_probes(profile, ctx)
    work = Path(tempfile.mkdtemp(prefix="sg-homelab-prove-", dir="/var/tmp"))
    try:
        (work / "probes.json").write_text(json.dumps([p.as_driver() for p in probes]))
        logs_before = {k: len(read_log(v)) for k, v in lab.info.logs.items()}
        t0 = time.time()
        driver = Path(__file__).with_name("driver.py")
        if vm.qemu:
            _in_qemu(vm, work, driver)
        else:
            subprocess.run(
                [
                    *ns.nsenter_argv(vm.netns),
                    "/usr/bin/python3",
                    str(driver),
                    str(work / "probes.json"),
                    str(work / "results.jsonl"),
                ],
                capture_output=True,
                timeout=300,
                check=False,
            )
        time.sleep(SETTLE)
        observed = _observed(work / "results.jsonl")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    events = _events(lab.store, vm.guest.ifname, t0)
    seen = {k: read_log(v)[logs_before[k] :] for k, v in lab.info.logs.items()}
    wiring = Wiring(
        guest_pool=profile.guest_pool,
        gateway=vm.link.gateway,
        named_exactly=tuple(
            r.spec.network.network_address
            for r in profile.allow
            if r.spec.network is not None and r.spec.network.num_addresses == 1
        ),
    )
    results = [_judge(p, observed.get(p.id), events, seen.get("dns", []), wiring) for p in probes]
    results += _session_invariants(GATEWAY_UPLINK, events, seen)
    result = ProveResult(str(profile.mode), profile.name, str(lab.policy_path), None, results)
    name = f"{vm.guest.ifname} ({QEMU_LABEL})" if vm.qemu else vm.guest.ifname
    return GuestProve(name, profile.name, boot, result)


QEMU_LABEL = "qemu vm"  # in the ``guest`` field of a QEMU guest's rows
VM_RUN_TIMEOUT = 480.0  # boot (TCG, loaded 2-core host) plus the driver's probes


def _in_qemu(vm: GuestVm, work: Path, driver: Path) -> None:
    """Boot the built-in guest on the VM's tap, the driver run in it as root over ``work``
    (its /work); QEMU is in the guest namespace, which has no address: only the tap."""
    from sandgate.vm import accel, image, qemu
    from sandgate.vm.launch import TAP, UP_MARK

    shutil.copyfile(driver, work / "driver.py")
    share = work / "share"  # the guest's /sg: its job, its writable areas, its exit status
    for area in ("vm", "home", "tmp", "run", "vartmp", "shm"):
        (share / area).mkdir(parents=True, exist_ok=True)
    job = qemu.Job(
        ("/usr/bin/python3", "/work/driver.py", "/work/probes.json", "/work/results.jsonl"),
        {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "USER": "root"},
    )
    (share / "vm" / "job.sh").write_text(qemu.job_script(job))
    guest = image.ensure()
    a = accel.detect()
    mac = vm.link.mac or guest_mac(vm.link.index)
    spec = qemu.VmSpec(
        f"homelab-{vm.netns}",
        guest.boot_kernel(a),
        guest.initrd,
        share,
        work,
        a,
        qemu.Nic(TAP, mac, f"{vm.link.guest}/30", str(vm.link.gateway)),
    )
    console = work / "console.log"
    proc = subprocess.Popen(
        [*ns.nsenter_argv(vm.netns), *qemu.argv(spec, console)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    cleanup.add_pid(f"vm-{spec.session}", proc.pid)  # `sandgate cleanup` ends it if we die
    try:
        proc.wait(VM_RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        pass
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        cleanup.forget_pids(f"vm-{spec.session}")
    log = console.read_bytes() if console.exists() else b""
    if not (share / "vm" / "exit").exists():
        tail = log.decode(errors="replace").strip().splitlines()[-3:]
        booted = "booted" if UP_MARK in log else "did not boot"
        raise SandgateError(f"the homelab's QEMU guest {booted}: " + " / ".join(tail))


def with_answers(probe: Probe, profile: Profile) -> Probe:
    """A name the policy lets resolve is still refused when every answer the world gives is
    refused (``decide_answer``): here the world's "internet" is special-purpose space, since
    the exported files carry no test-world override."""
    name = probe.args.get("name")
    if probe.action != "dns" or probe.expected != "allow" or not name or probe.args.get("qtype"):
        return probe
    answers = resolve_name(str(name))
    refused = [decide_answer(profile, name, ipaddress.ip_address(a)) for a in answers]
    if answers and all(not d.allowed for d in refused):
        return replace(probe, expected="deny", why=refused[0].key)
    return probe


def homelab_probes(profile: Profile, ctx: Context) -> list[Probe]:
    """Report 001's homelab attacks that the catalogue has no probe for (pure)."""
    gw_lan = GATEWAY_UPLINK.split("/", 1)[0]
    broadcast = str(LAN.broadcast_address)
    out: list[Probe] = []

    def conn(pid: str, group: str, proto: Protocol, address: str, port: int) -> None:
        d = decide(profile, Attempt(proto, ipaddress.ip_address(address), port))
        out.append(
            Probe(
                pid,
                group,
                f"{address}:{port}/{proto.value}",
                proto.value,
                {"address": address, "port": port},
                d.verdict.value,
                d.key,
                Match(("conn",), address, port, protocol=proto.value, by_sport=True),
            )
        )

    conn("gateway VM ssh (guest side)", "gateway", Protocol.TCP, ctx.gateway, 22)
    conn("gateway VM ssh (LAN side)", "gateway", Protocol.TCP, gw_lan, 22)
    conn("router ssh", "lan", Protocol.TCP, ROUTER, 22)
    web = decide(profile, Attempt(Protocol.TCP, ipaddress.ip_address(ROUTER), 80))
    out.append(
        Probe(
            "router web UI",
            "lan",
            f"http://{ROUTER}/",
            "http",
            {"url": f"http://{ROUTER}/"},
            web.verdict.value,
            web.key,
            Match(("http", "conn"), ROUTER, 80),
        )
    )
    conn("LAN broadcast (netbios)", "lan", Protocol.UDP, broadcast, 137)
    conn("LAN broadcast (ssdp port)", "lan", Protocol.UDP, broadcast, 1900)
    out.append(
        Probe(
            "hypervisor over IPv6 link-local",
            "hypervisor",
            "ff02::1%eth0 (all nodes on the guest's bridge)",
            "local",
            {"command": _IPV6_ALL_NODES},
            "deny",
            "never.hypervisor_ipv6",
            None,
            no_log_why="IPv6 never reaches routing: the gateway's ingress chain drops it (L2), "
            "the hypervisor's bridge has IPv6 off and the host-drop table",
        )
    )
    for target in (ctx.gateway, ROUTER):
        out.append(
            Probe(
                f"ARP from a spoofed LAN address for {target}",
                "hypervisor",
                f"who-has {target} tell {SPOOFED_LAN}",
                "local",
                {"command": _spoofed_arp(target)},
                "deny",
                "deny.spoof_arp",
                None,
                no_log_why="layer 2: the gateway's ingress chain counts it (spoof_arp), no flow",
            )
        )
    return out


# A reply from anyone but ourselves to an all-nodes ping: rc 0 ("allow").
_IPV6_ALL_NODES = (
    "sleep 1; own=$(ip -6 -o addr show dev eth0 scope link | awk '{print $4}' | cut -d/ -f1); "
    "ping -6 -c 3 -i 0.3 -W 1 ff02::1%eth0 2>/dev/null | grep 'bytes from' "
    '| grep -v "$own" | grep -q .'
)


def _spoofed_arp(target: str) -> str:
    """An ARP request claiming SPOOFED_LAN, sent raw; rc 0 if any ARP reply comes back."""
    script = (
        "import socket,struct,time,sys\n"
        "s=socket.socket(socket.AF_PACKET,socket.SOCK_RAW,socket.htons(0x0806))\n"
        "s.bind(('eth0',0));mac=s.getsockname()[4];s.settimeout(0.3)\n"
        f"sip=socket.inet_aton('{SPOOFED_LAN}');tip=socket.inet_aton('{target}')\n"
        "arp=struct.pack('!HHBBH6s4s6s4s',1,0x0800,6,4,1,mac,sip,b'\\0'*6,tip)\n"
        "s.send(b'\\xff'*6+mac+b'\\x08\\x06'+arp);end=time.time()+1.5\n"
        "while time.time()<end:\n"
        " try:d=s.recv(100)\n"
        " except OSError:continue\n"
        " if d[20:22]==b'\\x00\\x02' and d[28:32]==tip:sys.exit(0)\n"
        "sys.exit(1)\n"
    )
    return "python3 -c " + shlex.quote(script)


def _events(store: Path, guest: str, since: float) -> list[Event]:
    s = Store(store)
    try:
        return [e for e in s.events() if e.guest == guest and e.ts >= since]
    finally:
        s.close()


def totals(proves: list[GuestProve]) -> dict[str, int]:
    out = {"PASS": 0, "FAIL": 0, "SKIP": 0}
    for p in proves:
        for k, v in p.result.totals().items():
            out[k] += v
    return out


__all__ = ["GuestProve", "homelab_probes", "prove_homelab", "totals"]
