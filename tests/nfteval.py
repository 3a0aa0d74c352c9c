"""An evaluator for the nftables JSON that ``sandgate.net.compile`` emits, for differential tests.

It follows one new frame from a guest link the way the kernel would: the link's netdev ingress
chain (source MAC, source address, ethertype), then the inet table (prerouting's DNS and web
redirects, routing to input or forward, the per-guest chains and their verdict sites). Named
sets are evaluated with their elements, so a ruleset can be judged with pinned addresses:

    nft = Nft(cmds, sites, link)
    nft.evaluate(Packet(IPv4Address("151.101.0.223"), "tcp", 443),
                 sets={"pinp_g5": [{"concat": ["151.101.0.223", "tcp", {"range": [440, 450]}]}]})
    -> ("accept", "allow.pinned")

``evaluate`` answers ``(verdict, reason_key)``: ``accept`` (it reaches its destination),
``deny`` (dropped or refused) or ``proxy`` (delivered to the gateway's proxy, which judges it
with ``decide()`` and the name it reads: the kernel's part ends there). The reason is the key of
the verdict site that decided (``Site.reason``), ``allow.gateway_dns``/``allow.gateway_proxy``
for the gateway's own resolver and proxy (plain accepts), None where no site speaks.

Anything it does not know (a statement, an expression, a set element) raises ``Unknown``, so a
new shape of rule in compile.py fails a test loudly instead of being skipped. Out of scope:
established flows (every packet is conntrack's "new"), rate limits (never exceeded), timeouts
(every element is live), and routing subtleties the ruleset relies on but does not express
(127/8 martians, broadcast and multicast delivered locally): only the given local addresses
(the guests' gateway addresses) are local.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address, ip_network
from typing import Any

from sandgate.net.compile import PROXY_HTTP_PORT, PROXY_PORTS, PROXY_TLS_PORT, GuestLink, Site

Json = dict[str, Any]
Sets = Mapping[str, Iterable[Any]]
# Web ports redirected in prerouting, and the proxy listener each one goes to.
PROXIED = {80: PROXY_HTTP_PORT, 443: PROXY_TLS_PORT}
_PROTO_NUMBERS = {1: "icmp", 6: "tcp", 17: "udp"}  # inet_proto elements may be numbers


@dataclass(frozen=True)
class Packet:
    """The first packet of a flow from a guest. Unset layer-2 fields are the link's guest's."""

    daddr: IPv4Address | IPv6Address  # IPv6: ethertype "ip6" (``Packet.v6``)
    proto: str  # "tcp" | "udp" | "icmp" ("icmp" of an IPv6 packet is ICMPv6)
    dport: int | None  # None for ICMP
    iifname: str | None = None  # the gateway-side link it arrives on
    name: str | None = None  # the name the proxy reads (SNI, Host); for decide(), not nft
    saddr: IPv4Address | IPv6Address | None = None  # or an ARP packet's sender address
    smac: str | None = None
    ethertype: str = "ip"  # "ip" | "arp" | "ip6" | "vlan" ...
    dnat: bool = False  # conntrack's "ct status dnat": prerouting rewrote the destination
    icmp_type: str | None = None  # an ICMPv6 type by nft's name ("nd-neighbor-solicit")

    @classmethod
    def v6(cls, daddr: IPv6Address, proto: str, dport: int | None, **kw: Any) -> Packet:
        return cls(daddr, proto, dport, ethertype="ip6", **kw)

    def on(self, link: GuestLink) -> Packet:
        """This packet with its unset fields filled in from the link it is sent on."""
        own = link.guest6 if self.ethertype == "ip6" else link.guest
        return replace(
            self,
            iifname=self.iifname or link.ifname,
            saddr=self.saddr or own,
            smac=self.smac or link.mac,
        )


@dataclass(frozen=True)
class Verdict:
    kind: str  # "accept" | "drop" | "reject" | "redirect" | "proxy" | "dnat"
    site: str | None  # the verdict chain (or inline mark) that decided, if any
    to: IPv4Address | IPv6Address | None = None  # a dnat's new destination


@dataclass
class Chain:
    rules: list[list[Json]] = field(default_factory=list)
    policy: str | None = None  # base chains only

    def is_site(self, name: str) -> bool:
        """compile.py's verdict chains open with their own named counter."""
        return bool(self.rules) and self.rules[0] == [{"counter": f"c_{name}"}]


class Unknown(AssertionError):
    """compile.py emitted something this evaluator does not understand."""


class Ruleset:
    """One family's table (inet, or netdev for the links' ingress) of a list of nft JSON
    commands, evaluated for one packet at a time. ``sets`` adds elements to named sets."""

    def __init__(
        self, cmds: Iterable[Json], family: str = "inet", sets: Sets | None = None
    ) -> None:
        self.chains: dict[str, Chain] = {}
        self.sets: dict[str, list[Any]] = {}
        self.maps: dict[str, dict[str, Json]] = {}
        for cmd in cmds:
            ((op, body),) = cmd.items()
            ((kind, spec),) = body.items()
            if spec.get("family") != family or op != "add":
                continue  # the other family's table, deletes of a fresh table
            if kind == "chain":
                self.chains[spec["name"]] = Chain(policy=spec.get("policy"))
            elif kind == "rule":
                self.chains[spec["chain"]].rules.append(spec["expr"])
            elif kind == "set":
                self.sets[spec["name"]] = [_unwrap(e) for e in spec.get("elem", [])]
            elif kind == "map":
                self.maps[spec["name"]] = {}
            elif kind == "element":
                if spec["name"] in self.maps:
                    for key, verdict in spec["elem"]:
                        self.maps[spec["name"]][key] = verdict
                else:
                    self.sets[spec["name"]] += [_unwrap(e) for e in spec["elem"]]
            elif kind not in ("table", "counter"):
                raise Unknown(f"add {kind}")
        for name, elems in (sets or {}).items():
            if name not in self.sets:
                raise Unknown(f"no set named {name} in the ruleset")
            self.sets[name] += [_unwrap(e) for e in elems]

    # -- the path of a new packet from a guest ---------------------------------------------

    def judge(
        self,
        pkt: Packet,
        local: set[Any],
        gateway: IPv4Address,
        gateway6: IPv6Address | None = None,
    ) -> tuple[bool, Verdict]:
        """Does the packet reach ``pkt.daddr``? And which verdict said so. ``gateway`` is the
        address of the link's own gateway, where redirected packets are delivered."""
        self.last_mark: str | None = None  # an inline logging site passed on the way
        self.redirect_port: int | None = None
        pre = self.run_base("prerouting", pkt, local)
        door = self.redirect_port
        if pkt.ethertype == "ip6" and pre.kind == "redirect":
            gateway = gateway6  # type: ignore[assignment]  # the link's own IPv6 address
            assert gateway is not None, "an IPv6 packet needs the link's gateway6"
            pkt = replace(pkt, dnat=True)
        if pre.kind == "redirect" and pkt.proto == "tcp" and door in PROXIED.values():
            # Web traffic goes to the proxy's listener on the gateway, which judges it with
            # decide() (and the name, when there is one): the kernel's part is to get it there.
            # Port 80 and 443 go to their doors; an intercepted host:port to the HTTP door.
            into = replace(pkt, daddr=gateway, dport=door, name=None)
            got = self.run_base("input", into, local)
            return got.kind == "accept", Verdict("proxy", None) if got.kind == "accept" else got
        if pre.kind == "redirect":
            # To the gateway's own resolver, whatever server the guest asked.
            into = replace(pkt, daddr=gateway, name=None)
            got = self.run_base("input", into, local)
            reached = got.kind == "accept" and pkt.daddr == gateway
            return reached, got if reached else pre
        hook = "input" if pkt.daddr in local else "forward"
        got = self.run_base(hook, pkt, local)
        return got.kind == "accept", got

    def judge_inbound(
        self, pkt: Packet, local: set[IPv4Address]
    ) -> tuple[bool, Verdict, IPv4Address]:
        """A new packet arriving on the uplink (``pkt.iifname``): prerouting (an expose rule's
        DNAT), then forward (to where it was sent, or DNATed to), or input (``local``: the
        gateway's uplink address). Does it get through, which verdict said so, and where to."""
        self.last_mark = None
        pre = self.run_base("prerouting", pkt, local)
        if pre.kind == "dnat":
            assert pre.to is not None
            pkt = replace(pkt, daddr=pre.to, dnat=True)
        hook = "input" if pkt.daddr in local else "forward"
        got = self.run_base(hook, pkt, local)
        return got.kind == "accept", got, pkt.daddr

    def run_base(self, name: str, pkt: Packet, local: set[IPv4Address]) -> Verdict:
        got = self.run(name, pkt, local, None)
        if got is not None:
            return got
        policy = self.chains[name].policy
        assert policy is not None, f"{name} is not a base chain"
        return Verdict(policy, None)

    def run(
        self, name: str, pkt: Packet, local: set[IPv4Address], site: str | None
    ) -> Verdict | None:
        if self.chains[name].is_site(name):
            site = name
        for expr in self.chains[name].rules:
            got = self.rule(expr, pkt, local, site)
            if got is not None:
                return got
        return None

    def rule(
        self, expr: list[Json], pkt: Packet, local: set[IPv4Address], site: str | None
    ) -> Verdict | None:
        for stmt in expr:
            ((key, arg),) = stmt.items()
            if key == "match":
                if not self.match(arg, pkt, local):
                    return None
            elif key == "limit":
                if arg.get("inv"):  # "over the rate": never, here; the next rule logs
                    return None
            elif key == "counter":
                if isinstance(arg, str) and arg.startswith("c_mark_"):
                    self.last_mark = arg.removeprefix("c_")  # e.g. the DNS redirect's log
            elif key in ("log", "mangle"):
                pass
            elif key in ("jump", "goto"):
                got = self.run(arg["target"], pkt, local, site)
                if got is not None:
                    return got
                if key == "goto":
                    raise Unknown(f"goto {arg['target']} fell through")
            elif key == "vmap":
                value = self.value(arg["key"], pkt, local)
                vmap = self.maps[arg["data"].lstrip("@")]
                target = next((v for k, v in vmap.items() if elem_has(k, value)), None)
                if target is not None:
                    return self.rule([target], pkt, local, site)
            elif key in ("accept", "drop", "reject"):
                return Verdict(key, site)
            elif key == "redirect":
                self.redirect_port = arg.get("port")
                return Verdict(key, site or self.last_mark)
            elif key == "masquerade":
                return None
            elif key == "dnat" and set(arg) == {"family", "addr"} and arg["family"] == "ip":
                return Verdict(key, site, IPv4Address(arg["addr"]))
            else:
                raise Unknown(f"statement {stmt}")
        return None

    def value(self, left: Json, pkt: Packet, local: set[IPv4Address]) -> Any:
        ((key, arg),) = left.items()
        if key == "payload":
            field_ = (arg["protocol"], arg["field"])
            if field_ == ("ip", "daddr"):
                return pkt.daddr if pkt.ethertype == "ip" else None
            if field_ == ("ip", "saddr"):
                return pkt.saddr if pkt.ethertype == "ip" else None
            if field_ == ("ip6", "daddr"):
                return pkt.daddr if pkt.ethertype == "ip6" else None
            if field_ == ("ip6", "saddr"):
                return pkt.saddr if pkt.ethertype == "ip6" else None
            if field_ == ("icmpv6", "type"):
                return pkt.icmp_type if pkt.ethertype == "ip6" else None
            if field_ == ("arp", "saddr ip"):
                return pkt.saddr if pkt.ethertype == "arp" else None
            if field_ == ("ether", "saddr"):
                return pkt.smac
            if field_ == ("ether", "type"):
                return pkt.ethertype
            if field_ == ("th", "dport"):
                return pkt.dport
        elif key == "meta":
            v6 = pkt.ethertype == "ip6"
            return {
                "l4proto": "ipv6-icmp" if v6 and pkt.proto == "icmp" else pkt.proto,
                "iifname": pkt.iifname,
                "iif": pkt.iifname,
                "nfproto": "ipv6" if v6 else "ipv4",
            }[arg["key"]]
        elif key == "ct":
            return {"state": "new", "mark": 0, "status": "dnat" if pkt.dnat else None}[arg["key"]]
        elif key == "&":
            a, b = arg
            return self.value(a, pkt, local) & b
        elif key == "fib" and arg == {"result": "type", "flags": ["daddr"]}:
            return "local" if pkt.daddr in local else "unicast"
        elif key == "concat":
            return tuple(self.value(part, pkt, local) for part in arg)
        raise Unknown(f"value {left}")

    def match(self, m: Json, pkt: Packet, local: set[IPv4Address]) -> bool:
        value = self.value(m["left"], pkt, local)
        right, op = m["right"], m["op"]
        if isinstance(right, str) and right.startswith("@"):
            hit = any(elem_has(e, value) for e in self.sets[right[1:]])
        elif isinstance(right, dict) and "set" in right:
            hit = any(elem_has(e, value) for e in right["set"])
        elif isinstance(right, list) and op == "in":
            hit = value in right
        else:
            hit = elem_has(right, value)
        if op in ("==", "in"):
            return hit
        if op == "!=":
            return not hit
        raise Unknown(f"op {op}")


def _unwrap(elem: Any) -> Any:
    """``{"elem": {"val": X, "timeout": T}}`` (as pin_elements writes it) is X."""
    if isinstance(elem, dict) and "elem" in elem:
        return elem["elem"]["val"]
    return elem


@functools.cache
def _network(addr: str, length: int) -> IPv4Network | IPv6Network:
    """Parsed once: the edge walks test each set element against ~10k packets (half the
    unit suite's time in ``ipaddress`` otherwise)."""
    return ip_network((addr, length))


@functools.cache
def _address(text: str) -> IPv4Address | IPv6Address:
    return ip_address(text)


def elem_has(elem: Any, value: Any) -> bool:
    """Does one set element (or a rule's right-hand side) match the value?"""
    if value is None:
        return False  # e.g. th dport of an ICMP packet
    if isinstance(elem, dict) and "prefix" in elem:
        net = _network(elem["prefix"]["addr"], elem["prefix"]["len"])
        return isinstance(value, IPv4Address | IPv6Address) and value in net
    if isinstance(elem, dict) and "range" in elem:
        low, high = elem["range"]
        if isinstance(value, IPv4Address):
            return IPv4Address(low) <= value <= IPv4Address(high)
        if isinstance(value, int) and isinstance(low, int) and isinstance(high, int):
            return low <= value <= high
        raise Unknown(f"range {elem} for {value!r}")
    if isinstance(elem, dict) and "concat" in elem:
        parts = elem["concat"]
        if not isinstance(value, tuple) or len(parts) != len(value):
            raise Unknown(f"concatenation {elem} for {value!r}")
        return all(elem_has(p, v) for p, v in zip(parts, value, strict=True))
    if isinstance(value, IPv4Address | IPv6Address):
        if not isinstance(elem, str):
            raise Unknown(f"address element {elem!r}")
        return _address(elem) == value
    if isinstance(elem, int) and isinstance(value, str) and elem in _PROTO_NUMBERS:
        return _PROTO_NUMBERS[elem] == value  # an inet_proto given by number
    if isinstance(elem, str) and elem.endswith("*") and isinstance(value, str):
        return value.startswith(elem[:-1])  # nft's ifname wildcard "g*"
    if isinstance(elem, str | int):
        return bool(elem == value)
    raise Unknown(f"set element {elem}")


class Nft:
    """A compiled ruleset (both families) seen from one guest link.

    ``cmds`` and ``sites`` are what ``base_ruleset`` and ``guest_add`` return, together;
    ``sets`` adds elements to named sets (``pin_g5``, ``pinp_g5``, ``inspect4``) in nft JSON
    form: an address, ``{"prefix": ...}``, ``{"range": [lo, hi]}``, ``{"concat": [...]}``
    (whose parts may be ranges or prefixes), or pin_elements' ``{"elem": {"val": ...}}``.
    """

    def __init__(
        self,
        cmds: Iterable[Json],
        sites: Mapping[str, Site],
        link: GuestLink,
        sets: Sets | None = None,
        local: Iterable[IPv4Address] = (),
    ) -> None:
        cmds = list(cmds)
        self.inet = Ruleset(cmds, "inet", sets or {})
        self.netdev = Ruleset(cmds, "netdev")
        self.link = link
        self.local: set[Any] = {link.gateway, link.gateway6, *local}
        # Verdict chains and marks by name (their counter without "c_").
        self.sites = {s.counter.removeprefix("c_"): s for s in sites.values()}

    def ingress(self, pkt: Packet) -> Verdict:
        """The netdev ingress chain of the guest link the frame arrives on."""
        pkt = pkt.on(self.link)
        return self.netdev.run_base(f"ing_{pkt.iifname}", pkt, self.local)

    def trace(self, pkt: Packet) -> tuple[bool, Verdict]:
        """Does the packet reach its destination (for ``proxy``: the proxy's listener)? And
        which verdict said so."""
        pkt = pkt.on(self.link)
        at_l2 = self.ingress(pkt)
        if at_l2.kind != "accept":
            return False, at_l2
        return self.inet.judge(pkt, self.local, self.link.gateway, self.link.gateway6)

    def site(self, verdict: Verdict) -> Site | None:
        return self.sites.get(verdict.site or "")

    def evaluate(self, pkt: Packet) -> tuple[str, str | None]:
        """(``accept`` | ``deny`` | ``proxy``, the reason key the ruleset logs)."""
        reached, verdict = self.trace(pkt)
        if verdict.kind == "proxy":
            return "proxy", None
        site = self.site(verdict)
        reason = site.reason if site is not None else None
        if not reached:
            return "deny", reason
        if site is None and pkt.daddr in self.local:
            # The gateway's own resolver and proxy are plain accepts in the input chain.
            if pkt.dport == 53:
                reason = "allow.gateway_dns"
            elif pkt.proto == "tcp" and pkt.dport in PROXY_PORTS:
                reason = "allow.gateway_proxy"
        return "accept", reason


def evaluate(
    ruleset_cmds: Iterable[Json],
    sets: Sets,
    packet: Packet,
    *,
    sites: Mapping[str, Site],
    link: GuestLink,
) -> tuple[str, str | None]:
    """One packet through a compiled ruleset with these set elements: see ``Nft.evaluate``.
    (For many packets, build one ``Nft`` and call its ``evaluate``.)"""
    return Nft(ruleset_cmds, sites, link, sets).evaluate(packet)
