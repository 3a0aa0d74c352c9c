"""What the resolver does with a question and an upstream answer. Pure: bytes in, bytes out.

The wire format is dnspython's business; this module only decides:

- a question for a name the policy refuses gets NXDOMAIN carrying an Extended DNS Error
  (RFC 8914, code 15 "Blocked") whose text is the reason key, so ``dig`` shows why;
- AAAA questions get an empty answer: the gateway routes IPv4 only, and an empty answer makes
  clients use IPv4 at once instead of timing out on IPv6;
- reverse lookups for private and special ranges are answered locally (NXDOMAIN), so a guest
  cannot map the LAN through upstream PTR records;
- an upstream answer whose addresses the policy refuses for that name (a public name pointing
  at a private address: DNS rebinding) is replaced by NXDOMAIN with the reason.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass

import dns.edns
import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.opcode
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset

from sandgate.policy.classify import classify

EDE_BLOCKED = 15
EDE_FILTERED = 17
A, AAAA, PTR, ANY = dns.rdatatype.A, dns.rdatatype.AAAA, dns.rdatatype.PTR, dns.rdatatype.ANY


@dataclass(frozen=True)
class Question:
    id: int
    name: str  # lower-case, no trailing dot ("" for the root)
    qtype: int
    message: dns.message.Message

    @property
    def type_text(self) -> str:
        return dns.rdatatype.to_text(self.qtype)  # type: ignore[arg-type]


class Malformed(ValueError):
    """The bytes are not a DNS query we can answer; ``reply`` is FORMERR if an id was readable."""

    def __init__(self, why: str, reply: bytes | None) -> None:
        super().__init__(why)
        self.reply = reply


def parse_question(wire: bytes) -> Question:
    try:
        msg = dns.message.from_wire(wire)
    except (dns.exception.DNSException, ValueError) as exc:
        raise Malformed(f"unparseable query: {exc}", _formerr(wire)) from exc
    if msg.flags & dns.flags.QR or msg.opcode() != dns.opcode.QUERY or len(msg.question) != 1:
        raise Malformed("not a single standard query", _formerr(wire))
    rrset = msg.question[0]
    name = rrset.name.to_text(omit_final_dot=True).lower()
    if rrset.rdclass != dns.rdataclass.IN:
        raise Malformed("only class IN is served", _formerr(wire))
    return Question(msg.id, "" if name == "@" else name, rrset.rdtype, msg)


def _formerr(wire: bytes) -> bytes | None:
    if len(wire) < 12:
        return None
    # Echo the id, set QR and RCODE=FORMERR, no sections.
    flags = 0x8000 | (wire[2] & 0x79) << 8 | dns.rcode.FORMERR
    return wire[:2] + flags.to_bytes(2, "big") + bytes(8)


def blocked(q: Question, reason_key: str, *, code: int = EDE_BLOCKED) -> bytes:
    """NXDOMAIN with an Extended DNS Error naming the reason."""
    resp = dns.message.make_response(q.message)
    resp.set_rcode(dns.rcode.NXDOMAIN)
    resp.flags |= dns.flags.RA
    if q.message.edns >= 0:
        resp.use_edns(
            0, options=[dns.edns.EDEOption(dns.edns.EDECode(code), f"sandgate: {reason_key}")]
        )
    return resp.to_wire()


def empty(q: Question) -> bytes:
    """NOERROR with no records (used for AAAA: IPv4 only)."""
    resp = dns.message.make_response(q.message)
    resp.flags |= dns.flags.RA
    return resp.to_wire()


def servfail(q: Question, text: str) -> bytes:
    resp = dns.message.make_response(q.message)
    resp.set_rcode(dns.rcode.SERVFAIL)
    resp.flags |= dns.flags.RA
    if q.message.edns >= 0:
        resp.use_edns(
            0, options=[dns.edns.EDEOption(dns.edns.EDECode.NETWORK_ERROR, f"sandgate: {text}")]
        )
    return resp.to_wire()


def private_reverse(name: str) -> bool:
    """True for a PTR name under in-addr.arpa that points into special-purpose space."""
    if not name.endswith(".in-addr.arpa"):
        return name.endswith(".ip6.arpa")  # no IPv6 is routed; nothing to look up
    parts = name[: -len(".in-addr.arpa")].split(".")
    if not all(p.isdigit() for p in parts) or not parts or len(parts) > 4:
        return True
    octets = [int(p) for p in reversed(parts)] + [0] * (4 - len(parts))
    if any(o > 255 for o in octets):
        return True
    return classify(ipaddress.IPv4Address(bytes(octets))).special


@dataclass(frozen=True)
class Answer:
    """An upstream answer, judged: what to send the guest, and what it revealed."""

    wire: bytes  # the reply for the guest, with the guest's query id
    addresses: tuple[str, ...]  # IPv4 addresses in the answer section
    ttl: int  # smallest TTL among those records (for pinning and caching)
    rcode: int
    refused: str | None = None  # reason key when the answer was replaced by NXDOMAIN
    refused_address: str | None = None


def judge_answer(
    q: Question,
    upstream: bytes,
    check: Callable[[ipaddress.IPv4Address], str | None],
) -> Answer:
    """Apply ``check`` (address -> reason key if refused) to every A record of the answer."""
    try:
        resp = dns.message.from_wire(upstream)
    except (dns.exception.DNSException, ValueError):
        return Answer(servfail(q, "bad upstream answer"), (), 0, dns.rcode.SERVFAIL)
    resp.id = q.id
    addresses: list[str] = []
    ttl = 2**31
    for rrset in resp.answer:
        if rrset.rdtype == A:
            ttl = min(ttl, rrset.ttl)
            for rdata in rrset:
                address = ipaddress.IPv4Address(rdata.address)
                refused = check(address)
                if refused is not None:
                    wire = blocked(q, refused, code=EDE_FILTERED)
                    return Answer(wire, (), 0, dns.rcode.NXDOMAIN, refused, str(address))
                addresses.append(str(address))
    if q.qtype == AAAA or any(r.rdtype == AAAA for r in resp.answer):
        resp.answer = [r for r in resp.answer if r.rdtype != AAAA]
    return Answer(resp.to_wire(), tuple(addresses), 0 if ttl == 2**31 else ttl, resp.rcode())


def query_for_upstream(q: Question, new_id: int) -> bytes:
    """The guest's question, re-issued with our own id and recursion desired."""
    msg = dns.message.make_query(
        dns.name.from_text(q.name or "."),
        dns.rdatatype.RdataType(q.qtype),
        use_edns=0,
        want_dnssec=False,
    )
    msg.id = new_id
    msg.flags |= dns.flags.RD
    return msg.to_wire()


def cache_key(wire: bytes) -> bytes:
    """Everything but the id: two queries with the same key get the same answer."""
    return wire[2:]


def with_id(wire: bytes, qid: bytes) -> bytes:
    return qid + wire[2:]
