"""The nftables ruleset is ``decide()`` compiled: a differential test.

``tests/nfteval.py`` evaluates the nft JSON that ``sandgate.net.compile`` emits: it follows a
new frame from a guest link the way the kernel would (the link's netdev ingress: source MAC,
source address, ethertype; then the inet table: prerouting's redirects, input, forward, the
per-guest chains and their verdict sites). The tests check that the packet reaches its
destination exactly when ``decide()`` allows the same address-level attempt (no name, but for
fronted names to the gateway). The allowlist's ``@pin``/``@pinp`` sets are empty here, as they
are before any allowed name was resolved, so allowlist mode must deny everything ``decide()``
answers with ``deny.not_allowlisted``.

The evaluator refuses any expression it does not know, so a new shape of rule in compile.py
fails here loudly instead of being skipped; what it leaves out is listed in its docstring.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from dataclasses import dataclass, replace
from ipaddress import IPv4Address, IPv4Network, IPv6Address

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandgate.net.compile import PROXY_PORTS, GuestLink, Site, base_ruleset, guest_add
from sandgate.policy.classify import BLOCKS
from sandgate.policy.decide import Attempt, Decision, at_address, decide
from sandgate.policy.load import parse_policy
from sandgate.policy.model import IPNetwork, Mode, Protocol, RuleSpec
from sandgate.policy.profile import Profile, Rule
from tests.nfteval import Nft, Packet, Sets, Verdict

POOL = IPv4Network("10.201.0.0/16")
LINK = GuestLink.from_pool(POOL, 5, "02:00:00:00:00:05")  # g5: gateway .21, guest .22
UPLINK = "up0"
TEST_INTERNET: tuple[IPNetwork, ...] = (
    IPv4Network("203.0.113.0/24"),
    IPv4Network("198.51.100.0/24"),
)


# -- the compiled ruleset of one profile, and the two verdicts -----------------------------


@dataclass
class Compiled:
    profile: Profile
    nft: Nft  # the ruleset of the profile's guest, seen from its link

    @classmethod
    def of(cls, profile: Profile, sets: Sets | None = None) -> Compiled:
        base, base_sites = base_ruleset(UPLINK, POOL, public_override=profile.public_override)
        guest, guest_sites = guest_add(LINK, profile)
        return cls(profile, Nft(base + guest, {**base_sites, **guest_sites}, LINK, sets))

    @property
    def sites(self) -> dict[str, Site]:
        """By verdict chain name."""
        return self.nft.sites

    def link_ingress(self, pkt: Packet) -> Verdict:
        return self.nft.ingress(pkt)

    def kernel(self, pkt: Packet) -> tuple[bool, Verdict]:
        reached, verdict = self.nft.trace(pkt)
        if verdict.kind == "proxy":
            assert reached, f"{pkt}: web traffic does not reach the proxy"
            return self.decide(pkt).allowed, verdict
        return reached, verdict

    def decide(self, pkt: Packet) -> Decision:
        port = pkt.dport if pkt.proto != "icmp" else None
        return decide(self.profile, Attempt(Protocol(pkt.proto), pkt.daddr, port, pkt.name))

    def check(self, pkt: Packet) -> None:
        reached, verdict = self.kernel(pkt)
        d = self.decide(pkt)
        site = self.sites.get(verdict.site or "")
        assert reached == d.allowed, (
            f"{pkt}: decide() says {d.key} ({d.rule_ref}), the ruleset "
            f"{verdict.kind} at {site.reason if site else verdict.site} "
            f"({site.rule if site else None})"
        )
        if site is not None and site.group is not None:
            # A grouped site (policy/groups.py): its log line names decide()'s rule.
            named = at_address(site.decision, pkt.daddr, site.group)
            assert (named.key, named.rule_ref) == (d.key, d.rule_ref), (pkt, named, d)


def with_gateway(profile: Profile) -> Profile:
    return replace(profile, guest_pool=POOL, gateway_address=LINK.gateway)


POLICY = parse_policy(
    b"""
[gateway]
guest_pool = "10.201.0.0/16"

[profiles.coder]
allow = [
  { host = "10.77.0.10", port = 8000, name = "model server" },
  { domain = "pypi.org" },
  { domain = "*.github.com", port = 443 },
  { host = "151.101.0.223", port = 443, name = "pypi cdn" },
  { host = "9.9.9.9", port = 853, name = "quad9 dot" },
  { host = "1.0.0.1", port = 443, protocol = "udp" },
  { cidr = "140.82.112.0/20", port = [22, "9418-9420"] },
  { cidr = "203.0.113.0/24", port = 443 },
]
front = [ { name = "models.lan", upstream = "http://10.77.0.10:8000" } ]
deny = [
  { domain = "gist.github.com" },
  { cidr = "10.77.0.0/24", port = 22 },
  { cidr = "140.82.121.0/24" },
  { host = "203.0.113.66" },
]

[profiles.exemptions]
allow = [
  { cidr = "10.77.0.0/24" },
  { cidr = "0.0.0.0/0", port = 9418 },
  { cidr = "169.254.0.0/16", port = 123, protocol = "udp" },
  { host = "169.254.170.2", port = 80 },
  { cidr = "100.64.0.0/10" },
  { cidr = "192.0.0.0/16", protocol = "icmp" },
  { cidr = "10.200.0.0/15", port = 8080 },
  { host = "fd00::1" },
  { host = "::ffff:192.168.1.20", port = 631 },
]
front = [ { name = "printer.lan", upstream = "http://192.168.1.20:631" } ]
deny = [ { cidr = "0.0.0.0/0", port = 25 } ]
""",
    "policy.toml",
)

NAMED_PROFILES = {
    f"{name}-{mode}{'-testworld' if override else ''}": with_gateway(
        POLICY.profile(name, mode=mode, public_override=TEST_INTERNET if override else ())
    )
    for name in ("coder", "exemptions")
    for mode in Mode
    for override in (False, True)
}


def edges(net: IPNetwork) -> Iterator[IPv4Address]:
    """The first and last address of a network and their outside neighbours."""
    if not isinstance(net, IPv4Network):
        return
    first, last = int(net.network_address), int(net.broadcast_address)
    for value in (first - 1, first, first + 1, last - 1, last, last + 1):
        if 0 <= value < 2**32:
            yield IPv4Address(value)


def edge_addresses(profile: Profile) -> list[IPv4Address]:
    nets: list[IPNetwork] = [b.network for b in BLOCKS]
    nets += [POOL, LINK.subnet, *profile.public_override]
    nets += [r.spec.network for r in profile.rules() if r.spec.network is not None]
    found = {a for n in nets for a in edges(n)}
    found |= {LINK.gateway, LINK.guest, IPv4Address("8.8.8.8"), IPv4Address("1.1.1.1")}
    return sorted(found)


def interesting_ports(profile: Profile) -> list[int]:
    ports = {1, 22, 25, 53, 80, 123, 443, 631, 853, 8000, 8080, 9418, 65535, *PROXY_PORTS}
    for rule in profile.rules():
        for low, high in rule.spec.ports:
            ports |= {p for p in (low - 1, low, high, high + 1) if 1 <= p <= 65535}
    return sorted(ports)


def packets(profile: Profile) -> Iterator[Packet]:
    ports = interesting_ports(profile)
    for address in edge_addresses(profile):
        yield Packet(address, "icmp", None)
        for proto in ("tcp", "udp"):
            for port in ports:
                yield Packet(address, proto, port)
    # A fronted name, as the proxy reads it, to the gateway: only its TLS port is the front's.
    for front in profile.fronts:
        yield Packet(LINK.gateway, "icmp", None, name=front.name)
        for proto in ("tcp", "udp"):
            for port in ports:
                yield Packet(LINK.gateway, proto, port, name=front.name)


@pytest.mark.parametrize("name", list(NAMED_PROFILES))
def test_ruleset_agrees_with_decide_on_every_edge(name: str) -> None:
    compiled = Compiled.of(NAMED_PROFILES[name])
    disagree = []
    for pkt in packets(compiled.profile):
        try:
            compiled.check(pkt)
        except AssertionError as exc:
            disagree.append(str(exc))
    assert not disagree, f"{len(disagree)} disagreements, e.g.\n" + "\n".join(disagree[:10])


def site_says(compiled: Compiled, pkt: Packet) -> tuple[str, str | None]:
    """(reason key, rule) the ruleset logs for a packet: what a log line will say."""
    reached, verdict = compiled.kernel(pkt)
    if verdict.kind == "proxy":  # the proxy logs decide()'s own reason and rule
        d = compiled.decide(pkt)
        return d.reason.key, d.rule_ref
    site = compiled.sites.get(verdict.site or "")
    if site is None:  # the own resolver and proxy are plain accepts in the input chain
        assert reached and pkt.daddr == LINK.gateway, verdict
        if pkt.dport == 53:
            return "allow.gateway_dns", None
        assert pkt.proto == "tcp" and pkt.dport in PROXY_PORTS, (pkt, verdict)
        return "allow.gateway_proxy", None
    if site.group is not None:  # what the log reader makes of a grouped site's line
        named = at_address(site.decision, pkt.daddr, site.group)
        return named.key, named.rule_ref
    return site.reason, site.rule


def known_divergence(compiled: Compiled, pkt: Packet) -> bool:
    """The place where the log line and decide() name different reasons (same verdict): the
    test world's "internet" is logged as a plain allow rule (its own test below)."""
    d = compiled.decide(pkt)
    override_rule = any(pkt.daddr in n for n in compiled.profile.public_override)
    return override_rule and d.key == "allow.rule"


@pytest.mark.parametrize("name", list(NAMED_PROFILES))
def test_log_sites_name_the_reason_and_rule_decide_gives(name: str) -> None:
    """Beyond the verdict: the site a packet ends at records decide()'s reason and rule, so a
    log line and `sandgate explain` say the same thing (deny.special carries no class)."""
    compiled = Compiled.of(NAMED_PROFILES[name])
    disagree = []
    for pkt in packets(compiled.profile):
        if known_divergence(compiled, pkt):
            continue
        d = compiled.decide(pkt)
        if site_says(compiled, pkt) != (d.reason.key, d.rule_ref):
            disagree.append(f"{pkt}: {site_says(compiled, pkt)} vs {d.reason.key} {d.rule_ref}")
    assert not disagree, f"{len(disagree)} disagreements, e.g.\n" + "\n".join(disagree[:10])


def test_override_rule_is_logged_as_a_plain_allow_rule() -> None:
    compiled = Compiled.of(NAMED_PROFILES["coder-open-testworld"])
    pkt = Packet(IPv4Address("203.0.113.5"), "tcp", 443)
    assert compiled.decide(pkt).key == "allow.rule"
    assert site_says(compiled, pkt) == ("allow.rule", "coder.allow[7] (203.0.113.0/24:443)")


def test_deny_rule_for_the_gateway_is_logged_as_that_rule() -> None:
    compiled = Compiled.of(NAMED_PROFILES["exemptions-open"])
    pkt = Packet(LINK.gateway, "tcp", 25)
    assert compiled.decide(pkt).key == "deny.rule"
    assert site_says(compiled, pkt) == ("deny.rule", "exemptions.deny[0] (0.0.0.0/0:25)")


def test_allowlist_denies_what_decide_does_not_allowlist() -> None:
    compiled = Compiled.of(NAMED_PROFILES["coder-allowlist"])
    pkt = Packet(IPv4Address("93.184.215.14"), "tcp", 8443)
    reached, verdict = compiled.kernel(pkt)
    assert (reached, compiled.decide(pkt).key) == (False, "deny.not_allowlisted")
    assert compiled.sites[verdict.site or ""].reason == "deny.not_allowlisted"


def test_the_evaluator_follows_the_sites() -> None:
    """A few packets, with the site each one ends at: the evaluator itself is right."""
    compiled = Compiled.of(NAMED_PROFILES["coder-open"])

    def where(address: str, proto: str, port: int | None) -> tuple[bool, str | None, str | None]:
        reached, verdict = compiled.kernel(Packet(IPv4Address(address), proto, port))
        site = compiled.sites.get(verdict.site or "")
        return reached, site.reason if site else verdict.kind, site.rule if site else None

    assert where("10.77.0.10", "tcp", 8000) == (
        True,
        "allow.exempt",
        "coder.allow[0] (model server)",
    )
    assert where("10.77.0.10", "tcp", 22) == (False, "deny.rule", "coder.deny[1] (10.77.0.0/24:22)")
    assert where("10.201.0.26", "tcp", 8080) == (False, "deny.lateral", None)
    assert where("10.201.0.21", "tcp", 22) == (False, "deny.gateway", None)
    assert where("10.201.0.21", "udp", 53) == (True, "accept", None)
    assert where("8.8.8.8", "udp", 53) == (False, "deny.dns_redirect", None)
    assert where("169.254.169.254", "tcp", 8080) == (False, "deny.special", None)
    assert where("169.254.169.254", "tcp", 80) == (False, "proxy", None)  # decide() at the proxy
    assert where("1.1.1.1", "udp", 443) == (False, "deny.quic", None)
    assert where("1.1.1.1", "tcp", 853) == (False, "deny.dns_bypass", None)
    assert where("1.1.1.1", "tcp", 8443) == (True, "allow.open", None)
    assert where("1.1.1.1", "tcp", 443) == (True, "allow.open", None)  # then the TLS gate


# -- the guest link's netdev ingress: only the guest's own IPv4 and ARP ---------------------

PUBLIC = IPv4Address("93.184.215.14")
OTHER_MAC = "02:00:00:00:00:06"
LINK_ADDRESSES = list(LINK.subnet)  # the /30: network, gateway, guest, broadcast
assert LINK_ADDRESSES[2] == LINK.guest


@pytest.mark.parametrize(
    ("pkt", "expected"),
    [
        pytest.param(Packet(PUBLIC, "tcp", 443), ("accept", None), id="own"),
        pytest.param(
            Packet(PUBLIC, "tcp", 443, saddr=LINK.gateway), ("drop", "deny.spoof_ip"), id="gw"
        ),
        pytest.param(
            Packet(LINK.gateway, "udp", 53, saddr=LINK.gateway),
            ("drop", "deny.spoof_ip"),
            id="gw-to-itself",
        ),
        pytest.param(
            Packet(PUBLIC, "tcp", 443, saddr=LINK_ADDRESSES[0]),
            ("drop", "deny.spoof_ip"),
            id="link-network",
        ),
        pytest.param(
            Packet(PUBLIC, "tcp", 443, saddr=LINK_ADDRESSES[3]),
            ("drop", "deny.spoof_ip"),
            id="link-broadcast",
        ),
        pytest.param(
            Packet(PUBLIC, "udp", 9, saddr=IPv4Address("10.201.0.26")),
            ("drop", "deny.spoof_ip"),
            id="other-guest",
        ),
        pytest.param(
            Packet(PUBLIC, "udp", 67, saddr=IPv4Address("0.0.0.0")),
            ("drop", "deny.spoof_ip"),
            id="unspecified",
        ),
        pytest.param(
            Packet(PUBLIC, "tcp", 443, smac=OTHER_MAC), ("drop", "deny.spoof_mac"), id="mac"
        ),
        pytest.param(
            Packet(PUBLIC, "tcp", 443, saddr=LINK.gateway, smac=OTHER_MAC),
            ("drop", "deny.spoof_mac"),
            id="mac-and-ip",
        ),
        pytest.param(Packet(PUBLIC, "tcp", 443, ethertype="ip6"), ("drop", "deny.ipv6"), id="ipv6"),
        pytest.param(
            Packet(PUBLIC, "tcp", 443, ethertype="vlan"), ("drop", "deny.ethertype"), id="vlan"
        ),
        pytest.param(
            Packet(LINK.gateway, "icmp", None, ethertype="arp"), ("accept", None), id="arp-own"
        ),
        pytest.param(
            Packet(LINK.guest, "icmp", None, saddr=LINK.gateway, ethertype="arp"),
            ("drop", "deny.spoof_arp"),
            id="arp-as-gw",
        ),
        pytest.param(
            Packet(LINK.gateway, "icmp", None, saddr=LINK_ADDRESSES[3], ethertype="arp"),
            ("drop", "deny.spoof_arp"),
            id="arp-as-broadcast",
        ),
        pytest.param(
            Packet(LINK.gateway, "icmp", None, smac=OTHER_MAC, ethertype="arp"),
            ("drop", "deny.spoof_mac"),
            id="arp-other-mac",
        ),
    ],
)
def test_link_ingress_admits_only_the_guests_own_ipv4_and_arp(
    pkt: Packet, expected: tuple[str, str | None]
) -> None:
    compiled = Compiled.of(NAMED_PROFILES["coder-open"])
    got = compiled.link_ingress(pkt)
    site = compiled.sites.get(got.site or "")
    assert (got.kind, site.reason if site else None) == expected
    if site is not None:
        assert site.guest == f"{LINK.ifname}/l2" and site.verdict == "deny"


@pytest.mark.parametrize("name", ["coder-open", "exemptions-open"])
def test_a_spoofed_source_reaches_nothing(name: str) -> None:
    """Everything an open profile lets the guest reach, sent from another address of its /30
    (the gateway's own among them) or from outside it, is dropped before routing."""
    compiled = Compiled.of(NAMED_PROFILES[name])
    spoofed = [a for a in LINK_ADDRESSES if a != LINK.guest] + [IPv4Address("10.201.0.26")]
    reached = 0
    for pkt in packets(compiled.profile):
        reached += compiled.kernel(pkt)[0]
        for saddr in spoofed:
            got = compiled.kernel(replace(pkt, saddr=saddr))
            assert not got[0] and compiled.sites[got[1].site or ""].reason == "deny.spoof_ip"
    assert reached > 100  # the packets reach plenty from the guest's own address


# -- random profiles -------------------------------------------------------------------------

BLOCK_NETS = [b.network for b in BLOCKS if isinstance(b.network, IPv4Network)]
seed_addresses = st.one_of(
    st.sampled_from([a for n in BLOCK_NETS for a in edges(n)]),
    st.sampled_from([LINK.gateway, LINK.guest, *edges(POOL)]),
    st.ip_addresses(v=4),
)


@st.composite
def networks(draw: st.DrawFn) -> IPv4Network:
    address = draw(seed_addresses)
    prefix = draw(st.sampled_from([0, 1, 4, 8, 10, 12, 15, 16, 20, 24, 28, 30, 31, 32]))
    return IPv4Network((address, prefix), strict=False)


port_specs = st.one_of(
    st.none(),
    st.sampled_from([22, 53, 80, 123, 443, 853, 8000]),
    st.lists(
        st.one_of(st.integers(1, 65535), st.sampled_from(["1-1024", "440-450", "850-860"])),
        min_size=1,
        max_size=3,
    ),
)


@st.composite
def rule_specs(draw: st.DrawFn) -> RuleSpec:
    net = draw(networks())
    port = draw(port_specs)
    protocols = ["tcp", "udp", "any", None] + ([] if port else ["icmp"])
    protocol = draw(st.sampled_from(protocols))
    target = {"host": str(net.network_address)} if net.prefixlen == 32 else {"cidr": str(net)}
    return RuleSpec.model_validate({**target, "port": port, "protocol": protocol})


@st.composite
def random_profiles(draw: st.DrawFn) -> Profile:
    allow = draw(st.lists(rule_specs(), max_size=5))
    deny = draw(st.lists(rule_specs(), max_size=3))
    override = draw(st.sampled_from([(), TEST_INTERNET]))
    return Profile(
        "h",
        draw(st.sampled_from(list(Mode))),
        allow=tuple(Rule("allow", s, f"h.allow[{i}]") for i, s in enumerate(allow)),
        deny=tuple(Rule("deny", s, f"h.deny[{i}]") for i, s in enumerate(deny)),
        public_override=override,
        guest_pool=POOL,
        gateway_address=LINK.gateway,
    )


@st.composite
def profile_and_packets(draw: st.DrawFn) -> tuple[Profile, list[Packet]]:
    profile = draw(random_profiles())
    near = edge_addresses(profile)
    address = st.one_of(st.sampled_from(near), seed_addresses)
    proto = st.sampled_from(["tcp", "udp", "icmp"])
    port = st.one_of(st.sampled_from(interesting_ports(profile)), st.integers(1, 65535))
    pkts = draw(
        st.lists(
            st.builds(
                lambda a, p, n: Packet(a, p, None if p == "icmp" else n), address, proto, port
            ),
            min_size=1,
            max_size=40,
        )
    )
    return profile, pkts


@settings(max_examples=300, deadline=None)
@given(profile_and_packets())
def test_ruleset_agrees_with_decide_on_random_profiles(case: tuple[Profile, list[Packet]]) -> None:
    profile, pkts = case
    compiled = Compiled.of(profile)
    for pkt in pkts:
        compiled.check(pkt)


RULE_V6 = sorted(
    {
        r.spec.network.network_address
        for profile in NAMED_PROFILES.values()
        for r in profile.rules()
        if r.spec.network is not None and r.spec.network.version == 6
    }
)
v6_addresses = st.one_of(
    st.ip_addresses(v=6),
    st.sampled_from(RULE_V6),  # an IPv6 allow rule must not open what the kernel drops
    st.sampled_from([b.network.network_address for b in BLOCKS if b.network.version == 6]),
    st.sampled_from([a for n in BLOCK_NETS for a in edges(n)]).map(
        lambda a: IPv6Address(f"::ffff:{a}")
    ),
)


@settings(max_examples=300)
@given(
    st.sampled_from(list(NAMED_PROFILES.values())),
    v6_addresses,
    st.sampled_from(list(Protocol)),
    st.integers(1, 65535),
)
def test_ipv6_is_dropped_and_decide_agrees_unless_mapped(
    profile: Profile, address: IPv6Address, proto: Protocol, port: int
) -> None:
    """Guest links carry no IPv6 (netdev ingress drops it, forward drops nfproto ipv6); only
    an IPv4-mapped address, sent as IPv4 by the guest's kernel, can be allowed."""
    d = decide(profile, Attempt(proto, address, None if proto is Protocol.ICMP else port))
    if address.ipv4_mapped is None:
        assert not d.allowed
    else:
        compiled = Compiled.of(profile)
        pkt = Packet(address.ipv4_mapped, proto.value, None if proto is Protocol.ICMP else port)
        compiled.check(pkt)


def test_ipv6_is_dropped_by_the_ruleset() -> None:
    cmds, _ = base_ruleset(UPLINK, POOL)
    forward = [r["add"]["rule"]["expr"] for r in cmds if "rule" in r.get("add", {})]
    assert any(
        {"match": {"op": "==", "left": {"meta": {"key": "nfproto"}}, "right": "ipv6"}} in expr
        for expr in forward
    )


def test_addresses_cover_every_block_edge() -> None:
    got = set(edge_addresses(NAMED_PROFILES["coder-open"]))
    for block in BLOCK_NETS:
        assert block.network_address in got and block.broadcast_address in got
    assert ipaddress.ip_address("10.77.0.10") in got


def test_grouped_address_rules_keep_decides_rule_and_order() -> None:
    """Many address rules share interval sets and a site per scope (issue 11 part 4); the rules
    that overlap others keep their own sites in order, and every log line names decide()'s rule."""
    allow = [f'{{ cidr = "11.1.{i}.0/24", port = 443 }}' for i in range(20)]
    allow += [f'{{ cidr = "11.2.{i}.0/24", port = 80 }}' for i in range(20)]
    # Overlapping: an earlier rule must stay first (11.1.0-3 on 443), and 11.2.5.0/24 on 80.
    allow += ['{ cidr = "11.1.0.0/22", port = "440-450" }', '{ host = "11.2.5.9" }']
    # Special blocks (kept alone) and a scope that overlaps no group (port 25).
    allow += ['{ cidr = "10.77.0.0/24", port = 8000 }', '{ cidr = "0.0.0.0/0", port = 25 }']
    deny = [f'{{ cidr = "11.3.{i}.0/24", port = 443 }}' for i in range(10)]
    deny += ['{ cidr = "11.3.0.0/23" }', '{ cidr = "11.3.0.0/16", protocol = "udp" }']
    deny += ['{ host = "11.1.7.7" }']
    # A group that holds the gateway's own address: judged in the input chain.
    deny += ['{ cidr = "10.201.0.20/30", port = 22 }', '{ cidr = "11.4.0.0/24", port = 22 }']
    text = (
        '[gateway]\nguest_pool = "10.201.0.0/16"\n[profiles.big]\ninternet = "allowlist"\n'
        f"allow = [{', '.join(allow)}]\ndeny = [{', '.join(deny)}]\n"
    )
    profile = with_gateway(parse_policy(text.encode(), "big.toml").profile("big"))
    compiled = Compiled.of(profile)
    grouped = [s for s in compiled.sites.values() if s.group is not None]
    sets = {s.group_set: s for s in grouped}
    assert sorted(len(s.group.rules) for s in sets.values() if s.group) == [2, 8, 16, 19], grouped
    # A deny group serves the forward and the input chain from one set (a site in each).
    assert [s.group_set for s in grouped].count("r1_g5") == 2, grouped
    addresses = ["11.1.3.4", "11.1.0.9", "11.1.7.7", "11.2.5.9", "11.2.5.10", "11.2.19.1"]
    addresses += [str(LINK.gateway)]
    addresses += ["11.3.2.1", "11.3.9.255", "11.3.0.1", "10.77.0.5", "8.8.8.8", "11.1.19.1"]
    ports = [("tcp", 443), ("tcp", 445), ("tcp", 80), ("tcp", 8000), ("udp", 443), ("tcp", 25)]
    ports += [("tcp", 22)]
    for address in addresses:
        for proto, port in ports:
            pkt = Packet(IPv4Address(address), proto, port)
            compiled.check(pkt)
            d = compiled.decide(pkt)
            assert site_says(compiled, pkt) == (d.reason.key, d.rule_ref), pkt
