"""``decide()``: the one place that says whether an attempt is allowed, by which rule, and why.

The nftables compiler, the resolver, the proxy, ``explain`` and ``prove`` all ask this
function; none keeps its own idea of what is allowed. Decisions are built only through
``allow()`` and ``deny()``, and every path that does not explicitly allow, denies.

Order of judgement (first match wins; the rules a step could match come from the profile's
index, policy/index.py, in profile order, so 100,000 rules are not scanned):
 1. DNS (port 53) goes to the guest's own gateway resolver, never elsewhere (the gateway
    redirects it before any rule is consulted; names are then judged by the resolver), and
    the guest's own gateway proxy is reached (its requests are judged there);
 2. an explicit ``deny`` rule (deny wins over every allow); then a ``host_loopback`` rule's port
    on the guest's own gateway address (the gateway relays it to that port of the host's
    127.0.0.1, gateway/hostlo.py, and nothing else of the host);
 3. the guest pool and the host: the own gateway's other ports, other guests and the host the
    gateway runs on are closed (no rule opens them);
 4. private and special-purpose addresses, unless an allow rule names that block or a part of it
    (IPv6 only where the uplink has IPv6; never IPv6 link-local or multicast, which no router
    forwards); IPv6 forms that carry an IPv4 (NAT64, 6to4, Teredo, compatible) are judged by
    that IPv4 and are never exempted;
 5. IPv6 that is not IPv4-mapped: refused where the gateway's uplink has no IPv6
    (``deny.ipv6``); a transition form of a public IPv4 is refused as such
    (``deny.ipv6_embedding``: reach the IPv4 itself); other public IPv6 goes on like IPv4;
 6. an allow rule for the address;
 7. QUIC and DNS-over-TLS (they would bypass the proxy and the resolver);
 8. the name (from DNS, SNI, Host or CONNECT): deny and allow rules by domain pattern. A DNS
    question (a name without address or port) may resolve through any allow rule for the name,
    whatever ports it names, and is refused only by a deny rule for every port and protocol;
 9. the profile's mode: open allows, locked denies, allowlist allows only addresses its
    allowed names resolved to;
10. a request (an attempt with a method and path, judged by the proxy) that steps 1-9 allow
    to a destination that an allow rule with request rules (``http``) matches: allowed only if
    one of the allow rules for that destination allows it (a rule without ``http`` allows every
    request; the mode never does), else ``deny.request`` naming the rule. The same for a flow
    whose process the proxy asked about (``by_process``) and a rule with ``process``: only
    those executables, an unidentified process never, else ``deny.process``.
"""

from __future__ import annotations

import enum
import ipaddress
from dataclasses import dataclass

from sandgate.policy.classify import AddressClass, Classification, classify
from sandgate.policy.groups import RuleGroup
from sandgate.policy.model import IPAddress, Mode, Protocol
from sandgate.policy.profile import Profile, Rule


class Verdict(enum.StrEnum):
    ALLOW = "allow"
    DENY = "deny"


class Reason(enum.Enum):
    """Why: a stable key for logs and metrics, and a label for people."""

    RULE_ALLOW = ("allow.rule", "an allow rule matches")
    OPEN = ("allow.open", "public address and the internet is open")
    EXEMPT = ("allow.exempt", "special-purpose address exempted by an allow rule")
    PINNED = ("allow.pinned", "address an allowed name resolved to")
    GATEWAY_DNS = ("allow.gateway_dns", "the guest's own gateway resolver")
    ANSWER = ("allow.answer", "the name may resolve to this address")
    RULE_DENY = ("deny.rule", "a deny rule matches")
    SPECIAL = ("deny.special", "private or special-purpose address")
    DNS_REDIRECT = ("deny.dns_redirect", "DNS goes to the gateway resolver only")
    GATEWAY_PORT = ("deny.gateway", "the gateway answers DNS only")
    LATERAL = ("deny.lateral", "another guest of the gateway")
    HOST = ("deny.host", "the host the gateway runs on")
    IPV6 = ("deny.ipv6", "the gateway's uplink has no IPv6")
    IPV6_EMBEDDING = (
        "deny.ipv6_embedding",
        "an IPv6 transition form (NAT64, 6to4, Teredo) of an IPv4 address",
    )
    QUIC = ("deny.quic", "QUIC (udp/443) is refused so HTTPS goes through the proxy")
    DNS_BYPASS = ("deny.dns_bypass", "DNS over TLS/QUIC would bypass the gateway resolver")
    LOCKED = ("deny.locked", "the internet is locked")
    NOT_ALLOWLISTED = ("deny.not_allowlisted", "not on the allowlist")
    REBINDING = ("deny.rebinding", "a public name that resolves to a special-purpose address")
    UNRESOLVABLE = ("deny.unresolvable", "the name does not resolve")
    UNPARSEABLE = ("deny.unparseable", "the target could not be understood")
    FRONTING = ("deny.fronting", "the names in one connection disagree (domain fronting)")
    EXFILTRATION = ("deny.exfiltration", "a placeholder credential sent to another host")
    PROTOCOL = ("deny.protocol", "the request breaks its protocol")
    INVALID = ("deny.invalid", "a packet that belongs to no connection")
    INBOUND = ("deny.inbound", "unsolicited traffic from the uplink")
    UNKNOWN_LINK = ("deny.unknown_link", "a link the gateway was not given")
    SPOOF_MAC = ("deny.spoof_mac", "a source MAC that is not the guest's")
    SPOOF_IP = ("deny.spoof_ip", "a source address that is not the guest's")
    SPOOF_ARP = ("deny.spoof_arp", "ARP that claims an address not the guest's")
    ETHERTYPE = ("deny.ethertype", "a frame type the gateway does not route")
    FRONT = ("allow.front", "a service the gateway itself offers over TLS (front)")
    GATEWAY_PROXY = ("allow.gateway_proxy", "the guest's own gateway proxy")
    SPECIAL_NAME = ("deny.special_name", "a special-use name that must not leave the gateway")
    DNS_ANY = ("deny.dns_any", "ANY questions get a minimal answer (RFC 8482), never a dump")
    ZONE_TRANSFER = ("deny.zone_transfer", "zone transfers (AXFR/IXFR) are refused")
    DNS_META = ("deny.dns_meta", "a DNS meta type (TSIG, TKEY, MAILA, OPT...) is not a question")
    CNAME_TARGET = ("deny.cname_target", "an alias to a special-use or denied name")
    CNAME_LOOP = ("deny.cname_loop", "an alias chain that loops")
    HOST_LOOPBACK = ("allow.host_loopback", "a port of the host's own loopback (host_loopback)")
    EXPOSE = ("allow.expose", "an exposed port, from a client its expose rule names")
    REQUEST = ("deny.request", "the rule for this destination does not allow this request")
    PROCESS = ("deny.process", "the rule for this destination is for other programs")
    APPROVED = ("allow.approved", "approved with sandgate approve")
    NOT_APPROVED = ("deny.not_approved", "refused with sandgate approve --deny")
    APPROVAL_TIMEOUT = ("deny.approval_timeout", "no answer from sandgate approve in time")
    ASKED = ("deny.asked", "waiting for sandgate approve (refused unless approved)")
    CUT = ("deny.cut", "the gateway is cut off: its rules drifted, the watchdog stopped all")

    def __init__(self, key: str, label: str) -> None:
        self.key = key
        self.label = label


@dataclass(frozen=True)
class Attempt:
    """One thing a guest tries. ``address`` or ``name`` or both; ``port`` None for DNS/ICMP."""

    protocol: Protocol
    address: IPAddress | None = None
    port: int | None = None
    name: str | None = None  # normalised (lower-case ASCII, no trailing dot)
    # An HTTP request the proxy read on this connection (None: the connection itself).
    method: str | None = None
    path: str | None = None  # as sent; the query is ignored and never shown
    # The program behind the flow, where the enforcer can tell (the proxy): ``by_process`` says
    # it asked; ``exe`` None then means the process could not be identified (no rule matches).
    by_process: bool = False
    exe: str | None = None
    parents: tuple[str, ...] = ()  # the executables above it in the sandbox, nearest first


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    reason: Reason
    rule: Rule | None = None
    detail: str = ""
    classification: Classification | None = None

    @property
    def allowed(self) -> bool:
        return self.verdict is Verdict.ALLOW

    @property
    def key(self) -> str:
        """Stable reason key; special addresses carry their class: ``deny.private``."""
        if self.reason is Reason.SPECIAL and self.classification is not None:
            return f"deny.{self.classification.cls.value}"
        return self.reason.key

    @property
    def rule_ref(self) -> str | None:
        return str(self.rule) if self.rule is not None else None

    def explain(self) -> str:
        return f"{self.reason.label}: {self.detail}" if self.detail else self.reason.label


def at_address(
    decision: Decision, address: IPAddress | None, group: RuleGroup | None = None
) -> Decision:
    """A decision made for a whole range (the kernel's special-purpose site), told which
    address it met: ``deny.special`` becomes the address's class, ``deny.private``; a grouped
    rule site (policy/groups.py) names the group's rule for the address, as decide() does."""
    if group is not None and address is not None and decision.rule is None:
        rule = group.rule_at(address)
        if rule is not None:
            make = allow if decision.allowed else deny
            return make(decision.reason, rule=rule, detail=f"{rule.ref} ({rule.label})")
    if decision.reason is not Reason.SPECIAL or address is None or decision.classification:
        return decision
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    cls = classify(address)
    if not cls.special and cls.via is not None and cls.embedded is not None:
        # The kernel drops the transition prefixes whole; a public IPv4 inside is refused as
        # such, as decide() does (step 5).
        return deny(
            Reason.IPV6_EMBEDDING,
            f"{address} is the {cls.via.label} form of {cls.embedded}: reach it over IPv4",
            classification=cls,
        )
    return deny(Reason.SPECIAL, f"{address} is {_describe(cls)}", classification=cls)


def allow(reason: Reason, rule: Rule | None = None, detail: str = "", **kw: object) -> Decision:
    return Decision(Verdict.ALLOW, reason, rule, detail, **kw)  # type: ignore[arg-type]


def deny(reason: Reason, detail: str = "", rule: Rule | None = None, **kw: object) -> Decision:
    return Decision(Verdict.DENY, reason, rule, detail, **kw)  # type: ignore[arg-type]


_DNS_PROTOCOLS = (Protocol.UDP, Protocol.TCP)
# The gateway's proxy on the guest's own gateway address: explicit (HTTP_PROXY), and the two
# ports the gateway redirects plain HTTP and some TLS to.
GATEWAY_PROXY_PORTS = (3128, 15080, 15443)


def decide(profile: Profile, attempt: Attempt) -> Decision:
    """The verdict on one attempt under one profile. Pure: no I/O, no clock, no state."""
    d = _destination(profile, attempt)
    if not d.allowed or d.reason in _BEFORE_RULES:
        return d
    if attempt.method is None and not attempt.by_process:
        return d
    return _request(profile, attempt, d)


# Allowed before any rule is consulted: the gateway's own services (step 1) and fronts.
_BEFORE_RULES = (Reason.GATEWAY_DNS, Reason.GATEWAY_PROXY, Reason.FRONT)


def _request(profile: Profile, attempt: Attempt, d: Decision) -> Decision:
    """Step 10: a request (or a flow whose process is known) to an allowed destination,
    against that destination's rules: their ``http`` and ``process`` lists."""
    matching = _matching_allow(profile, attempt)
    restricting = [r for r in matching if _restricts(r, attempt)]
    if len(restricting) < len(matching) or not restricting:
        if d.rule is None or not _restricts(d.rule, attempt):
            return d
        # The first rule restricts, but another one for the destination does not.
        return _allowed_by(d, next(r for r in matching if not _restricts(r, attempt)), "")
    method, path = attempt.method or "", attempt.path or "/"
    for rule in restricting:
        entry = next((q for q in rule.spec.requests if q.matches(method, path)), None)
        if attempt.method is not None and rule.spec.requests and entry is None:
            continue
        if attempt.by_process and rule.spec.process and not _process_matches(rule, attempt):
            continue
        return _allowed_by(d, rule, f": {entry}" if entry is not None else "")
    by_request = [r for r in restricting if r.spec.requests and attempt.method is not None]
    shown = path.split("?", 1)[0][:200]
    if by_request and not any(q.matches(method, path) for r in by_request for q in r.spec.requests):
        only = "; ".join(
            f"{r.ref} ({r.label}) allows only {', '.join(map(str, r.spec.requests))}"
            for r in by_request
        )
        rule = by_request[0]
        detail = f"{method} {shown}: {only}"
        return deny(Reason.REQUEST, detail, rule, classification=d.classification)
    by_process = [r for r in restricting if r.spec.process]
    who = attempt.exe or "a process that could not be identified"
    if attempt.exe is not None and attempt.parents:
        who += f" under {' < '.join(attempt.parents[:3])}"
    only = "; ".join(f"{r.ref} ({r.label}) is for {_programs(r)}" for r in by_process)
    rule = by_process[0]
    return deny(Reason.PROCESS, f"{who}: {only}", rule, classification=d.classification)


def _process_matches(rule: Rule, attempt: Attempt) -> bool:
    """The flow's executable is one of the rule's, and its nearest parents are the rule's
    ``under`` chain (when it has one). An unidentified process matches nothing."""
    if attempt.exe is None or attempt.exe not in (rule.spec.process or ()):
        return False
    under = tuple(rule.spec.under or ())
    return attempt.parents[: len(under)] == under


def _programs(rule: Rule) -> str:
    text = ", ".join(rule.spec.process or ())
    return text + (f" under {' < '.join(rule.spec.under)}" if rule.spec.under else "")


def _restricts(rule: Rule, attempt: Attempt) -> bool:
    """Does the rule narrow this attempt: by its requests (a request), or by its programs (a
    flow whose process the enforcer asked about)?"""
    return bool(
        (rule.spec.requests and attempt.method is not None)
        or (rule.spec.process and attempt.by_process)
    )


def request_rules(
    profile: Profile, attempt: Attempt, matching: list[Rule] | None = None
) -> tuple[Rule, ...]:
    """The allow rules that judge requests to the attempt's destination; empty when none does
    or when another allow rule for it allows every request. A connection carried raw (a CONNECT
    tunnel, TLS passed through) to such a destination would hide its requests."""
    if matching is None:
        matching = _matching_allow(profile, attempt)
    if any(not r.spec.requests for r in matching):
        return ()
    return tuple(matching)


def _matching_allow(profile: Profile, attempt: Attempt) -> list[Rule]:
    address = attempt.address
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    candidates = profile.index.allow.candidates(address, attempt.name)
    return [r for r in candidates if _destination_matches(r, attempt, address)]


def _allowed_by(d: Decision, rule: Rule, what: str) -> Decision:
    detail = f"{rule.ref} ({rule.label}){what}"
    return allow(d.reason, rule, detail, classification=d.classification)


def _destination_matches(rule: Rule, attempt: Attempt, address: IPAddress | None) -> bool:
    port, proto = attempt.port, attempt.protocol
    if address is not None and rule.matches_address(address, port, proto):
        return True
    return attempt.name is not None and rule.matches_name(attempt.name, port, proto)


def _destination(profile: Profile, attempt: Attempt) -> Decision:
    """Steps 1-9: the verdict on the destination."""
    address = attempt.address
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        # An IPv4-mapped address on an IPv6 socket sends plain IPv4 packets to that address.
        address = address.ipv4_mapped
    if address is None and attempt.name is None:
        return deny(Reason.UNPARSEABLE, "neither an address nor a name")

    if address is not None and attempt.port == 53 and attempt.protocol in _DNS_PROTOCOLS:
        if address == profile.gateway_address:
            return allow(Reason.GATEWAY_DNS, detail=str(address))
        return deny(Reason.DNS_REDIRECT, f"{address}:53 is answered by the gateway resolver")
    if (
        address is not None
        and address == profile.gateway_address
        and attempt.protocol is Protocol.TCP
        and attempt.port in GATEWAY_PROXY_PORTS
    ):
        # The guest's own proxy, like its resolver, is reached before any rule: a deny rule
        # for 10.0.0.0/8 must not cut the guest off the one door its requests are judged at.
        return allow(Reason.GATEWAY_PROXY, detail=f"{address}:{attempt.port}")

    for rule in profile.index.deny.candidates(address, attempt.name):
        if _rule_matches(rule, attempt, address):
            return deny(Reason.RULE_DENY, f"{rule.ref} ({rule.label})", rule)

    if (
        address is not None
        and address == profile.gateway_address
        and attempt.protocol is Protocol.TCP
    ):
        for rule in profile.host_loopback():
            if attempt.port == rule.spec.host_loopback:
                return allow(
                    Reason.HOST_LOOPBACK,
                    rule,
                    f"{rule.ref} ({rule.label}): 127.0.0.1:{attempt.port} of the host",
                )

    front = profile.front(attempt.name)
    if front is not None and (
        address is None
        or (
            address == profile.gateway_address
            and attempt.protocol is Protocol.TCP
            and attempt.port in (443, None)
        )
    ):
        # The gateway answers this name itself and serves it over TLS (TCP) on its own address.
        return allow(Reason.FRONT, detail=f"{front.name} → http://{front.address}:{front.port}")

    if address is not None:
        early = _judge_address(profile, attempt, address)
        if early is not None:
            return early

    if attempt.name is not None:
        for rule in profile.index.allow.candidates(None, attempt.name):
            if _name_matches(rule, attempt, attempt.name, address):
                return _allow_name(profile, attempt, address, rule)
    return _by_mode(profile, attempt, address)


def decide_inbound(
    profile: Profile, source: IPAddress, protocol: Protocol, port: int | None
) -> Decision:
    """May a client on the uplink side (the LAN) at ``source`` reach ``port`` of this profile's
    guest? Only through an ``expose`` rule naming that port and a network holding ``source``;
    everything else that arrives unasked on the uplink is refused (``deny.inbound``)."""
    if isinstance(source, ipaddress.IPv6Address) and source.ipv4_mapped is not None:
        source = source.ipv4_mapped
    if protocol is Protocol.TCP:
        for rule in profile.expose:
            if rule.port != port:
                continue
            if rule.admits(source):
                return allow(Reason.EXPOSE, detail=f"{rule}: {source}")
            return deny(Reason.INBOUND, f"{source} is not a client {rule} names")
    return deny(Reason.INBOUND, f"{source} {protocol.value}/{port}: nothing is exposed there")


def decide_name(profile: Profile, name: str) -> Decision:
    """May the resolver answer (and forward) a question for ``name``?"""
    return decide(profile, Attempt(Protocol.UDP, None, None, name))


_REFUSED_ANSWERS = (Reason.SPECIAL, Reason.REBINDING, Reason.LATERAL, Reason.GATEWAY_PORT)


def decide_answer(profile: Profile, name: str, address: IPAddress) -> Decision:
    """May an upstream answer tell the guest that ``name`` is at ``address``?

    Judged as a lookup, not a connection: no port is known yet, so only what holds on every
    port refuses the answer: a deny rule for the whole name or address, or an address no
    attempt of any protocol may reach because it is special-purpose (rebinding), another
    guest or the gateway. A port-scoped deny rule (``gist.github.com`` port 22) lets the name
    resolve; its port is refused at L3 through the name's pin set (policy/pins.py).
    """
    refused = answer_refusal(profile, name, address)
    if refused is not None:
        return refused
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return allow(Reason.ANSWER, detail=f"{name} → {address}")


# What the address alone says of an answer is the same for every name (a name only changes
# the wording of a refusal), so the addresses found fine are remembered per profile: an
# upstream's answers repeat their addresses (a CDN's, a registry's) far more than their names.
_ANSWER_MEMO = "answer_addresses"
_ANSWER_MEMO_MAX = 65_536


def answer_refusal(profile: Profile, name: str, address: IPAddress) -> Decision | None:
    """``decide_answer``'s verdict where it refuses, None where it allows: the resolver's hot
    path, which makes no Decision for an address it passes (tests/unit/test_answer_memo.py
    checks it against the verdict made afresh)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    for rule in profile.index.deny.candidates(address, name):
        if rule.whole and (
            rule.matches_address(address, None, Protocol.TCP) or rule.matches_lookup(name)
        ):
            return deny(Reason.RULE_DENY, f"{rule.ref} ({rule.label})", rule)
    memo: dict[object, bool] | None = profile.index.memo.get(_ANSWER_MEMO)
    if memo is None:
        memo = profile.index.memo.setdefault(_ANSWER_MEMO, {})
    key = int(address) if address.version == 4 else address  # an int never equals a v6 address
    if key in memo:
        return None
    refused = _address_refusal(profile, name, address)
    if refused is None:
        if len(memo) >= _ANSWER_MEMO_MAX:
            memo.clear()
        memo[key] = True
    return refused


def _address_refusal(profile: Profile, name: str, address: IPAddress) -> Decision | None:
    """An answer's address refused whatever the port: one no attempt of any protocol may reach
    (special-purpose, another guest, the gateway); None otherwise."""
    refusals = []
    for proto in Protocol:
        d = _judge_address(profile, Attempt(proto, address, None, name), address)
        if d is None or d.allowed or d.reason not in _REFUSED_ANSWERS:
            return None
        refusals.append(d)
    first = refusals[0]
    return deny(Reason.REBINDING, first.detail, classification=first.classification)


def _rule_matches(rule: Rule, attempt: Attempt, address: IPAddress | None) -> bool:
    if address is not None and rule.matches_address(address, attempt.port, attempt.protocol):
        return True
    return attempt.name is not None and _name_matches(rule, attempt, attempt.name, address)


def _name_matches(rule: Rule, attempt: Attempt, name: str, address: IPAddress | None) -> bool:
    if address is None and attempt.port is None:
        return rule.matches_lookup(name)  # a DNS question: its protocol is the resolver's
    return rule.matches_name(name, attempt.port, attempt.protocol)


def _judge_address(profile: Profile, attempt: Attempt, address: IPAddress) -> Decision | None:
    """Steps 3-7: what the address alone settles. None: the name and the mode decide."""
    port, proto = attempt.port, attempt.protocol
    if profile.gateway_address is not None and address == profile.gateway_address:
        return deny(Reason.GATEWAY_PORT, f"{address} port {port}")
    if address.version == profile.guest_pool.version and address in profile.guest_pool:
        return deny(Reason.LATERAL, f"{address} is in the guest pool {profile.guest_pool}")
    if address.version == 6 and address in profile.guest_pool6:
        return deny(Reason.LATERAL, f"{address} is in the guests' IPv6 pool {profile.guest_pool6}")
    if address in profile.host_addresses:
        return deny(Reason.HOST, f"{address} is an address of the host the gateway runs on")

    cls = classify(address)
    v6 = address.version == 6  # never IPv4-mapped here: the callers unwrapped those
    if cls.special and not _public_override(profile, address):
        for rule in profile.index.allow.candidates(address, None):
            if _exempts(rule, cls, address, port, proto):
                if v6 and not profile.uplink_ipv6:
                    return deny(
                        Reason.IPV6,
                        f"{address}: {rule.ref} names it, but {_NO_IPV6}",
                        classification=cls,
                    )
                return allow(
                    Reason.EXEMPT, rule, f"{address} ({cls.cls.label})", classification=cls
                )
        name = f" ({attempt.name} resolved here)" if attempt.name else ""
        reason = Reason.REBINDING if attempt.name else Reason.SPECIAL
        return deny(reason, f"{address} is {_describe(cls)}{name}", classification=cls)
    if v6 and not profile.uplink_ipv6:
        return deny(Reason.IPV6, f"{address}: {_NO_IPV6}", classification=cls)
    if cls.via is not None and cls.embedded is not None:
        # A public IPv4 in a NAT64/6to4/Teredo form: a translator or relay we do not control
        # would carry it, and the kernel drops these prefixes whole (net/compile.py).
        return deny(
            Reason.IPV6_EMBEDDING,
            f"{address} is the {cls.via.label} form of {cls.embedded}: reach it over IPv4",
            classification=cls,
        )

    for rule in profile.index.allow.candidates(address, None):
        if rule.matches_address(address, port, proto):
            return allow(Reason.RULE_ALLOW, rule, f"{rule.ref} ({rule.label})", classification=cls)
    if proto is Protocol.UDP and port == 443:
        return deny(Reason.QUIC, f"udp/443 to {address}", classification=cls)
    if port == 853:
        return deny(Reason.DNS_BYPASS, f"port 853 to {address}", classification=cls)
    return None


def _allow_name(
    profile: Profile, attempt: Attempt, address: IPAddress | None, rule: Rule
) -> Decision:
    detail = f"{rule.ref} ({rule.label})"
    if address is None or profile.mode is not Mode.LOCKED:
        return allow(Reason.RULE_ALLOW, rule, detail)
    # Locked: names may resolve, but only host and cidr rules open a path at L3.
    return deny(
        Reason.LOCKED,
        f"{attempt.name} is allowed to resolve by {detail}, but locked mode opens "
        "addresses only through host or cidr rules",
    )


def _by_mode(profile: Profile, attempt: Attempt, address: IPAddress | None) -> Decision:
    target = attempt.name or str(address)  # the address judged: ::ffff:a.b.c.d is a.b.c.d
    if profile.mode is Mode.OPEN:
        return allow(Reason.OPEN, detail=target)
    if profile.mode is Mode.LOCKED:
        return deny(Reason.LOCKED, target)
    return deny(Reason.NOT_ALLOWLISTED, target)


def _public_override(profile: Profile, address: IPAddress) -> bool:
    return any(address.version == n.version and address in n for n in profile.public_override)


_NO_IPV6 = "no IPv6 route out, and AAAA answers stay empty"
# IPv6 scopes no router forwards: link-local (fe80::/10, metadata there included) and
# multicast. Guest links carry no link-local chatter, so no rule can open them.
_V6_UNROUTED = (ipaddress.IPv6Network("fe80::/10"), ipaddress.IPv6Network("ff00::/8"))


def _exempts(
    rule: Rule, cls: Classification, address: IPAddress, port: int | None, proto: Protocol
) -> bool:
    """An allow rule lifts a special-purpose block only if it names that block or a part of it.

    ``0.0.0.0/0`` therefore never opens 10.0.0.0/8, and only a rule for exactly
    169.254.169.254 opens the metadata endpoint.
    """
    net = rule.spec.network
    if net is None or not rule.matches_address(address, port, proto):
        return False
    if address.version == 6 and any(address in n for n in _V6_UNROUTED):
        return False
    block = cls.block
    if block is None:
        return True
    return net.version == block.network.version and net.subnet_of(block.network)  # type: ignore[arg-type]


def _describe(cls: Classification) -> str:
    text = cls.cls.label
    if cls.block is not None:
        text += f" ({cls.block.network}, {cls.block.source})"
    if cls.via is not None and cls.embedded is not None:
        text += f", {cls.via.label} form of {cls.embedded}"
    return text


__all__ = [
    "AddressClass",
    "Attempt",
    "Decision",
    "Reason",
    "Verdict",
    "allow",
    "at_address",
    "decide",
    "decide_answer",
    "decide_inbound",
    "decide_name",
    "deny",
    "request_rules",
]
