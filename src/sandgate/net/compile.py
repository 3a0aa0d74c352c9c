"""A profile compiled to nftables JSON, for the gateway namespace and for each guest namespace.

The forward chain of each guest follows ``decide()`` step by step (see policy/decide.py), so
the kernel reaches the same verdict ``decide()`` does for every address-level attempt:

    deny rules → other guests (lateral) → port-scoped deny rules of names the guest resolved
    (pin sets) → allow rules (a special block only if the rule names it or a part of it) →
    special-purpose ranges → QUIC, DNS-over-TLS → the mode (open: accept; allowlist: addresses
    its allowed names resolved to, on those rules' ports; locked: drop)

Which special blocks a rule may open, and which sets an answered name's addresses join, are
the policy's to say (policy/exemptions.py, policy/pins.py); this module only writes them down.

DNS to any server is redirected to the gateway's own resolver before routing (prerouting), and
the gateway's own ports are closed but for that resolver (input). A netdev ingress chain on each
guest link admits only IPv4 and ARP from the guest's own MAC and address: spoofed sources,
IPv6 and other ethertypes never reach routing. Where the uplink has IPv6 (``uplink_ipv6``) it
admits the guest's own IPv6 address too, judged by chains of its own (see "IPv6" below).

Every verdict site jumps to a small chain of its own: an exact named counter, then NFLOG
(rate-limited for drops), then the verdict. The NFLOG prefix names the site; ``Site`` records
what it means (guest, verdict, reason, rule) so a log line is attributed without parsing rules.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sandgate.gcpause import paused_gc
from sandgate.policy.decide import (
    GATEWAY_PROXY_PORTS,
    Attempt,
    Decision,
    Reason,
    allow,
    decide,
    deny,
    request_rules,
)
from sandgate.policy.exemptions import (
    NEVER_EXEMPT6,
    inner_special,
    inner_special6,
    is_exemption,
    special4,
    special6,
    touches_special,
)
from sandgate.policy.groups import RuleGroup, group_address_rules
from sandgate.policy.model import IPNetwork, Mode, Protocol
from sandgate.policy.pins import PinGroup, pin_groups, set_of
from sandgate.policy.profile import GUEST_POOL6, Profile, Rule

Json = dict[str, Any]

TABLE = "sandgate"
GROUP_DROP = 1  # NFLOG group for drops in the gateway namespace
GROUP_ACCEPT = 2  # accepted new flows
GROUP_GUEST = 3  # in each guest namespace: new outbound flows with the sending uid
# -- the log flush marker (issue 13) ----------------------------------------------------------
# A datagram only the gateway itself can send (local output, this socket mark) that each of its
# log groups logs with queue-threshold 1: the kernel then sends that group's queued records at
# once, the marker last, so a reader that sees the marker has read everything logged before it.
# It is dropped, never counted, and no site has its prefix (gateway/logfeed.py ``flush``).
FLUSH_MARK = 0x53470F1A
FLUSH_PREFIX = "sg:flush"
# -- end of the flush marker ------------------------------------------------------------------
# The proxy's ports on each guest's gateway address (decide() allows exactly these).
PROXY_PORTS = GATEWAY_PROXY_PORTS
PROXY_EXPLICIT_PORT, PROXY_HTTP_PORT, PROXY_TLS_PORT = PROXY_PORTS


@dataclass(frozen=True)
class Limits:
    drop_log_rate: int = 500  # NFLOG events per second per site; counters stay exact
    drop_log_burst: int = 1000
    pin_timeout_min: int = 60  # seconds an allowlisted address stays pinned at least
    pin_timeout_max: int = 3600

    def pin_timeout(self, ttl: int) -> int:
        """How long the kernel keeps an answer's pinned addresses: its TTL, bounded."""
        return max(self.pin_timeout_min, min(ttl, self.pin_timeout_max))


@dataclass(frozen=True)
class Site:
    """One place in the ruleset that decides: the Decision its log lines carry."""

    prefix: str  # the NFLOG prefix, e.g. "sg:g5:3"
    guest: str | None  # guest link name, None for gateway-wide sites
    decision: Decision  # deny.special is told its address by the reader (at_address)
    counter: str = ""
    # A site for a group of address rules (policy/groups.py): the reader names the group's
    # rule for the packet's address (at_address); ``group_set`` is its interval set.
    group: RuleGroup | None = None
    group_set: str = ""
    # A pin group's site (policy/pins.py): the reader names the rule from the tags the
    # resolver pinned the packet's address under (``PinGroup.at``).
    pins: PinGroup | None = None

    @property
    def verdict(self) -> str:
        return self.decision.verdict.value

    @property
    def reason(self) -> str:
        return self.decision.key

    @property
    def rule(self) -> str | None:
        return self.decision.rule_ref


@dataclass(frozen=True)
class GuestLink:
    """One guest's point-to-point link, as seen from the gateway."""

    index: int
    ifname: str  # the gateway-side link name, e.g. "g5"
    subnet: ipaddress.IPv4Network
    gateway: ipaddress.IPv4Address
    guest: ipaddress.IPv4Address
    mac: str  # the guest end's MAC address

    @classmethod
    def from_pool(cls, pool: IPNetwork, index: int, mac: str) -> GuestLink:
        base = int(pool.network_address) + 4 * index
        subnet = ipaddress.IPv4Network((base, 30))
        if not subnet.subnet_of(pool):  # type: ignore[arg-type]
            raise ValueError(f"guest {index} does not fit in the guest pool {pool}")
        return cls(
            index,
            f"g{index}",
            subnet,
            ipaddress.IPv4Address(base + 1),
            ipaddress.IPv4Address(base + 2),
            mac,
        )

    @classmethod
    def handed(cls, pool: IPNetwork, index: int, ifname: str) -> GuestLink:
        """A link the gateway was handed (a gateway VM's eth1): the guest's MAC is not ours to
        know, so its ingress chain pins the guest's address only."""
        made = cls.from_pool(pool, index, "")
        return cls(index, ifname, made.subnet, made.gateway, made.guest, "")

    # IPv6 (where the uplink has it): a /64 per guest index in GUEST_POOL6, gateway ::1,
    # guest ::2, NAT66 to the uplink's address (see ``_guest_forward6``).
    @property
    def subnet6(self) -> ipaddress.IPv6Network:
        if not 0 <= self.index < 1 << 16:
            raise ValueError(f"guest {self.index} does not fit in the IPv6 pool {GUEST_POOL6}")
        return ipaddress.IPv6Network((int(GUEST_POOL6.network_address) + (self.index << 64), 64))

    @property
    def gateway6(self) -> ipaddress.IPv6Address:
        return self.subnet6[1]

    @property
    def guest6(self) -> ipaddress.IPv6Address:
        return self.subnet6[2]


@dataclass
class _Builder:
    """Collects commands and sites for one table."""

    family: str
    limits: Limits
    cmds: list[Json] = field(default_factory=list)
    sites: dict[str, Site] = field(default_factory=dict)
    # Sites made so far per guest: the next one's number (kept, not counted, so a profile of
    # 100,000 rules compiles in linear time).
    per_guest: dict[str | None, int] = field(default_factory=dict)
    _groups: int = 0  # interval sets of grouped rules made so far

    def _number(self, guest: str | None) -> int:
        n = self.per_guest.get(guest, 0)
        self.per_guest[guest] = n + 1
        return n

    def add(self, kind: str, **spec: Any) -> None:
        self.cmds.append({"add": {kind: {"family": self.family, "table": TABLE, **spec}}})

    def rule(self, chain: str, *expr: Json) -> None:
        self.add("rule", chain=chain, expr=list(expr))

    def site(
        self,
        chain_prefix: str,
        guest: str | None,
        decision: Decision,
        *,
        log: bool = True,
        group: RuleGroup | None = None,
        group_set: str = "",
        pins: PinGroup | None = None,
    ) -> Json:
        """Make a verdict chain; return the ``jump`` statement that leads to it."""
        n = self._number(guest)
        name = f"{chain_prefix}_{n}"
        prefix = f"sg:{guest or '-'}:{n}"
        counter = f"c_{name}"
        self.add("counter", name=counter)
        self.add("chain", name=name)
        self.rule(name, {"counter": counter})
        # inet filter chains refuse (a TCP reset or ICMP administratively prohibited), so a
        # client fails at once instead of hanging on a timeout; netdev chains can only drop.
        refuse: Json = {"goto": {"target": "refuse"}} if self.family == "inet" else {"drop": None}
        if not decision.allowed:
            if log:
                self.rule(name, _limit_over(self.limits), refuse)
                self.rule(name, _log(prefix, GROUP_DROP), refuse)
            else:
                self.rule(name, refuse)
        else:
            # Log a flow once: later packets of a not yet answered flow (SYN retransmits) are
            # still "new" to conntrack; a ct mark bit tells them apart. Counters count them all.
            if log:
                self.rule(
                    name, _match(_ct_mark_bit(), 0), _set_ct_mark_bit(), _log(prefix, GROUP_ACCEPT)
                )
            self.rule(name, {"accept": None})
        self.sites[prefix] = Site(prefix, guest, decision, counter, group, group_set, pins)
        return {"jump": {"target": name}}

    def grouped(
        self, chain: str, guest: str, group: RuleGroup, decision: Decision, made: str = ""
    ) -> str:
        """One interval set of the group's networks (``made``: the one made for another chain
        already), one rule, one verdict site; the set's name."""
        name = made
        if not name:
            name = f"r{self._groups}_{guest}"
            self._groups += 1
            elems = _intervals(group.starts, group.ends)
            self.add("set", name=name, type="ipv4_addr", flags=["interval"], elem=elems)
        site = self.site(chain, guest, decision, group=group, group_set=name)
        self.rule(
            chain, _match(_payload("ip", "daddr"), "@" + name), *_scope_match(group.rules[0]), site
        )
        return name

    def mark(self, guest: str | None, decision: Decision) -> list[Json]:
        """A logging site inside another rule (no verdict of its own): counter, limit, log."""
        n = self._number(guest)
        prefix = f"sg:{guest or '-'}:{n}"
        counter = f"c_mark_{n}"
        self.add("counter", name=counter)
        self.sites[prefix] = Site(prefix, guest, decision, counter)
        return [{"counter": counter}, _limit(self.limits), _log(prefix, GROUP_DROP)]


ALIVE_SET = "alive"  # links a live daemon vouches for (gateway VM): forwarding needs it


def base_ruleset(
    uplink: str,
    pool: IPNetwork,
    *,
    public_override: Iterable[IPNetwork] = (),
    limits: Limits = Limits(),
    guest_ifnames: Iterable[str] | None = None,
    fence: bool = False,
    ipv6: bool = False,
) -> tuple[list[Json], dict[str, Site]]:
    """The gateway-wide tables; per-guest parts are added with ``guest_add``.

    ``guest_ifnames``: the guest links by name (handed interfaces); by default every ``g*``
    link the daemon makes. ``fence``: for a gateway whose tables outlive its daemon (a gateway
    VM): nothing is forwarded from a link unless it is in the ``alive`` set, whose elements the
    daemon keeps refreshing with a timeout (net/handed.py). A dead daemon stops refreshing and
    forwarding stops by itself, by a rule that does not depend on the daemon. ``ipv6``: the
    uplink has IPv6 (profiles with ``uplink_ipv6``): guests' IPv6 is judged, not dropped whole.
    """
    b = _Builder("inet", limits)
    guest_links: Any = "g*" if guest_ifnames is None else {"set": sorted(guest_ifnames)}
    cmds: list[Json] = [
        {"add": {"table": {"family": "inet", "name": TABLE}}},
        {"delete": {"table": {"family": "inet", "name": TABLE}}},
        {"add": {"table": {"family": "inet", "name": TABLE}}},
        {"add": {"table": {"family": "netdev", "name": TABLE}}},
        {"delete": {"table": {"family": "netdev", "name": TABLE}}},
        {"add": {"table": {"family": "netdev", "name": TABLE}}},
    ]
    b.add(
        "set",
        name="special4",
        type="ipv4_addr",
        flags=["interval"],
        elem=_prefixes(special4(public_override)) or [_prefix(ipaddress.ip_network("0.0.0.0/32"))],
    )
    b.add("map", name="fwd", type="ifname", map="verdict")
    b.add("map", name="in", type="ifname", map="verdict")
    b.add("set", name="inspect4", type=["ifname", "ipv4_addr"], flags=["timeout"])
    # Inbound forwards (expose): the uplink port → the guest's chain that DNATs it, and the
    # guest's address → its chain that admits the forwarded flow. Filled per guest.
    b.add("map", name="xpre", type="inet_service", map="verdict")
    b.add("map", name="xfwd", type="ipv4_addr", map="verdict")
    b.add("set", name="intercept4", type=["ifname", "ipv4_addr", "inet_service"])
    # Refused, not dropped: ICMP "administratively prohibited" for every protocol. A client
    # fails at once (no route to host), and can tell the gateway's refusal from the far end's
    # (a TCP reset, connection refused): what `sandgate prove` relies on.
    b.add("chain", name="refuse")
    b.rule("refuse", {"reject": {"type": "icmpx", "expr": "admin-prohibited"}})
    b.add("chain", name="forward", type="filter", hook="forward", prio=0, policy="drop")
    b.add("chain", name="input", type="filter", hook="input", prio=0, policy="drop")
    b.add("chain", name="output", type="filter", hook="output", prio=0, policy="accept")
    # the gateway's own flush marker (FLUSH_MARK above): flush each log group, then drop it
    b.rule("output", _match(_meta("mark"), FLUSH_MARK), *_flush_logs())
    b.add("chain", name="prerouting", type="nat", hook="prerouting", prio=-100, policy="accept")
    b.add("chain", name="postrouting", type="nat", hook="postrouting", prio=100, policy="accept")
    if fence:
        b.add("set", name=ALIVE_SET, type="ifname", flags=["timeout"])
        b.rule("forward", _match(_meta("iifname"), "@" + ALIVE_SET, op="!="), {"drop": None})

    invalid = b.site("gw", None, deny(Reason.INVALID))
    no_ipv6 = b.site("gw", None, deny(Reason.IPV6))
    inbound = b.site("gw", None, deny(Reason.INBOUND))
    unknown = b.site("gw", None, deny(Reason.UNKNOWN_LINK))
    b.rule("forward", _ct_state("established", "related"), {"accept": None})
    b.rule("forward", _ct_state("invalid"), invalid)
    if not ipv6:
        b.rule("forward", _match(_meta("nfproto"), "ipv6"), no_ipv6)
    b.rule("forward", {"vmap": {"key": _meta("iifname"), "data": "@fwd"}})
    b.rule(
        "forward",
        _match(_meta("iifname"), uplink),
        _match({"ct": {"key": "status"}}, "dnat", op="in"),
        {"vmap": {"key": _payload("ip", "daddr"), "data": "@xfwd"}},
    )
    b.rule("forward", _match(_meta("iifname"), uplink), inbound)
    b.rule("forward", unknown)

    b.rule("input", _match(_meta("iif"), "lo"), {"accept": None})
    if ipv6:  # the uplink's neighbour discovery (guest links have static neighbours)
        b.rule("input", _match(_meta("iifname"), uplink), _icmp6(*_ND), {"accept": None})
    b.rule("input", _ct_state("established", "related"), {"accept": None})
    b.rule("input", {"vmap": {"key": _meta("iifname"), "data": "@in"}})
    b.rule("input", _match(_meta("iifname"), uplink), inbound)
    b.rule("input", unknown)

    # Every DNS packet from a guest, to any server, is answered by the gateway's resolver.
    # The attempt to use another server is logged as such (only the first packet of a flow
    # reaches a nat chain) before being redirected.
    dns = [
        _match(_meta("iifname"), guest_links),
        _match(_meta("l4proto"), {"set": ["udp", "tcp"]}),
        _match(_payload("th", "dport"), 53),
    ]
    not_local = _match({"fib": {"result": "type", "flags": ["daddr"]}}, "local", op="!=")
    b.rule("prerouting", *dns, not_local, *b.mark(None, deny(Reason.DNS_REDIRECT)))
    b.rule("prerouting", *dns, {"redirect": {"port": 53}})
    b.rule(
        "prerouting",
        _match(_meta("iifname"), uplink),
        _match(_meta("l4proto"), "tcp"),
        {"vmap": {"key": _payload("th", "dport"), "data": "@xpre"}},
    )
    # Plain HTTP goes to the proxy, which judges every request's Host. TLS stays in the kernel,
    # its ClientHello held for a verdict on the SNI (the TLS gate, net/iptables.py), except
    # where the gateway must speak TLS itself: to its own address (fronted services) and to
    # addresses of names the guest's profile inspects (filled in by the resolver, with TTLs).
    web = [_match(_meta("iifname"), guest_links), _match(_meta("l4proto"), "tcp")]
    local = _match({"fib": {"result": "type", "flags": ["daddr"]}}, "local")
    inspected = {"concat": [_meta("iifname"), _payload("ip", "daddr")]}
    tls = [[local], [_match(inspected, "@inspect4")]]
    _to_proxy(b, web, _payload("ip", "daddr"), "intercept4", tls, all_http=True)
    _masquerade(b, uplink, _payload("ip", "saddr"), pool)
    if ipv6:
        _base6(b, uplink, guest_links, public_override)
    cmds += b.cmds
    return cmds, b.sites


# -- IPv6 (issue 14 part 5): only where the uplink has IPv6 ------------------------------------
#
# Each guest gets a /64 of GUEST_POOL6 (ULA) on its link and is NATed (masquerade, as IPv4) to
# the uplink's address: NAT66, not a routed /64 per guest, because no uplink sandgate runs on
# (pasta, a gateway VM's eth0, the test world) delegates a prefix to the gateway, and so that,
# as for IPv4, a source address seen upstream never names a guest. Guest links carry no
# link-local chatter: no link-local address, no DAD, no RA (net/links.py), static neighbours
# both ways, and the neighbour-discovery and MLD the kernel would still send are dropped.
# Web ports go to the proxy: port 80 like IPv4's, and all TLS on 443, because the kernel's
# ClientHello gate (net/iptables.py) holds IPv4 only; the TLS door judges the SNI as the gate
# does and passes the bytes through unless the name is inspected.

_ND = ("nd-neighbor-solicit", "nd-neighbor-advert")
# What an IPv6 interface says by itself: neighbour and router discovery, MLD.
_CHATTER6 = (
    *_ND,
    "nd-router-solicit",
    "nd-router-advert",
    "nd-redirect",
    "mld-listener-query",
    "mld-listener-report",
    "mld-listener-done",
    "mld2-listener-report",
)
# Transition forms and unrouted scopes no allow rule opens; ::/127 (unspecified, loopback)
# stays with its own class, which a rule naming it exempts as decide() does.
_NEVER6 = sorted(
    ipaddress.collapse_addresses(
        [
            *(n for n in NEVER_EXEMPT6 if n != ipaddress.IPv6Network("::/96")),
            *ipaddress.IPv6Network("::/96").address_exclude(ipaddress.IPv6Network("::/127")),
        ]
    )
)


def _icmp6(*types: str) -> Json:
    return _match(_payload("icmpv6", "type"), {"set": list(types)})


def _base6(
    b: _Builder, uplink: str, guest_links: Any, public_override: Iterable[IPNetwork]
) -> None:
    b.add(
        "set",
        name="special6",
        type="ipv6_addr",
        flags=["interval"],
        elem=_prefixes(special6(public_override)) or ["::"],
    )
    b.add("set", name="never6", type="ipv6_addr", flags=["interval"], elem=_prefixes(_NEVER6))
    b.add("set", name="intercept6", type=["ifname", "ipv6_addr", "inet_service"])
    b.rule("output", _match(_meta("oifname"), guest_links), _icmp6(*_CHATTER6), {"drop": None})
    web = [
        _match(_meta("iifname"), guest_links),
        _match(_meta("nfproto"), "ipv6"),
        _match(_meta("l4proto"), "tcp"),
    ]
    # Port 80 is the IPv4 rule's (it names no family); all TLS goes to the TLS door.
    _to_proxy(b, web, _payload("ip6", "daddr"), "intercept6", [[]], all_http=False)
    _masquerade(b, uplink, _payload("ip6", "saddr"), GUEST_POOL6)


def _to_proxy(
    b: _Builder,
    web: list[Json],
    daddr: Json,
    intercept_set: str,
    tls: list[list[Json]],
    *,
    all_http: bool,
) -> None:
    """A family's web traffic (``web``: from a guest link, TCP) to the proxy's doors: plain
    HTTP to a host:port whose allow rule judges requests (``intercept_set``, so neither
    --noproxy nor a raw socket goes around the request rules), with ``all_http`` every port
    80, and port 443 where each of ``tls`` matches (the rest of TLS stays with the kernel's
    ClientHello gate)."""
    intercepted = {"concat": [_meta("iifname"), daddr, _payload("th", "dport")]}
    to_http = {"redirect": {"port": PROXY_HTTP_PORT}}
    b.rule("prerouting", *web, _match(intercepted, "@" + intercept_set), to_http)
    if all_http:
        b.rule("prerouting", *web, _match(_payload("th", "dport"), 80), to_http)
    for more in tls:
        b.rule(
            "prerouting",
            *web,
            _match(_payload("th", "dport"), 443),
            *more,
            {"redirect": {"port": PROXY_TLS_PORT}},
        )


def _masquerade(b: _Builder, uplink: str, saddr: Json, pool: IPNetwork) -> None:
    """The guests' flows leave with the uplink's address: a source never names a guest."""
    b.rule(
        "postrouting",
        _match(_meta("oifname"), uplink),
        _match(saddr, _prefix(pool)),
        {"masquerade": None},
    )


def _guest_forward6(b: _Builder, link: GuestLink, profile: Profile, fwd: str, inp: str) -> None:
    """The guest's IPv6, judged in decide()'s order (the IPv4 chains' twins)."""
    g = link.ifname
    fwd6, in6 = f"fwd6_{g}", f"in6_{g}"
    b.add("chain", name=fwd6)
    b.add("chain", name=in6)
    v6 = _match(_meta("nfproto"), "ipv6")
    b.rule(fwd, v6, {"goto": {"target": fwd6}})
    b.rule(inp, v6, {"goto": {"target": in6}})
    pins = pin_groups(profile)
    for pin in pins:
        b.add("set", name=pin6_set(g, pin.tag), type="ipv6_addr", flags=["timeout"])
    daddr = _payload("ip6", "daddr")
    denies = [r for r in profile.deny if r.spec.network is not None and r.spec.network.version == 6]
    for rule in denies:
        b.rule(fwd6, *_rule_match6(rule), b.site(fwd6, g, deny(Reason.RULE_DENY, rule=rule)))
    b.rule(fwd6, _match(daddr, _prefix(profile.guest_pool6)), b.site(fwd6, g, deny(Reason.LATERAL)))
    hosts = [str(a) for a in profile.host_addresses if a.version == 6]
    if hosts:
        b.rule(fwd6, _match(daddr, {"set": hosts}), b.site(fwd6, g, deny(Reason.HOST)))
    for pin in pins:
        if pin.action == "deny":
            site = b.site(fwd6, g, deny(Reason.RULE_DENY, rule=_only(pin)), pins=pin)
            scope = _scope_match6(pin.rules[0].rule)
            b.rule(fwd6, _match(daddr, "@" + pin6_set(g, pin.tag)), *scope, site)
    # Transition forms and unrouted scopes: the reader names the class, or deny.ipv6_embedding
    # for a public IPv4 inside (at_address), as decide() does.
    b.rule(fwd6, _match(daddr, "@never6"), b.site(fwd6, g, deny(Reason.SPECIAL)))
    over = profile.public_override
    for rule in profile.allow:
        net = rule.spec.network
        if not isinstance(net, ipaddress.IPv6Network):
            continue
        inner = inner_special6(net, over)
        exclude = [_match(daddr, {"set": _prefixes(inner)}, op="!=")] if inner else []
        reason = Reason.EXEMPT if is_exemption(net, over) else Reason.RULE_ALLOW
        b.rule(fwd6, *_rule_match6(rule), *exclude, b.site(fwd6, g, allow(reason, rule)))
    b.rule(fwd6, _match(daddr, "@special6"), b.site(fwd6, g, deny(Reason.SPECIAL)))
    _after_rules(
        b, fwd6, g, profile, pins,
        lambda pin: [_match(daddr, "@" + pin6_set(g, pin.tag)),
                     *_scope_match6(pin.rules[0].rule)],
    )  # fmt: skip

    # The gateway's IPv6 address on the link serves only the web flows redirected to the
    # proxy (conntrack's dnat status tells them from a guest dialling it); the resolver is
    # the IPv4 one. Everything else there is the guest pool's, as decide() judges it.
    b.rule(
        in6,
        _match(_payload("ip6", "daddr"), str(link.gateway6)),
        _match({"ct": {"key": "status"}}, "dnat", op="in"),
        _match(_meta("l4proto"), "tcp"),
        _match(_payload("th", "dport"), {"set": [PROXY_HTTP_PORT, PROXY_TLS_PORT]}),
        {"accept": None},
    )
    for rule in denies:
        b.rule(in6, *_rule_match6(rule), b.site(in6, g, deny(Reason.RULE_DENY, rule=rule)))
    # Link-scope multicast (ff02::1, solicited-node groups) is delivered here, not forwarded:
    # refused as the class it is (at_address: deny.multicast), as decide() names it.
    multicast = _match(_payload("ip6", "daddr"), _prefix(ipaddress.IPv6Network("ff00::/8")))
    b.rule(in6, multicast, b.site(in6, g, deny(Reason.SPECIAL)))
    b.rule(in6, b.site(in6, g, deny(Reason.LATERAL)))
    intercepts = intercept_elements6(g, profile)
    if intercepts:
        b.add("element", name="intercept6", elem=intercepts)


def intercept_elements6(ifname: str, profile: Profile) -> list[Json]:
    """``intercept_elements``' IPv6 twin: plain HTTP to an IPv6 host:port with request rules."""
    elems: list[Json] = []
    for rule in profile.allow:
        net = rule.spec.network
        if not rule.spec.requests or not isinstance(net, ipaddress.IPv6Network):
            continue
        for port, _ in rule.spec.ports:
            attempt = Attempt(Protocol.TCP, net.network_address, port)
            if decide(profile, attempt).allowed and request_rules(profile, attempt):
                elem: Json = {"concat": [ifname, str(net.network_address), port]}
                if elem not in elems:
                    elems.append(elem)
    return elems


def pin6_set(guest: str, tag: str) -> str:
    """The IPv6 twin of ``pin_set``: the AAAA addresses a pin group's names resolved to."""
    return f"pin6_{guest}_{set_of(tag)}"


def pin_elements6(
    link: GuestLink,
    addresses: Iterable[str],
    ttl: int,
    tags: Iterable[str],
    limits: Limits = Limits(),
) -> list[Json]:
    """Add AAAA addresses to the IPv6 pin sets named by ``tags``, timing out with their TTL."""
    timeout = limits.pin_timeout(ttl)
    elems = [{"elem": {"val": a, "timeout": timeout}} for a in addresses]
    names = dict.fromkeys(pin6_set(link.ifname, tag) for tag in tags)  # a group's rules: one set
    return [{"add": {"element": {**_inet, "name": name, "elem": elems}}} for name in names]


def _rule_match6(rule: Rule) -> list[Json]:
    assert rule.spec.network is not None
    return [_match(_payload("ip6", "daddr"), _prefix(rule.spec.network)), *_scope_match6(rule)]


def _scope_match6(rule: Rule) -> list[Json]:
    """``_scope_match`` for IPv6 packets: a rule's "icmp" is ICMPv6 there."""
    out = _scope_match(rule)
    for m in out:
        right = m["match"]["right"]
        if m["match"]["left"] == _meta("l4proto") and isinstance(right, dict):
            right["set"] = ["ipv6-icmp" if p == "icmp" else p for p in right["set"]]
    return out


def _guest_remove6(link: GuestLink, profile: Profile) -> tuple[list[Json], list[str]]:
    """The IPv6 parts of a guest: its intercept elements to delete, its pin sets' names."""
    g = link.ifname
    cmds: list[Json] = []
    intercepts = intercept_elements6(g, profile)
    if intercepts:
        cmds.append({"delete": {"element": {**_inet, "name": "intercept6", "elem": intercepts}}})
    return cmds, [pin6_set(g, p.tag) for p in pin_groups(profile)]


def guest_add(
    link: GuestLink, profile: Profile, limits: Limits = Limits()
) -> tuple[list[Json], dict[str, Site]]:
    """Commands that add one guest (apply them in one batch, after ``base_ruleset``)."""
    with paused_gc():  # 100,000 rules' JSON all lives on (sandgate/gcpause.py)
        return _guest_add(link, profile, limits)


def _guest_add(
    link: GuestLink, profile: Profile, limits: Limits
) -> tuple[list[Json], dict[str, Site]]:
    g = link.ifname
    b = _Builder("inet", limits)
    fwd, inp = f"fwd_{g}", f"in_{g}"
    b.add("chain", name=fwd)
    b.add("chain", name=inp)
    pins = pin_groups(profile)
    for pin in pins:
        b.add("set", name=pin_set(g, pin.tag), type="ipv4_addr", flags=["timeout"])
    if profile.uplink_ipv6:  # IPv6 goes to chains of its own first (issue 14 part 5)
        _guest_forward6(b, link, profile, fwd, inp)

    # Address rules: a site each where they overlap another rule, else one interval set and
    # one site per scope (policy/groups.py); either way the log names decide()'s rule.
    denies, deny_groups = group_address_rules(
        [r for r in profile.deny if r.spec.network is not None and r.spec.network.version == 4]
    )
    for rule in denies:
        b.rule(fwd, *_rule_match(rule), b.site(fwd, g, deny(Reason.RULE_DENY, rule=rule)))
    deny_sets = [b.grouped(fwd, g, group, deny(Reason.RULE_DENY)) for group in deny_groups]
    b.rule(
        fwd,
        _match(_payload("ip", "daddr"), _prefix(profile.guest_pool)),
        b.site(fwd, g, deny(Reason.LATERAL)),
    )
    host = _host_match(profile)
    if host:
        b.rule(fwd, *host, b.site(fwd, g, deny(Reason.HOST)))
    # Addresses the guest learnt under a name that a port-scoped deny rule speaks to.
    for pin in pins:
        if pin.action == "deny":
            site = b.site(fwd, g, deny(Reason.RULE_DENY, rule=_only(pin)), pins=pin)
            b.rule(fwd, *_pin_match(g, pin), site)

    def alone(rule: Rule) -> bool:  # a special block to exclude or to exempt: its own site
        net, over = rule.spec.network, profile.public_override
        if net is None or not touches_special(net):
            return net is None
        return bool(inner_special(net, over)) or is_exemption(net, over)

    allows, allow_groups = group_address_rules(
        [r for r in profile.allow if r.spec.network is not None and r.spec.network.version == 4],
        alone,
    )
    for rule in allows:
        net = rule.spec.network
        assert net is not None
        inner = inner_special(net, profile.public_override)
        exclude = (
            [_match(_payload("ip", "daddr"), {"set": _prefixes(inner)}, op="!=")] if inner else []
        )
        reason = Reason.EXEMPT if is_exemption(net, profile.public_override) else Reason.RULE_ALLOW
        b.rule(fwd, *_rule_match(rule), *exclude, b.site(fwd, g, allow(reason, rule)))
    for group in allow_groups:
        b.grouped(fwd, g, group, allow(Reason.RULE_ALLOW))
    b.rule(fwd, _match(_payload("ip", "daddr"), "@special4"), b.site(fwd, g, deny(Reason.SPECIAL)))
    _after_rules(b, fwd, g, profile, pins, lambda pin: _pin_match(g, pin))

    # The gateway itself: the guest's own resolver and nothing else.
    own = _match(_payload("ip", "daddr"), str(link.gateway))
    b.rule(
        inp,
        own,
        _match(_meta("l4proto"), {"set": ["udp", "tcp"]}),
        _match(_payload("th", "dport"), 53),
        {"accept": None},
    )
    b.rule(
        inp,
        own,
        _match(_meta("l4proto"), "tcp"),
        _match(_payload("th", "dport"), {"set": list(PROXY_PORTS)}),
        {"accept": None},
    )
    # Deny rules before the gateway's other ports, as decide() judges them (step 2 before 3):
    # grouped as in the forward chain, through the same sets (a blocklist of 100,000 networks
    # is a few sites here too, not one chain each).
    for rule in denies:
        b.rule(inp, *_rule_match(rule), b.site(inp, g, deny(Reason.RULE_DENY, rule=rule)))
    for group, name in zip(deny_groups, deny_sets, strict=True):
        b.grouped(inp, g, group, deny(Reason.RULE_DENY), made=name)
    # A port of the host's own loopback, relayed by the gateway (gateway/hostlo.py): after
    # the deny rules, as decide() judges it.
    for rule in profile.host_loopback():
        b.rule(
            inp,
            own,
            _match(_meta("l4proto"), "tcp"),
            _match(_payload("th", "dport"), rule.spec.host_loopback),
            b.site(inp, g, allow(Reason.HOST_LOOPBACK, rule)),
        )
    b.rule(inp, own, b.site(inp, g, deny(Reason.GATEWAY_PORT)))
    if host:  # through pasta the gateway holds the host's own address
        b.rule(inp, *host, b.site(inp, g, deny(Reason.HOST)))
    b.rule(inp, b.site(inp, g, deny(Reason.LATERAL)))

    b.add("element", name="fwd", elem=[[g, {"jump": {"target": fwd}}]])
    b.add("element", name="in", elem=[[g, {"jump": {"target": inp}}]])
    if profile.expose:
        _expose(b, link, profile)
    intercepts = intercept_elements(g, profile)
    if intercepts:
        b.add("element", name="intercept4", elem=intercepts)
    cmds = b.cmds
    nd_cmds, nd_sites = _guest_ingress(link, limits, ipv6=profile.uplink_ipv6)
    return cmds + nd_cmds, {**b.sites, **nd_sites}


def _expose(b: _Builder, link: GuestLink, profile: Profile) -> None:
    """Inbound forwards to this guest: its exposed ports, from the clients each rule names,
    are DNATed to the guest (prerouting) and admitted (forward); any other client meets the
    uplink's ``deny.inbound`` like everything else that comes in unasked."""
    g = link.ifname
    pre, fwd = f"xpre_{g}", f"xfwd_{g}"
    b.add("chain", name=pre)
    b.add("chain", name=fwd)
    for rule in profile.expose:
        sources = _match(_payload("ip", "saddr"), {"set": _prefixes(rule.sources)})
        port = _match(_payload("th", "dport"), rule.port)
        tcp = _match(_meta("l4proto"), "tcp")
        # Only what is sent to the gateway itself (its uplink address), not what passes by.
        local = _match({"fib": {"result": "type", "flags": ["daddr"]}}, "local")
        dnat = {"dnat": {"family": "ip", "addr": str(link.guest)}}
        b.rule(pre, sources, tcp, port, local, dnat)
        site = b.site(fwd, g, allow(Reason.EXPOSE, detail=str(rule)))
        b.rule(fwd, sources, tcp, port, site)
    ports = sorted({r.port for r in profile.expose})
    b.add("element", name="xpre", elem=[[p, {"jump": {"target": pre}}] for p in ports])
    b.add("element", name="xfwd", elem=[[str(link.guest), {"jump": {"target": fwd}}]])


def intercept_elements(ifname: str, profile: Profile) -> list[Json]:
    """``ifname . address . port`` for each host:port the guest may reach whose requests are
    judged (policy: ``request_rules``): its plain HTTP is sent to the proxy's HTTP door."""
    elems: list[Json] = []
    for rule in profile.allow:
        net = rule.spec.network
        if not rule.spec.requests or net is None or net.version != 4:
            continue
        for port, _ in rule.spec.ports:  # single ports (the model refuses ranges here)
            attempt = Attempt(Protocol.TCP, net.network_address, port)
            if decide(profile, attempt).allowed and request_rules(profile, attempt):
                elem: Json = {"concat": [ifname, str(net.network_address), port]}
                if elem not in elems:
                    elems.append(elem)
    return elems


def _guest_ingress(
    link: GuestLink, limits: Limits, ipv6: bool = False
) -> tuple[list[Json], dict[str, Site]]:
    """netdev ingress on the guest link: only IPv4 and ARP (and, ``ipv6``, IPv6), from the
    guest's own MAC and address."""
    g = link.ifname
    b = _Builder("netdev", limits)
    chain = f"ing_{g}"
    b.add("chain", name=chain, type="filter", hook="ingress", dev=g, prio=-500, policy="drop")
    # Sites are numbered apart from the inet table's by their chain-name prefix.
    mac_spoof = b.site(f"l2_{g}", f"{g}/l2", deny(Reason.SPOOF_MAC)) if link.mac else None
    ip_spoof = b.site(f"l2_{g}", f"{g}/l2", deny(Reason.SPOOF_IP))
    arp_spoof = b.site(f"l2_{g}", f"{g}/l2", deny(Reason.SPOOF_ARP))
    ipv6_site = b.site(f"l2_{g}", f"{g}/l2", deny(Reason.IPV6))
    other = b.site(f"l2_{g}", f"{g}/l2", deny(Reason.ETHERTYPE))
    ether_type = _payload("ether", "type")
    if mac_spoof is not None:
        b.rule(chain, _match(_payload("ether", "saddr"), link.mac, op="!="), mac_spoof)
    b.rule(
        chain,
        _match(ether_type, "ip"),
        _match(_payload("ip", "saddr"), str(link.guest)),
        {"accept": None},
    )
    b.rule(chain, _match(ether_type, "ip"), ip_spoof)
    b.rule(
        chain,
        _match(ether_type, "arp"),
        _match(_payload("arp", "saddr ip"), str(link.guest)),
        {"accept": None},
    )
    b.rule(chain, _match(ether_type, "arp"), arp_spoof)
    if ipv6:  # the guest's own IPv6 address only: no link-local, no unspecified source
        ip6 = _match(ether_type, "ip6")
        b.rule(chain, ip6, _match(_payload("ip6", "saddr"), str(link.guest6)), {"accept": None})
        b.rule(chain, ip6, b.site(f"l2_{g}", f"{g}/l2", deny(Reason.SPOOF_IP)))
    b.rule(chain, _match(ether_type, "ip6"), ipv6_site)
    b.rule(chain, other)
    return b.cmds, b.sites


_inet = {"family": "inet", "table": TABLE}


def guest_remove(link: GuestLink, sites: Iterable[Site], profile: Profile) -> list[Json]:
    """Commands that remove everything ``guest_add`` made for this guest (one batch)."""
    g = link.ifname
    sites = list(sites)
    cmds: list[Json] = [
        {"delete": {"element": {"family": "inet", "table": TABLE, "name": "fwd", "elem": [g]}}},
        {"delete": {"element": {"family": "inet", "table": TABLE, "name": "in", "elem": [g]}}},
    ]
    intercepts = intercept_elements(g, profile)
    if intercepts:
        target = {"family": "inet", "table": TABLE, "name": "intercept4"}
        cmds.append({"delete": {"element": {**target, "elem": intercepts}}})
    chains = {"inet": [f"fwd_{g}", f"in_{g}"], "netdev": [f"ing_{g}"]}
    pin6_sets: list[str] = []
    if profile.uplink_ipv6:
        more, pin6_sets = _guest_remove6(link, profile)
        cmds += more
        chains["inet"] += [f"fwd6_{g}", f"in6_{g}"]
    if profile.expose:
        ports = sorted({r.port for r in profile.expose})
        cmds += [
            {"delete": {"element": {**_inet, "name": "xpre", "elem": ports}}},
            {"delete": {"element": {**_inet, "name": "xfwd", "elem": [str(link.guest)]}}},
        ]
        chains["inet"] += [f"xpre_{g}", f"xfwd_{g}"]
    counters: dict[str, list[str]] = {"inet": [], "netdev": []}
    for site in sites:
        fam = "netdev" if site.guest and site.guest.endswith("/l2") else "inet"
        chains[fam].append(site.counter.removeprefix("c_"))
        counters[fam].append(site.counter)
    for fam, names in chains.items():
        cmds += [{"flush": {"chain": {"family": fam, "table": TABLE, "name": n}}} for n in names]
    for fam, names in chains.items():
        cmds += [{"delete": {"chain": {"family": fam, "table": TABLE, "name": n}}} for n in names]
    for fam, names in counters.items():
        cmds += [{"delete": {"counter": {"family": fam, "table": TABLE, "name": n}}} for n in names]
    cmds += [
        {"delete": {"set": {"family": "inet", "table": TABLE, "name": pin_set(g, p.tag)}}}
        for p in pin_groups(profile)
    ]
    grouped = dict.fromkeys(site.group_set for site in sites if site.group_set)  # a set serves
    cmds += [{"delete": {"set": {**_inet, "name": name}}} for name in grouped]  # two chains
    cmds += [{"delete": {"set": {**_inet, "name": n}}} for n in pin6_sets]
    return cmds


def guest_uid_log(ipv6: bool = False) -> list[Json]:
    """The table in each guest's own namespace: log every new outbound flow with its uid.

    The guest's processes hold no capability in that namespace, so they cannot change it.
    It drops nothing the gateway would pass; it exists for attribution (uid, and the 5-tuple
    before NAT), and drops IPv6 as a second wall behind the disabled IPv6 on the link; with
    ``ipv6`` (the uplink has it) only what the link would say by itself: neighbour and router
    discovery, MLD (its neighbours are static, net/links.py).
    """
    drop6 = [_icmp6(*_CHATTER6)] if ipv6 else [_match(_meta("nfproto"), "ipv6")]
    t = {"family": "inet", "table": TABLE}
    return [
        {"add": {"table": {"family": "inet", "name": TABLE}}},
        {"delete": {"table": {"family": "inet", "name": TABLE}}},
        {"add": {"table": {"family": "inet", "name": TABLE}}},
        {
            "add": {
                "chain": {
                    **t,
                    "name": "output",
                    "type": "filter",
                    "hook": "output",
                    "prio": -150,
                    "policy": "accept",
                }
            }
        },
        {
            "add": {
                "rule": {
                    **t,
                    "chain": "output",
                    "expr": [_match(_meta("oif"), "lo"), {"accept": None}],
                }
            }
        },
        {
            "add": {
                "rule": {
                    **t,
                    "chain": "output",
                    "expr": [
                        _ct_state("new"),
                        _match(_ct_mark_bit(), 0),
                        _set_ct_mark_bit(),
                        _log("sg:uid", GROUP_GUEST, qthresh=1),
                    ],
                }
            }
        },
        {
            "add": {
                "rule": {
                    **t,
                    "chain": "output",
                    "expr": [*drop6, {"drop": None}],
                }
            }
        },
    ]


def pin_set(guest: str, tag: str) -> str:
    """The name of one pin group's set for one guest (policy/pins.py), from the group's tag
    (``a0``) or one of its rules' (``a0.3``)."""
    return f"pin_{guest}_{set_of(tag)}"


def pin_elements(
    link: GuestLink,
    addresses: Iterable[str],
    ttl: int,
    tags: Iterable[str],
    limits: Limits = Limits(),
) -> list[Json]:
    """Add addresses to the pin sets named by ``tags``, timing out with their TTL. (The kernel
    sets an element's timeout anew when it is added again, shorter too: a caller pinning into
    a set that may hold the address longer passes the longer TTL.)"""
    timeout = limits.pin_timeout(ttl)
    elems = [{"elem": {"val": a, "timeout": timeout}} for a in addresses]
    names = dict.fromkeys(pin_set(link.ifname, tag) for tag in tags)  # a group's rules: one set
    return [
        {
            "add": {
                "element": {
                    "family": "inet",
                    "table": TABLE,
                    "name": name,
                    "elem": elems,
                }
            }
        }
        for name in names
    ]


def _after_rules(
    b: _Builder,
    chain: str,
    g: str,
    profile: Profile,
    pins: Sequence[PinGroup],
    pin_match: Callable[[PinGroup], list[Json]],
) -> None:
    """The steps after a family's rules and special blocks: QUIC and DNS-over-TLS refused,
    then the mode (open; allowlist: the pinned answers of allow rules, then refused; locked).
    ``pin_match`` is the family's match of a pin group's set."""
    b.rule(
        chain,
        _match(_meta("l4proto"), "udp"),
        _match(_payload("th", "dport"), 443),
        b.site(chain, g, deny(Reason.QUIC)),
    )
    b.rule(
        chain,
        _match(_meta("l4proto"), {"set": ["udp", "tcp"]}),
        _match(_payload("th", "dport"), 853),
        b.site(chain, g, deny(Reason.DNS_BYPASS)),
    )
    if profile.mode is Mode.OPEN:
        b.rule(chain, b.site(chain, g, allow(Reason.OPEN)))
    elif profile.mode is Mode.ALLOWLIST:
        for pin in pins:
            if pin.action == "allow":
                site = b.site(chain, g, allow(Reason.PINNED, _only(pin)), pins=pin)
                b.rule(chain, *pin_match(pin), site)
        b.rule(chain, b.site(chain, g, deny(Reason.NOT_ALLOWLISTED)))
    else:
        b.rule(chain, b.site(chain, g, deny(Reason.LOCKED)))


def _pin_match(guest: str, pin: PinGroup) -> list[Json]:
    """An address in the group's pin set, on its rules' own ports and protocols."""
    return [
        _match(_payload("ip", "daddr"), "@" + pin_set(guest, pin.tag)),
        *_scope_match(pin.rules[0].rule),
    ]


def _only(pin: PinGroup) -> Rule | None:
    """A group of one rule names it on its site, as before groups; a larger group's lines are
    told their rule by the log reader (``PinGroup.at``)."""
    return pin.rules[0].rule if len(pin.rules) == 1 else None


def _host_match(profile: Profile) -> list[Json]:
    hosts = [str(a) for a in profile.host_addresses if a.version == 4]
    return [_match(_payload("ip", "daddr"), {"set": hosts})] if hosts else []


def _rule_match(rule: Rule) -> list[Json]:
    spec = rule.spec
    out: list[Json] = []
    if spec.network is not None:
        out.append(_match(_payload("ip", "daddr"), _prefix(spec.network)))
    return out + _scope_match(rule)


def _scope_match(rule: Rule) -> list[Json]:
    """The rule's ports and protocols (nothing when it speaks to every port and protocol)."""
    spec = rule.spec
    out: list[Json] = []
    protos = sorted(p.value for p in spec.protocols)
    if spec.ports:
        out.append(_match(_meta("l4proto"), {"set": [p for p in protos if p != "icmp"]}))
        ports: list[Any] = [lo if lo == hi else {"range": [lo, hi]} for lo, hi in spec.ports]
        out.append(_match(_payload("th", "dport"), {"set": ports}))
    elif spec.protocols != frozenset(Protocol):
        out.append(_match(_meta("l4proto"), {"set": protos}))
    return out


def _prefix(net: IPNetwork) -> Json | str:
    # By the prefix length: num_addresses computes the broadcast address (50,000 elements).
    if net.prefixlen == net.max_prefixlen:
        return str(net.network_address)
    return {"prefix": {"addr": str(net.network_address), "len": net.prefixlen}}


def _intervals(starts: Sequence[int], ends: Sequence[int]) -> list[Json | str]:
    """Sorted, disjoint IPv4 spans as interval-set elements, touching ones merged: the kernel
    keeps each interval as two elements, and builds a notification for each one it adds
    whenever anything on the host listens for nftables changes (the gateway's own commit
    monitor does), most of a 100,000-rule apply."""
    out: list[Json | str] = []
    lo = hi = -2
    for start, end in zip(starts, ends, strict=True):
        if start == hi + 1:
            hi = end
            continue
        if lo >= 0:
            out.append(_span_element(lo, hi))
        lo, hi = start, end
    if lo >= 0:
        out.append(_span_element(lo, hi))
    return out


def _span_element(lo: int, hi: int) -> Json | str:
    size = hi - lo + 1
    if size & (size - 1) == 0 and lo % size == 0:  # a prefix
        length = 33 - size.bit_length()
        return _dotted(lo) if length == 32 else {"prefix": {"addr": _dotted(lo), "len": length}}
    return {"range": [_dotted(lo), _dotted(hi)]}


def _dotted(value: int) -> str:
    """An IPv4 address's text from its number (str(IPv4Address) without the object)."""
    return f"{value >> 24}.{value >> 16 & 255}.{value >> 8 & 255}.{value & 255}"


def _prefixes(nets: Iterable[IPNetwork]) -> list[Json | str]:
    return [_prefix(n) for n in nets]


def _match(left: Json, right: Any, op: str = "==") -> Json:
    return {"match": {"op": op, "left": left, "right": right}}


def _meta(key: str) -> Json:
    return {"meta": {"key": key}}


def _payload(protocol: str, fld: str) -> Json:
    return {"payload": {"protocol": protocol, "field": fld}}


def _ct_state(*states: str) -> Json:
    return _match({"ct": {"key": "state"}}, list(states) if len(states) > 1 else states[0], op="in")


def _flush_logs() -> list[Json]:
    """A flush marker: logged to each gateway group with queue-threshold 1, then dropped."""
    return [
        _log(FLUSH_PREFIX, GROUP_DROP, qthresh=1),
        _log(FLUSH_PREFIX, GROUP_ACCEPT, qthresh=1),
        {"drop": None},
    ]


def _log(prefix: str, group: int, qthresh: int = 64) -> Json:
    return {"log": {"prefix": prefix, "group": group, "queue-threshold": qthresh}}


LOGGED_BIT = 0x80000000  # ct mark bit: this flow's first packet was logged


def _ct_mark_bit() -> Json:
    return {"&": [{"ct": {"key": "mark"}}, LOGGED_BIT]}


def _set_ct_mark_bit() -> Json:
    mark = {"ct": {"key": "mark"}}
    return {"mangle": {"key": mark, "value": {"|": [mark, LOGGED_BIT]}}}


def _limit(limits: Limits) -> Json:
    return {
        "limit": {
            "rate": limits.drop_log_rate,
            "per": "second",
            "burst": limits.drop_log_burst,
            "burst_unit": "packets",
        }
    }


def _limit_over(limits: Limits) -> Json:
    return {
        "limit": {
            "rate": limits.drop_log_rate,
            "per": "second",
            "burst": limits.drop_log_burst,
            "burst_unit": "packets",
            "inv": True,
        }
    }


def inspect_elements(
    link: GuestLink, addresses: Iterable[str], ttl: int, limits: Limits = Limits()
) -> Json:
    """Send this guest's TLS to these addresses (of an inspected name) to the proxy, for a TTL."""
    timeout = limits.pin_timeout(ttl)
    elems = [{"elem": {"val": {"concat": [link.ifname, a]}, "timeout": timeout}} for a in addresses]
    return {
        "add": {"element": {"family": "inet", "table": TABLE, "name": "inspect4", "elem": elems}}
    }
