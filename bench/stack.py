"""The bench's own stack: a test world, a gateway, and the peers it is compared with.

    [gateway] up0 ─┐                         ┌─ [sg-I-wan] web 203.0.113.x, DNS 198.51.100.53
                   br0 [sg-I-lan] router ────┘
    [sg-I-up] ─────┤ 10.77.0.250  dnsmasq: a fast upstream DNS (the gateway's upstream here)
    [sg-I-rt] ─────┘ 10.77.0.251  peer gateway: plain kernel forwarding, no nft; dnsmasq
         └── veth 10.77.251.1/30 ── [sg-I-cl] 10.77.251.2  peer guest (curl, dnsperf)

The gateway is the one ``sandgate up --world test`` starts, with two settings changed for the
measurements: its upstream resolver is the fast dnsmasq (which answers the bench's names itself
and forwards the rest to the world's DNS), so uncached queries measure the gateway's resolver
and not the world's Python DNS server; and ``drop_log_rate`` is raised so drop logging is not
rate-limited by design during the NFLOG measurement.
"""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.common import BenchNet, log, wait_udp_port
from sandgate import cleanup
from sandgate.agents.frameworks import world_script
from sandgate.gateway import manage
from sandgate.gateway.config import run_dir
from sandgate.session.stack import Stack, gateway_config, gateway_policy
from sandgate.world.topology import HOSTS, ROUTER, TestWorld

UPSTREAM = "10.77.0.250"  # the fast upstream DNS on the world's LAN
PEER_ROUTER = "10.77.0.251"  # the peer gateway's LAN address
PEER_LINK = ("10.77.251.1", "10.77.251.2")  # peer gateway / peer guest on their /30
PEER_NET = "10.77.251.0/30"
BENCH_ZONE = "b.exfil.evil.example"  # names under it: answered by the fast upstream
CACHED_NAME = "example.com"
DROP_LOG_RATE = 100_000


def dnsmasq_argv(listen: str, *extra: str) -> list[str]:
    return [
        "dnsmasq",
        "--no-daemon",
        "--keep-in-foreground",
        "--no-resolv",
        "--no-hosts",
        "--no-poll",
        "--bind-interfaces",
        f"--listen-address={listen}",
        "--except-interface=lo",
        "--user=root",
        "--group=root",
        "--pid-file=",
        "--dns-forward-max=5000",
        "--cache-size=10000",
        *extra,
    ]


@dataclass
class BenchStack:
    stack: Stack
    net: BenchNet
    base: Path  # the bench's scratch directory (store, work dirs, logs)

    @property
    def instance(self) -> str:
        return self.stack.instance

    @property
    def store(self) -> str:
        return str(self.base / "events.db")

    @property
    def client_ns(self) -> str:
        return self.net.name("cl")

    @property
    def router_ns(self) -> str:
        return self.net.name("rt")

    def world_pid(self, server: str) -> int:
        """The pid of a test-world server (dns, web, model, listen)."""
        world = self.stack._world
        assert world is not None
        for running in world.servers:
            args = running.proc.args if isinstance(running.proc.args, list) else []
            if any(str(a).endswith(f"servers.{server}") for a in args):
                return running.proc.pid
        raise LookupError(server)


@contextlib.contextmanager
def bench_stack() -> Iterator[BenchStack]:
    name = "b" + secrets.token_hex(2)
    base = Path(tempfile.mkdtemp(prefix=f"sandgate-bench-{name}-", dir="/var/tmp"))
    base.chmod(0o755)
    cleanup.own(f"instance-{name}")  # `sandgate cleanup` leaves sg-<name>-* alone meanwhile
    world = TestWorld(name, model_script=world_script())
    net = BenchNet(name)
    stack: Stack | None = None
    try:
        log(f"bringing up test world and gateway '{name}'")
        info = world.up()
        cleanup.record_pids(f"world-{name}", [s.proc.pid for s in world.servers])
        _peers(net, world.ns("lan"), base)
        policy = gateway_policy(None, info)  # the test world's own, as `sandgate up` takes it
        cfg = gateway_config(
            name, info, str(base / "events.db"), policy, drop_log_rate=DROP_LOG_RATE
        )
        cfg = dataclasses.replace(cfg, upstream_dns=(UPSTREAM,))
        handle = manage.start(cfg, env=info.gateway_env)  # the world's API key, as stack.py
        stack = Stack(name, handle, info, owned=True, _world=world)
        yield BenchStack(stack, net, base)
    finally:
        log(f"tearing down '{name}'")
        net.close()
        if stack is not None:
            stack.teardown()
        else:
            world.down()
            cleanup.forget_pids(f"world-{name}")
            shutil.rmtree(run_dir(name), ignore_errors=True)
            cleanup.disown(f"instance-{name}")
        shutil.rmtree(base, ignore_errors=True)


def _peers(net: BenchNet, lan: str, base: Path) -> None:
    """The fast upstream, the peer gateway and the peer guest (see the module docstring)."""
    up, rt, cl = net.netns("up"), net.netns("rt"), net.netns("cl")
    for role, netns, address in (("up", up, UPSTREAM), ("rt", rt, PEER_ROUTER)):
        net.veth(netns, "eth0", lan, f"b{role}")
        net.ip(lan, "link", "set", f"b{role}", "master", "br0", "up")
        net.address(netns, "eth0", f"{address}/24")
        net.ip(netns, "route", "add", "default", "via", ROUTER)
    net.veth(rt, "g0", cl, "eth0")
    net.address(rt, "g0", f"{PEER_LINK[0]}/30")
    net.address(cl, "eth0", f"{PEER_LINK[1]}/30")
    net.ip(cl, "route", "add", "default", "via", PEER_LINK[0])
    net.sysctl(rt, "net.ipv4.ip_forward", "1")
    net.ip(lan, "route", "add", PEER_NET, "via", PEER_ROUTER)  # the way back to the peer guest
    # The fast upstream: answers the bench's names and example.com itself (a 300 s TTL, so the
    # gateway caches them), forwards anything else to the world's DNS.
    net.spawn_in(
        up,
        dnsmasq_argv(
            UPSTREAM,
            f"--address=/{BENCH_ZONE}/{HOSTS['exfil.evil.example']}",
            f"--address=/{CACHED_NAME}/{HOSTS[CACHED_NAME]}",
            "--local-ttl=300",
            "--server=198.51.100.53",
        ),
        stdout=open(base / "upstream-dnsmasq.log", "wb"),  # noqa: SIM115 - the child's
        stderr=subprocess.STDOUT,
    )
    wait_udp_port(up, UPSTREAM, 53)
