"""Verdicts on DNS questions and answers beyond the name itself: which names must never leave
the gateway, which question types are answered, where an alias may lead.

The resolver asks these functions and only turns their ``Decision`` into wire bytes; none of
this is judged in ``gateway/``. The name's own verdict is ``decide_name()``'s, always first.

Order of judgement for a question (first match wins):
 1. ``decide_name()`` denies the name: that decision;
 2. a name the gateway fronts: that decision (the gateway answers it itself, nothing leaves);
 3. a special-use name (``SPECIAL_NAMES``), unless an allow rule names it or a name below it;
 4. a reverse name (in-addr.arpa, ip6.arpa) for private or special-purpose space
    (``classify()``), or any ip6.arpa name where the gateway's uplink has no IPv6;
 5. the question type: zone transfers (AXFR, IXFR) and other meta types are refused, ANY gets
    RFC 8482's minimal answer, AAAA an empty one where the uplink has no IPv6;
 6. otherwise ``decide_name()``'s allow: the question goes upstream.

An upstream answer's aliases (CNAME records) are judged by ``judge_aliases``: a target that is a
special-use name or that a deny rule refuses, or a chain that loops, refuses the whole answer.

Pure: no sockets, no DNS library; question types are their IANA numbers.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from sandgate.policy.classify import classify
from sandgate.policy.decide import Decision, Reason, decide_name, deny
from sandgate.policy.profile import Profile

__all__ = [
    "QTYPE_A",
    "QTYPE_AAAA",
    "QTYPE_ANY",
    "QTYPE_AXFR",
    "QTYPE_IXFR",
    "QTYPE_PTR",
    "SPECIAL_NAMES",
    "SpecialName",
    "judge_aliases",
    "judge_question",
    "judge_reverse",
    "reverse_address",
    "reverse_address6",
    "special_name",
]

QTYPE_A, QTYPE_PTR, QTYPE_AAAA, QTYPE_OPT = 1, 12, 28, 41
QTYPE_IXFR, QTYPE_AXFR, QTYPE_ANY = 251, 252, 255


@dataclass(frozen=True)
class SpecialName:
    """One row of the table: a zone (lower-case, no trailing dot) and everything below it."""

    zone: str
    source: str
    note: str


# Names a guest's question for must not be sent to the internet's DNS: what they name lives on
# a host, a LAN, a cloud platform or an overlay network, and an upstream answer for them is at
# best a leak of the question and at worst an address the guest should not learn. From the IANA
# Special-Use Domain Names registry, plus ".internal" (ICANN's private-use TLD) and the cloud
# metadata names. Deliberately absent: "example" and example.com/net/org (RFC 6761 6.5: answered
# normally; the test world serves them) and "test" (RFC 6761 6.2 leaves it to the operator: the
# project's own tests use it for hosts of their own).
_ROWS: tuple[tuple[str, str, str], ...] = (
    ("localhost", "RFC 6761 6.3", "the guest's own host; never a question for the internet"),
    ("invalid", "RFC 6761 6.4", "guaranteed not to exist"),
    ("local", "RFC 6762", "multicast DNS on the LAN; never sent to unicast DNS"),
    ("onion", "RFC 7686", "Tor onion services; a question leaks the address"),
    ("home.arpa", "RFC 8375", "home networks: names of the LAN"),
    ("alt", "RFC 9476", "names of non-DNS systems"),
    (
        "resolver.arpa",
        "RFC 9462",
        "discovery of an encrypted resolver that would bypass the gateway",
    ),
    ("service.arpa", "RFC 9665", "DNS-SD service registration on the LAN"),
    ("ipv4only.arpa", "RFC 8880", "NAT64 discovery; answers are special-purpose addresses"),
    ("internal", "ICANN 2024 (private-use TLD)", "private names of networks and clouds"),
    ("metadata.google.internal", "Google Cloud docs", "GCE metadata server (credentials)"),
    ("metadata.goog", "Google Cloud docs", "GCE metadata server (credentials)"),
    ("instance-data.ec2.internal", "AWS docs", "EC2 instance metadata (credentials)"),
)
SPECIAL_NAMES: tuple[SpecialName, ...] = tuple(SpecialName(*row) for row in _ROWS)
_BY_ZONE = {row.zone: row for row in SPECIAL_NAMES}


# A zone holds a name only if both end in the same label: most names end in none of these.
_LAST_LABELS = frozenset(row.zone.rsplit(".", 1)[-1] for row in SPECIAL_NAMES)


def special_name(name: str) -> SpecialName | None:
    """The most specific row whose zone is ``name`` or contains it (``name`` normalised)."""
    if name[name.rfind(".") + 1 :] not in _LAST_LABELS:
        return None
    labels = name.split(".")
    for i in range(len(labels)):  # longest suffix first
        row = _BY_ZONE.get(".".join(labels[i:]))
        if row is not None:
            return row
    return None


def _exempt(decision: Decision, row: SpecialName) -> bool:
    """An allow rule lifts a special-use zone only if its pattern lies inside that zone
    (``printer.home.arpa`` for a homelab), never through open mode or a wider pattern."""
    if decision.reason is not Reason.RULE_ALLOW or decision.rule is None:
        return False
    pattern = decision.rule.spec.pattern
    if pattern is None:
        return False
    return pattern.base == row.zone or pattern.base.endswith("." + row.zone)


def _special(decision: Decision, name: str, why: str) -> Decision | None:
    row = special_name(name)
    if row is None or _exempt(decision, row):
        return None
    return deny(Reason.SPECIAL_NAME, f"{why}{name} is in {row.zone}. ({row.source}: {row.note})")


# -- reverse names -----------------------------------------------------------------------------

_IN_ADDR = ".in-addr.arpa"
_IP6 = ".ip6.arpa"


def reverse_address(name: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address (or, for a shorter name, the start of the block) an in-addr.arpa name
    stands for: ``10.0.77.10.in-addr.arpa`` is 10.77.0.10, ``168.192.in-addr.arpa`` 192.168.0.0.
    None when the labels are not one to four decimal octets."""
    if not name.endswith(_IN_ADDR):
        return None
    parts = name[: -len(_IN_ADDR)].split(".")
    if len(parts) > 4 or not all(p.isdigit() and p.isascii() and len(p) <= 3 for p in parts):
        return None
    octets = [int(p) for p in reversed(parts)] + [0] * (4 - len(parts))
    if any(o > 255 for o in octets):
        return None
    return ipaddress.IPv4Address(bytes(octets))


def reverse_address6(name: str) -> ipaddress.IPv6Address | None:
    """The IPv6 address (or, for fewer than 32 nibbles, the start of the block) an ip6.arpa
    name stands for (RFC 3596 section 2.5). None when the labels are not hex nibbles."""
    if name == _IP6[1:]:
        return ipaddress.IPv6Address(0)
    parts = name[: -len(_IP6)].split(".")
    if len(parts) > 32 or not all(len(p) == 1 and p in "0123456789abcdef" for p in parts):
        return None
    nibbles = "".join(reversed(parts)).ljust(32, "0")
    return ipaddress.IPv6Address(int(nibbles, 16))


def judge_reverse(profile: Profile, name: str) -> Decision | None:
    """A refusal for a reverse name that would map private or special-purpose space through the
    upstream's PTR records; None for a name that is not one (or points at public space)."""
    address: ipaddress.IPv4Address | ipaddress.IPv6Address | None
    if name.endswith(_IP6) or name == _IP6[1:]:
        if not profile.uplink_ipv6:
            return deny(Reason.IPV6, f"{name}: the gateway's uplink has no IPv6")
        address = reverse_address6(name)
        if address is None:
            return deny(Reason.SPECIAL, f"{name} is not the reverse name of an IPv6 address")
    elif not name.endswith(_IN_ADDR):
        return None
    else:
        address = reverse_address(name)
        if address is None:
            return deny(Reason.SPECIAL, f"{name} is not the reverse name of an IPv4 address")
    cls = classify(address)
    public = any(address.version == n.version and address in n for n in profile.public_override)
    if cls.special and not public:
        return deny(Reason.SPECIAL, f"{name} is the reverse name of {address}", classification=cls)
    return None


# -- question types ----------------------------------------------------------------------------

# (number, mnemonic, reason, source). RFC 6895 3.1: 128-255 are question and meta types; OPT is
# a pseudo-record, never a question.
_QTYPE_ROWS: tuple[tuple[int, str, Reason, str], ...] = (
    (QTYPE_AXFR, "AXFR", Reason.ZONE_TRANSFER, "RFC 5936"),
    (QTYPE_IXFR, "IXFR", Reason.ZONE_TRANSFER, "RFC 1995"),
    (QTYPE_ANY, "ANY", Reason.DNS_ANY, "RFC 8482"),
    (QTYPE_OPT, "OPT", Reason.DNS_META, "RFC 6891"),
)
_QTYPES = {number: (mnemonic, reason) for number, mnemonic, reason, _ in _QTYPE_ROWS}


def _judge_qtype(profile: Profile, name: str, qtype: int) -> Decision | None:
    known = _QTYPES.get(qtype)
    if known is not None:
        mnemonic, reason = known
        return deny(reason, f"{mnemonic} {name}")
    if 128 <= qtype <= 255:  # TKEY, TSIG, MAILB, MAILA and unassigned meta types
        return deny(Reason.DNS_META, f"type {qtype} {name}")
    if qtype == QTYPE_AAAA and not profile.uplink_ipv6:
        return deny(Reason.IPV6, f"AAAA {name}: the gateway's uplink has no IPv6")
    return None


def judge_question(profile: Profile, name: str, qtype: int) -> Decision:
    """May a question of type ``qtype`` for ``name`` (normalised) be forwarded upstream?

    An allow is the name's own decision from ``decide_name()``; a deny says why not, and its
    reason says what the resolver answers instead (see the module docstring)."""
    decision = decide_name(profile, name)
    if not decision.allowed or decision.reason is Reason.FRONT:
        return decision
    return (
        _special(decision, name, "")
        or judge_reverse(profile, name)
        or _judge_qtype(profile, name, qtype)
        or decision
    )


# -- aliases -----------------------------------------------------------------------------------


def judge_aliases(
    profile: Profile, name: str, aliases: Sequence[tuple[str, str]], decision: Decision
) -> Decision:
    """Judge the CNAME records (owner, target; normalised) of an upstream answer for ``name``.

    ``decision`` is the question's own verdict, returned when every alias may stand. A target
    that is a special-use name, or that a deny rule refuses, refuses the whole answer (an alias
    is a way to make a public name stand for ``localhost``); so does a chain that leads back to
    a name already in it. Targets merely not on an allowlist are fine: that is how CDNs work."""
    edges: dict[str, set[str]] = {}
    for owner, target in aliases:
        why = f"{owner} is an alias of {target}: "
        verdict = decide_name(profile, target)
        if not verdict.allowed and verdict.reason is Reason.RULE_DENY:
            return deny(Reason.CNAME_TARGET, why + verdict.detail, verdict.rule)
        refused = _special(verdict, target, why)  # an allow rule for the target may lift it
        if refused is not None:
            return deny(Reason.CNAME_TARGET, refused.detail)
        edges.setdefault(owner, set()).add(target)
    loop = _cycle(edges)
    if loop is not None:
        return deny(Reason.CNAME_LOOP, " → ".join(loop))
    return decision


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """A chain of aliases that comes back to where it started (reachable from the question's
    name or not: an answer that holds one is bogus), else None. Iterative: an upstream can send
    thousands of records."""
    finished: set[str] = set()
    for start in sorted(edges):
        if start in finished:
            continue
        path = [start]
        todo = [iter(sorted(edges[start]))]
        while todo:
            nxt = next(todo[-1], None)
            if nxt is None:
                finished.add(path.pop())
                todo.pop()
            elif nxt in path:
                return [*path[path.index(nxt) :], nxt]
            elif nxt not in finished:
                path.append(nxt)
                todo.append(iter(sorted(edges.get(nxt, ()))))
    return None
