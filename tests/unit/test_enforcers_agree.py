"""Every enforcer agrees with ``decide()``: random policies, random attempts, pins included.

For each generated policy (domains with and without ports, port-scoped denies, CIDR allows
covering the guest pool, custom pools, exemptions, every mode) and each attempt "the guest
resolves NAME, then connects to its address on PORT", four answers must agree:

* the resolver (the real ``Resolver`` code, fed the question and an upstream answer made by
  dnspython): does the name resolve, is the answer given, which pin sets does it join;
* the compiled ruleset *with those pins*, evaluated as the kernel would (the evaluator of
  tests/nfteval.py), for the packet to the address;
* ``decide()`` for the same attempt with the name (the kernel cannot see the name: the pins
  are how it knows), and the TLS gate's verdict on the ClientHello's name;
* the proxy's judgement (it resolves the name and dials only the address it checked);
* the never-rules: no decision ever lets a guest reach another guest;
* inbound, from the uplink: ``decide_inbound()`` and the ruleset (expose rules' DNAT and
  forward sites) agree for every LAN client, port and protocol, and only ever lead to the
  guest the rule names; host-loopback ports are the only other ports of the gateway a guest
  reaches.

Each name has an address of its own here, so a pinned address stands for one name. Where two
names share an address, or the guest connects to a pinned address by number, the kernel is
stricter than decide() by design (an address pinned under a port-scoped deny is refused on that
port whoever reaches it); tests/unit/test_nfteval.py shows those cases one by one.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from ipaddress import IPv4Address, IPv4Network
from typing import Any

import dns.message
import dns.rrset
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandgate.gateway.dns import dnslogic
from sandgate.gateway.dns.resolver import GuestDNS, Resolver
from sandgate.gateway.proxy.flow import judge
from sandgate.net.compile import GuestLink, Site, base_ruleset, guest_add, pin6_set, pin_set
from sandgate.policy import dnsnames
from sandgate.policy.decide import (
    Attempt,
    Decision,
    decide,
    decide_answer,
    decide_inbound,
    decide_name,
    request_rules,
)
from sandgate.policy.load import parse_policy
from sandgate.policy.model import Protocol
from sandgate.policy.pins import pin_rules
from sandgate.policy.profile import Profile
from sandgate.policy.requests import gate_verdict
from tests.nfteval import Nft, Packet, Ruleset

TEST_INTERNET = (IPv4Network("203.0.113.0/24"), IPv4Network("198.51.100.0/24"))
POOLS = ("10.201.0.0/16", "10.202.0.0/16", "10.99.64.0/20")
# One address per name, so a pinned address stands for exactly one name.
NAMES = {
    "github.com": "203.0.113.30",
    "api.github.com": "203.0.113.31",
    "gist.github.com": "203.0.113.33",
    "pypi.org": "203.0.113.20",
    "files.pythonhosted.org": "203.0.113.21",
    "example.com": "198.51.100.10",
    "models.lan": "10.77.0.10",  # a LAN name: only an exemption opens it
    "rebind.example": "10.77.0.20",
    "metadata.example": "169.254.169.254",
}
DOMAINS = (
    "github.com",
    "*.github.com",
    "gist.github.com",
    "pypi.org",
    "*.pythonhosted.org",
    "example.com",
    "models.lan",
    "rebind.example",
)
NETS = (
    "10.0.0.0/8",
    "10.77.0.0/24",
    "203.0.113.0/24",
    "203.0.113.33/32",
    "198.51.100.0/24",
    "169.254.169.254/32",
    "10.77.0.10/32",
)
PORTS = (None, 22, 443, [80, 443], "8000-8100", [22, 443])
PROTOS = (None, "tcp", "udp")


def _scope(port: Any, proto: Any) -> str:
    out = ""
    if port is not None:
        out += f", port = {port!r}".replace("'", '"')
    if proto is not None:
        out += f', protocol = "{proto}"'
    return out


rule_scope = st.tuples(st.sampled_from(PORTS), st.sampled_from(PROTOS))
domain_rule = st.builds(
    lambda d, s: f'{{ domain = "{d}"{_scope(*s)} }}', st.sampled_from(DOMAINS), rule_scope
)
net_rule = st.builds(
    lambda n, s: f'{{ cidr = "{n}"{_scope(*s)} }}', st.sampled_from(NETS), rule_scope
)
# Request rules (issue 14): on names (HTTP and HTTPS) and on host:ports (plain HTTP).
HTTP = ('["GET /*"]', '["POST /v1/chat/completions", "GET /v1/models"]', '["* /simple/*"]')
REQUESTS = ("GET", "/x"), ("POST", "/v1/chat/completions"), ("GET", "/simple/r/"), ("PUT", "/")
request_rule = st.one_of(
    st.builds(
        lambda d, p, h: f'{{ domain = "{d}"{_scope(p, None)}, http = {h} }}',
        st.sampled_from(DOMAINS),
        st.sampled_from((None, 80, 443, [80, 443])),
        st.sampled_from(HTTP),
    ),
    st.builds(
        lambda d, p: f'{{ domain = "{d}"{_scope(p, None)}, process = ["/usr/bin/git"] }}',
        st.sampled_from(DOMAINS),
        st.sampled_from((None, 443)),
    ),
    st.builds(
        lambda a, p, h: f'{{ host = "{a}", port = {p}, http = {h} }}',
        st.sampled_from(("10.77.0.10", "203.0.113.20", "203.0.113.30")),
        st.sampled_from((80, 8000, 8080)),
        st.sampled_from(HTTP),
    ),
)


HOST_LOOPBACK = (11434, 1234, 8080)  # Ollama, LM Studio, and a port attempts also use
LAN_CLIENTS = ("10.77.0.10", "10.77.0.20", "10.77.0.30", "192.168.1.10", "203.0.113.30")
EXPOSE_FROM = ("10.77.0.10", "10.77.0.0/24", "192.168.1.10", "192.168.1.0/30")
EXPOSE_PORTS = (9119, 8080, 22)
loopback_rule = st.builds(lambda p: f"{{ host_loopback = {p} }}", st.sampled_from(HOST_LOOPBACK))
expose_rule = st.builds(
    lambda port, sources: f"{{ guest = \"p\", port = {port}, from = {list(sources)!r} }}".replace(
        "'", '"'
    ),
    st.sampled_from(EXPOSE_PORTS),
    st.lists(st.sampled_from(EXPOSE_FROM), min_size=1, max_size=2, unique=True),
)


@st.composite
def policies(draw: st.DrawFn) -> tuple[Profile, GuestLink]:
    pool = draw(st.sampled_from(POOLS))
    mode = draw(st.sampled_from(("locked", "open", "allowlist")))
    allow = draw(
        st.lists(
            st.one_of(domain_rule, net_rule, loopback_rule, request_rule), max_size=5, unique=True
        )
    )
    deny = draw(st.lists(st.one_of(domain_rule, net_rule), max_size=3, unique=True))
    expose = draw(st.lists(expose_rule, max_size=2, unique=True))
    text = (
        f'expose = [{", ".join(expose)}]\n'
        f'[gateway]\nguest_pool = "{pool}"\n[profiles.p]\ninternet = "{mode}"\n'
        f"allow = [{', '.join(allow)}]\ndeny = [{', '.join(deny)}]\n"
    )
    try:
        policy = parse_policy(text.encode(), "random.toml")
        link = GuestLink.from_pool(IPv4Network(pool), 3, "02:00:00:00:00:03")
        profile = policy.profile("p", public_override=TEST_INTERNET, gateway_address=link.gateway)
    except Exception as exc:  # a policy the loader refuses (a dead allow rule, a repeat)
        from hypothesis import reject

        assert "PolicyError" in type(exc).__name__, exc
        reject()
    return profile, link


class World:
    """One profile's enforcers, with the pins its resolver made so far."""

    def __init__(self, profile: Profile, link: GuestLink) -> None:
        self.profile, self.link = profile, link
        base, base_sites = base_ruleset("up0", profile.guest_pool, public_override=TEST_INTERNET)
        guest, guest_sites = guest_add(link, profile)
        self.ruleset = Ruleset(base + guest)
        # Verdict chains by name (their counter without "c_"), as the NFLOG reader finds them.
        self.sites = {
            s.counter.removeprefix("c_"): s for s in {**base_sites, **guest_sites}.values()
        }
        self.pinned: list[tuple[str, tuple[str, ...]]] = []
        self.proxied = False  # the last packet kernel() judged went to the proxy
        self.site: Site | None = None  # the verdict site it met
        self.resolver = Resolver([], lambda key, event: None, self._pin)
        self.dns = GuestDNS(link, None, profile, "p")

    def _pin(
        self, dns: GuestDNS, addresses: tuple[str, ...], ttl: int, tags: Any, insp: bool
    ) -> int:
        for tag in tags:
            self.ruleset.sets[pin_set(self.link.ifname, tag)] += list(addresses)
        if insp:  # HTTPS to an inspected name's addresses goes to the proxy
            self.ruleset.sets["inspect4"] += [{"concat": [self.link.ifname, a]} for a in addresses]
        self.pinned += [(a, tuple(tags)) for a in addresses]
        return 300

    def resolve(self, name: str) -> str | None:
        """The resolver's real code: the address the guest learns for ``name``, or None."""
        query = dns.message.make_query(name, "A")
        wire = query.to_wire()
        q = dnslogic.parse_question(wire)
        decision = dnsnames.judge_question(self.profile, name, dnslogic.A)
        entry = self.resolver._local(self.dns, q, decision)
        if entry is None:
            reply = dns.message.make_response(query)
            reply.answer.append(dns.rrset.from_text(name + ".", 300, "IN", "A", NAMES[name]))
            entry = self.resolver._judged(self.dns, q, decision, reply.to_wire(), None)
            self.resolver._answered(self.dns, wire, ("10.0.0.2", 5353), "udp", entry)
        # The resolver and the policy say the same: resolves iff the question and the answer
        # are both allowed (and the question is the name's: decide_name()).
        assert decision.allowed == decide_name(self.profile, name).allowed
        expected = (
            decision.allowed
            and decide_answer(self.profile, name, ipaddress.ip_address(NAMES[name])).allowed
        )
        given = entry.rcode == 0 and entry.decision.allowed and bool(entry.addresses)
        assert given == expected, (name, entry)
        if not given:
            return None
        want = tuple(p.tag for p in pin_rules(self.profile, name))
        assert entry.pin == want, (name, entry.pin, want)
        return entry.addresses[0]

    def kernel(self, address: str, proto: str, port: int | None) -> bool:
        pkt = Packet(IPv4Address(address), proto, port, self.link.ifname)
        reached, verdict = self.ruleset.judge(pkt, {self.link.gateway}, self.link.gateway)
        self.proxied = verdict.kind == "proxy"
        self.site = self.sites.get(verdict.site or "")
        return reached

    def logged(self, address: str, proto: str, port: int | None) -> Decision | None:
        """What the log reader makes of the last packet's line: a pin group's site names its
        rule from the tags the resolver pinned the address under (policy/pins.py)."""
        site = self.site
        if site is None:
            return None
        tags = [t for a, ts in self.pinned if a == address for t in ts]
        if site.pins is None:
            return site.decision
        return site.pins.at(site.decision, tags, port, Protocol(proto))


attempts = st.lists(
    st.tuples(
        st.sampled_from(sorted(NAMES)),
        st.sampled_from(("tcp", "udp")),
        st.sampled_from((22, 443, 8000, 8080, 53 + 1, 123)),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(policies(), attempts)
def test_resolver_ruleset_and_decide_agree(pol: tuple[Profile, GuestLink], tries: Any) -> None:
    profile, link = pol
    world = World(profile, link)
    for name, proto, port in tries:
        address = world.resolve(name)
        if address is None:
            continue  # the guest never learns an address for the name
        d = decide(profile, Attempt(Protocol(proto), ipaddress.ip_address(address), port, name))
        got = world.kernel(address, proto, port)
        if world.proxied:
            # The proxy judges it: an inspected name's HTTPS by name (dialling what it checked),
            # an intercepted host:port's plain HTTP by the address it was sent to.
            ip = ipaddress.ip_address(address)
            by_name = name if port == 443 else None
            got = judge(profile, by_name, ip if port != 443 else None, port, lambda n, a=ip: [a])
            got = got.decision.allowed
        assert got == d.allowed, (
            f"{name} → {address} {proto}/{port}: decide() {d.key} ({d.rule_ref}), kernel "
            f"{'accepts' if got else 'refuses'}; pins {world.pinned}"
        )
        logged = world.logged(address, proto, port)
        if not world.proxied and world.site is not None and world.site.pins is not None:
            # A grouped pin site's line names decide()'s rule (its reason is allow.pinned
            # where decide() says allow.rule: the address was allowed through the name).
            assert logged is not None and logged.rule_ref == d.rule_ref, (
                f"{name} → {address} {proto}/{port}: decide() {d.key} ({d.rule_ref}), the log "
                f"{logged and logged.key} ({logged and logged.rule_ref}); pins {world.pinned}"
            )
        if proto == "tcp" and port == 443 and not profile.proxied(name):
            # The kernel's TLS gate then judges the ClientHello's name (a name whose requests
            # are judged is inspected: the resolver sent its addresses to the proxy).
            sni = gate_verdict(profile, d, name)
            assert sni.allowed == d.allowed, (name, sni.key, d.key)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(policies(), st.sampled_from(sorted(NAMES)), st.sampled_from((80, 443, 8000, 22)))
def test_the_proxy_agrees(pol: tuple[Profile, GuestLink], name: str, port: int) -> None:
    """The proxy (explicit door: the guest names the host, the proxy resolves and dials what
    it checked) against decide() with the name and the address it dials."""
    profile, _ = pol
    address = ipaddress.ip_address(NAMES[name])
    judged = judge(profile, name, None, port, lambda n: [address])
    d = decide(profile, Attempt(Protocol.TCP, address, port, name))
    first = decide(profile, Attempt(Protocol.TCP, None, port, name))
    assert judged.decision.allowed == (first.allowed and d.allowed), (name, port, judged, d)
    assert (judged.address is not None) == judged.decision.allowed


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(
    policies(),
    st.sampled_from(sorted(NAMES)),
    st.sampled_from((80, 443, 8000, 8080)),
    st.sampled_from(REQUESTS),
    st.booleans(),
)
def test_requests_reach_only_what_decide_allows(
    pol: tuple[Profile, GuestLink], name: str, port: int, request: tuple[str, str], raw: bool
) -> None:
    """A request, by name or to the name's address by number: either the kernel sends it
    to the proxy, which judges it with decide() and the request, or the kernel passes it
    itself, and then no allow rule judges requests to that destination (they would go
    unjudged), or it refuses it."""
    profile, link = pol
    world = World(profile, link)
    address = world.resolve(name) if not raw else NAMES[name]
    if address is None:
        return
    ip = ipaddress.ip_address(address)
    by_name = None if raw else name
    conn = decide(profile, Attempt(Protocol.TCP, ip, port, by_name))
    pkt = Packet(IPv4Address(address), "tcp", port, link.ifname)
    reached, verdict = world.ruleset.judge(pkt, {link.gateway}, link.gateway)
    method, path = request
    d = decide(profile, Attempt(Protocol.TCP, ip, port, by_name, method, path))
    judging = request_rules(profile, Attempt(Protocol.TCP, ip, port, by_name))
    if verdict.kind == "proxy":
        host = by_name or address
        if port not in (80, 443):  # an intercepted host:port: judged by where it was sent
            judged = judge(profile, None, ip, port, lambda n: [ip], request)
            by_address = decide(profile, Attempt(Protocol.TCP, ip, port, None, method, path))
            assert judged.decision.allowed == by_address.allowed, (address, port, request)
        elif port == 443 and by_name is not None and not profile.proxied(name):
            pass  # sent to the proxy only because the address is the gateway's own
        else:  # port 80 by its Host, inspected HTTPS by its SNI and Host
            judged = judge(profile, host, None, port, lambda n: [ip], request)
            first = decide(profile, Attempt(Protocol.TCP, None, port, by_name, method, path))
            want = d.allowed and (by_name is None or first.allowed)
            assert judged.decision.allowed == want, (host, port, request, judged, d)
        return
    if reached:
        assert conn.allowed, (address, port, conn.key)
        if port == 443 and by_name is not None and profile.proxied(name):
            return  # the TLS gate refuses an inspected name reached this way (gate_verdict)
        assert not judging, f"{address}:{port} passes raw, but {judging[0]} judges requests"
        if port in (80, 443) and by_name is not None:  # the kernel cannot tell programs apart
            curl = Attempt(Protocol.TCP, ip, port, by_name, by_process=True, exe="/bin/curl")
            assert decide(profile, curl).allowed == conn.allowed, (name, port)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(policies(), st.integers(0, 2**14 - 1), st.sampled_from(("tcp", "udp", "icmp")))
def test_no_policy_reaches_another_guest(
    pol: tuple[Profile, GuestLink], offset: int, proto: str
) -> None:
    profile, link = pol
    pool = profile.guest_pool
    target = pool.network_address + offset % pool.num_addresses
    if target == link.gateway:
        return
    port = None if proto == "icmp" else 8080
    d = decide(profile, Attempt(Protocol(proto), target, port))
    assert not d.allowed, (target, d.key)
    assert not World(profile, link).kernel(str(target), proto, port)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(
    policies(),
    st.sampled_from(("tcp", "udp")),
    st.sampled_from((53, 3128, 15080, 15443, 22, 8080, 11434, 1234)),
)
def test_the_gateways_own_ports(pol: tuple[Profile, GuestLink], proto: str, port: int) -> None:
    """Resolver and proxy are reached whatever the rules say (a deny of 10.0.0.0/8 included);
    a host-loopback rule's port only over TCP and unless a deny rule covers the gateway;
    every other port of the gateway never is."""
    profile, link = pol
    d = decide(profile, Attempt(Protocol(proto), link.gateway, port))
    world = World(profile, link)
    reached = world.kernel(str(link.gateway), proto, port)
    assert reached == d.allowed, (proto, port, d.key)
    service = port == 53 or (proto == "tcp" and port in (3128, 15080, 15443))
    loopback = proto == "tcp" and port in {r.spec.host_loopback for r in profile.host_loopback()}
    denied = any(
        r.matches_address(link.gateway, port, Protocol(proto)) for r in profile.deny
    )
    assert d.allowed == (service or (loopback and not denied)), (proto, port, d.key)
    if d.allowed and not service:
        assert d.key == "allow.host_loopback"
        _, verdict = world.ruleset.judge(
            Packet(link.gateway, proto, port, link.ifname), {link.gateway}, link.gateway
        )
        assert verdict.site is not None and verdict.site.startswith(f"in_{link.ifname}_")


UPLINK, UPLINK_ADDRESS = "up0", IPv4Address("10.77.0.2")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(
    policies(),
    st.sampled_from(LAN_CLIENTS),
    st.sampled_from(("tcp", "udp")),
    st.sampled_from((*EXPOSE_PORTS, 9120, 53)),
)
def test_inbound_agrees(
    pol: tuple[Profile, GuestLink], client: str, proto: str, port: int
) -> None:
    """A LAN client's new connection to the gateway's uplink address: decide_inbound() and the
    ruleset agree, the ruleset logs decide_inbound()'s reason, and what gets in gets only to
    this guest, on the port the client asked for."""
    profile, link = pol
    world = World(profile, link)
    source = IPv4Address(client)
    d = decide_inbound(profile, source, Protocol(proto), port)
    pkt = Packet(UPLINK_ADDRESS, proto, port, UPLINK, saddr=source)
    reached, verdict, landed = world.ruleset.judge_inbound(pkt, {UPLINK_ADDRESS, link.gateway})
    assert reached == d.allowed, (client, proto, port, d.key, verdict)
    assert world.sites[verdict.site or ""].reason == d.key, (verdict, d.key)
    if reached:
        assert landed == link.guest
    # The guest's own address is no way in either (nothing is routed to it unasked).
    direct = Packet(link.guest, proto, port, UPLINK, saddr=source)
    assert not world.ruleset.judge_inbound(direct, {UPLINK_ADDRESS, link.gateway})[0]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(policies(), st.sampled_from(("tcp", "udp", "icmp")))
def test_no_policy_reaches_the_host(pol: tuple[Profile, GuestLink], proto: str) -> None:
    """The host the gateway runs on (here a "public" address the rules may cover) is closed
    whatever the rules allow, in decide() and in the kernel."""
    profile, link = pol
    host = IPv4Address("203.0.113.33")  # also gist.github.com's here: even a pinned name
    profile = dataclasses.replace(profile, host_addresses=(host,))
    world = World(profile, link)
    world.resolve("gist.github.com")
    port = None if proto == "icmp" else 22
    d = decide(profile, Attempt(Protocol(proto), host, port, "gist.github.com"))
    assert not d.allowed and d.key in ("deny.host", "deny.rule"), d.key
    assert not world.kernel(str(host), proto, port)


# IPv6 destinations (issue 14 part 5): public, the test world's v6 internet, ULA, link-local,
# multicast, metadata, and forms carrying an IPv4 (NAT64, 6to4, Teredo) of private and public.
V6_TARGETS = (
    "2606:4700:4700::1111",
    "2001:db8:1::10",
    "fd00::1",
    "fe80::1",
    "ff02::1",
    "fd00:ec2::254",
    "64:ff9b::a4d:a",  # NAT64 of 10.77.0.10, the model server
    "64:ff9b::808:808",
    "2002:a00:1::1",  # 6to4 of 10.0.0.1
    "2001:0:808:404::f5ff:fffe",  # Teredo, client 10.0.0.1
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(
    policies(),
    st.sampled_from(sorted(NAMES)),
    st.sampled_from(V6_TARGETS),
    st.sampled_from(("tcp", "udp")),
    st.sampled_from((80, 443, 8000)),
)
def test_ipv6_where_the_uplink_has_none(
    pol: tuple[Profile, GuestLink], name: str, target: str, proto: str, port: int
) -> None:
    """Today's gateways have no IPv6 uplink (``Profile.uplink_ipv6`` False): whatever the
    policy, decide() refuses every IPv6 destination (by its class, or ``deny.ipv6``), the
    real resolver answers AAAA questions empty with ``deny.ipv6``, the proxy dials none, and
    the kernel drops every IPv6 frame at the link (``deny.ipv6``)."""
    profile, link = pol
    assert not profile.uplink_ipv6
    world = World(profile, link)
    address = ipaddress.IPv6Address(target)
    for d in (
        decide(profile, Attempt(Protocol(proto), address, port)),
        decide(profile, Attempt(Protocol(proto), address, port, name)),
    ):
        assert not d.allowed, (target, d.key)
    q = dnslogic.parse_question(dns.message.make_query(name, "AAAA").to_wire())
    question = dnsnames.judge_question(profile, name, dnslogic.AAAA)
    entry = world.resolver._local(world.dns, q, question)
    if decide_name(profile, name).allowed and question.reason.key == "deny.ipv6":
        assert entry is not None and entry.rcode == 0 and not entry.addresses
    else:  # refused as a name, or answered by the gateway itself (a front): never upstream
        assert entry is not None and all(a != target for a in entry.addresses)
    judged = judge(profile, name, None, port, lambda n: [address])
    assert not judged.decision.allowed and judged.address is None
    frame = Packet(IPv4Address("203.0.113.1"), proto, port, link.ifname, ethertype="ip6")
    base, base_sites = base_ruleset("up0", profile.guest_pool, public_override=TEST_INTERNET)
    guest, guest_sites = guest_add(link, profile)
    nft = Nft(base + guest, {**base_sites, **guest_sites}, link)
    verdict = nft.ingress(frame)
    assert verdict.kind == "drop" and nft.sites[verdict.site or ""].reason == "deny.ipv6"


# -- where the uplink has IPv6 (issue 14 part 5): AAAA answers judged and pinned like A ------
# One IPv6 address per name; the special names answer with special IPv6 (ULA, a NAT64 form of
# the NAS, the AWS IPv6 metadata endpoint): rebinding, refused as such.
NAMES6 = {
    **{n: f"2001:db8:203::{i + 1:x}" for i, n in enumerate(sorted(NAMES))},
    "models.lan": "fd00::10",
    "rebind.example": "64:ff9b::a4d:14",
    "metadata.example": "fd00:ec2::254",
}


class World6(World):
    """``World`` on a gateway whose uplink has IPv6: the resolver's AAAA answers, the IPv6
    pin sets they fill (as gateway/lifecycle.py's ``pin`` does), the IPv6 ruleset."""

    def __init__(self, profile: Profile, link: GuestLink) -> None:
        profile = dataclasses.replace(profile, uplink_ipv6=True)
        super().__init__(profile, link)
        over = (*TEST_INTERNET, ipaddress.IPv6Network("2001:db8::/32"))
        self.profile = profile = dataclasses.replace(profile, public_override=over)
        base, _ = base_ruleset("up0", profile.guest_pool, public_override=over, ipv6=True)
        guest, _ = guest_add(link, profile)
        self.ruleset = Ruleset(base + guest)
        self.dns = GuestDNS(link, None, profile, "p6")

    def _pin(
        self, dns: GuestDNS, addresses: tuple[str, ...], ttl: int, tags: Any, insp: bool
    ) -> int:
        v6 = [a for a in addresses if ":" in a]
        for tag in tags:
            self.ruleset.sets[pin6_set(self.link.ifname, tag)] += v6
        self.pinned += [(a, tuple(tags)) for a in v6]
        return 300

    def resolve6(self, name: str) -> str | None:
        query = dns.message.make_query(name, "AAAA")
        wire = query.to_wire()
        q = dnslogic.parse_question(wire)
        decision = dnsnames.judge_question(self.profile, name, dnslogic.AAAA)
        entry = self.resolver._local(self.dns, q, decision)
        if entry is None:
            reply = dns.message.make_response(query)
            reply.answer.append(dns.rrset.from_text(name + ".", 300, "IN", "AAAA", NAMES6[name]))
            entry = self.resolver._judged(self.dns, q, decision, reply.to_wire(), None)
            self.resolver._answered(self.dns, wire, ("10.0.0.2", 5353), "udp", entry)
        address = ipaddress.ip_address(NAMES6[name])
        expected = decision.allowed and decide_answer(self.profile, name, address).allowed
        given = entry.rcode == 0 and entry.decision.allowed and bool(entry.addresses)
        assert given == expected, (name, entry)
        return entry.addresses[0] if given else None

    def kernel6(self, address: str, proto: str, port: int | None) -> bool:
        pkt = Packet.v6(ipaddress.IPv6Address(address), proto, port, iifname=self.link.ifname)
        pkt = pkt.on(self.link)
        local = {self.link.gateway, self.link.gateway6}
        reached, verdict = self.ruleset.judge(pkt, local, self.link.gateway, self.link.gateway6)
        self.proxied = verdict.kind == "proxy"
        return reached


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(policies(), attempts)
def test_aaaa_answers_pins_and_the_ipv6_ruleset_agree(
    pol: tuple[Profile, GuestLink], tries: Any
) -> None:
    """The guest resolves NAME's AAAA, then connects to that address: the resolver (answer
    given or refused, pins), the IPv6 ruleset with those pins (443 through the proxy, which
    judges the SNI) and decide() with the name agree."""
    world = World6(*pol)
    profile = world.profile
    for name, proto, port in tries:
        address = world.resolve6(name)
        if address is None:
            continue
        ip = ipaddress.ip_address(address)
        d = decide(profile, Attempt(Protocol(proto), ip, port, name))
        got = world.kernel6(address, proto, port)
        if world.proxied:
            got = judge(profile, name, None, port, lambda n, a=ip: [a]).decision.allowed
        assert got == d.allowed, (
            f"{name} → {address} {proto}/{port}: decide() {d.key} ({d.rule_ref}), kernel "
            f"{'accepts' if got else 'refuses'}; pins {world.pinned}"
        )


def test_aaaa_pins_in_allowlist_mode_every_name_and_port() -> None:
    """The same agreement, every name, protocol and port, under an allowlist whose names
    resolve (random policies seldom allowlist the names they try)."""
    text = (
        '[gateway]\nguest_pool = "10.201.0.0/16"\n[profiles.p]\ninternet = "allowlist"\n'
        'allow = [{ domain = "pypi.org" }, { domain = "*.github.com", port = 443 }, '
        '{ domain = "example.com", port = [22, 8000], protocol = "tcp" }]\n'
        'deny = [{ domain = "gist.github.com", port = 22 }]\n'
    )
    link = GuestLink.from_pool(IPv4Network("10.201.0.0/16"), 3, "02:00:00:00:00:03")
    profile = parse_policy(text.encode(), "a.toml").profile(
        "p", public_override=TEST_INTERNET, gateway_address=link.gateway
    )
    reached = 0
    for name in sorted(NAMES):
        for proto in ("tcp", "udp"):
            for port in (22, 443, 8000, 8080, 123):
                world = World6(profile, link)  # fresh pins: each attempt resolves first
                address = world.resolve6(name)
                if address is None:
                    continue
                ip = ipaddress.ip_address(address)
                d = decide(world.profile, Attempt(Protocol(proto), ip, port, name))
                got = world.kernel6(address, proto, port)
                if world.proxied:
                    judged = judge(world.profile, name, None, port, lambda n, a=ip: [a])
                    got = judged.decision.allowed
                assert got == d.allowed, (name, address, proto, port, d.key)
                reached += got
    assert reached >= 5  # the pins opened something: the test can tell a missing pin
