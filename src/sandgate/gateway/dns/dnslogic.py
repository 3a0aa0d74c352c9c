"""What the resolver does with a question and an upstream answer. Pure: bytes in, bytes out.

The wire format is dnspython's business, with one exception made for speed: the readers at the
end of this module handle the two shapes nearly all traffic has, a plain one-question query and
a plain upstream answer of A/CNAME/SOA records, in a few microseconds instead of the ~240 µs
dnspython spends per forwarded question. They accept a strict subset of what dnspython accepts
and return None for anything else, which then takes the dnspython path: dnspython stays the
authority on every message the fast readers do not fully understand.

What is decided is policy/'s (``policy.dnsnames.judge_question`` and ``judge_aliases``, and
``decide()`` per address); this module writes the answers those verdicts call for:

- a refused name (a deny rule, a special-use name, a reverse name of private space) gets
  NXDOMAIN carrying an Extended DNS Error (RFC 8914, code 15 "Blocked") whose text is the
  reason key, so ``dig`` shows why;
- AAAA questions get an empty answer where the uplink has no IPv6 (an empty answer makes
  clients use IPv4 at once instead of timing out on IPv6); where it has, AAAA records are
  judged like A records;
- ANY gets RFC 8482's minimal answer (one HINFO "RFC8482"), never the name's records;
- zone transfers and other meta types get REFUSED (EDE 21 "Not Supported"), and go nowhere;
- an upstream answer whose addresses the policy refuses for that name (a public name pointing
  at a private address: DNS rebinding), or whose aliases lead somewhere refused, is replaced by
  NXDOMAIN with the reason (EDE 17 "Filtered").
"""

from __future__ import annotations

import ipaddress
import socket
import struct
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

EDE_BLOCKED = 15
EDE_FILTERED = 17
EDE_NOT_SUPPORTED = 21
MINIMAL_ANY_TTL = 3600  # RFC 8482 4.2 leaves it to the responder; long, as it never changes
A, AAAA, PTR, ANY = dns.rdatatype.A, dns.rdatatype.AAAA, dns.rdatatype.PTR, dns.rdatatype.ANY
CNAME = dns.rdatatype.CNAME


@dataclass(frozen=True)
class Question:
    id: int
    name: str  # lower-case, no trailing dot ("" for the root)
    qtype: int
    wire: bytes  # the query as received
    parsed: dns.message.Message | None = None  # set when dnspython read it
    # Set when the fast reader read it: the lower-cased wire form of the name, where the
    # question section ends, and whether the query carried an (option-less) OPT record.
    qname_wire: bytes | None = None
    question_end: int = 0
    edns: bool = False

    @property
    def message(self) -> dns.message.Message:
        return self.parsed if self.parsed is not None else dns.message.from_wire(self.wire)

    @property
    def has_edns(self) -> bool:
        """The query carried an OPT record (an answer may then carry one too)."""
        return self.edns if self.qname_wire is not None else self.message.edns >= 0

    @property
    def name_end(self) -> int:
        """Where the question's name ends in ``wire`` (``qname_end``; 0 if compressed)."""
        return self.question_end - 4 if self.qname_wire is not None else qname_end(self.wire)

    @property
    def type_text(self) -> str:
        text = _TYPE_TEXT.get(self.qtype)
        if text is None:  # at most 65,536 types: the memo is bounded
            text = _TYPE_TEXT[self.qtype] = dns.rdatatype.to_text(self.qtype)  # type: ignore[arg-type]
        return text


_TYPE_TEXT: dict[int, str] = {}  # qtype -> dnspython's text for it (~1 µs a call otherwise)


class Malformed(ValueError):
    """The bytes are not a DNS query we can answer; ``reply`` is FORMERR if an id was readable."""

    def __init__(self, why: str, reply: bytes | None) -> None:
        super().__init__(why)
        self.reply = reply


def parse_question(wire: bytes) -> Question:
    fast = _fast_question(wire)
    if fast is not None:
        return fast
    try:
        msg = dns.message.from_wire(wire)
    except (dns.exception.DNSException, ValueError) as exc:
        raise Malformed(f"unparseable query: {exc}", _formerr(wire)) from exc
    if msg.flags & dns.flags.QR or msg.opcode() != dns.opcode.QUERY or len(msg.question) != 1:
        raise Malformed("not a single standard query", _formerr(wire))
    rrset = msg.question[0]
    # dnspython writes the root as "." (it used to be "@"): the root's name is "".
    root = rrset.name == dns.name.root
    name = "" if root else rrset.name.to_text(omit_final_dot=True).lower()
    if rrset.rdclass != dns.rdataclass.IN:
        raise Malformed("only class IN is served", _formerr(wire))
    return Question(msg.id, name, rrset.rdtype, wire, msg)


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


def refused(q: Question, reason_key: str) -> bytes:
    """REFUSED with an Extended DNS Error naming the reason (zone transfers, meta types)."""
    resp = dns.message.make_response(q.message)
    resp.set_rcode(dns.rcode.REFUSED)
    resp.flags |= dns.flags.RA
    if q.message.edns >= 0:
        ede = dns.edns.EDEOption(dns.edns.EDECode(EDE_NOT_SUPPORTED), f"sandgate: {reason_key}")
        resp.use_edns(0, options=[ede])
    return resp.to_wire()


def minimal_any(q: Question, reason_key: str) -> bytes:
    """RFC 8482's answer to ANY: one synthesised HINFO "RFC8482" "" and nothing else."""
    resp = dns.message.make_response(q.message)
    resp.flags |= dns.flags.RA
    owner = dns.name.from_text(q.name or ".")
    resp.answer.append(dns.rrset.from_text(owner, MINIMAL_ANY_TTL, "IN", "HINFO", '"RFC8482" ""'))
    if q.message.edns >= 0:
        ede = dns.edns.EDEOption(dns.edns.EDECode(EDE_NOT_SUPPORTED), f"sandgate: {reason_key}")
        resp.use_edns(0, options=[ede])
    return resp.to_wire()


def empty(q: Question) -> bytes:
    """NOERROR with no records (used for AAAA: IPv4 only)."""
    if q.qname_wire is not None:
        # What dnspython's make_response renders for a plain query, without parsing it again:
        # QR, RD copied, RA; the question as asked; an OPT advertising 8192 if the query had one.
        flags = 0x8080 | (q.wire[2] & 0x01) << 8
        head = _HEADER.pack(q.id, flags, 1, 0, 0, 1 if q.edns else 0)
        return head + q.wire[12 : q.question_end] + (_OPT_8192 if q.edns else b"")
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


@dataclass(frozen=True)
class Answer:
    """An upstream answer, judged: what to send the guest, and what it revealed."""

    wire: bytes  # the reply for the guest, with the guest's query id
    addresses: tuple[str, ...]  # IPv4 addresses in the answer section
    ttl: int  # smallest TTL among those records (for pinning and caching)
    rcode: int
    refused: str | None = None  # reason key when the answer was replaced by NXDOMAIN
    refused_address: str | None = None
    # The answer section's CNAME records as (owner, target), lower-case, no trailing dot,
    # sorted and without duplicates: for policy.dnsnames.judge_aliases.
    aliases: tuple[tuple[str, str], ...] = ()


def judge_answer(
    q: Question,
    upstream: bytes,
    check: Callable[[ipaddress.IPv4Address], str | None],
    check6: Callable[[ipaddress.IPv6Address], str | None] | None = None,
) -> Answer:
    """Apply ``check`` (address -> reason key if refused) to every A record of the answer, and
    ``check6`` (given where the gateway's uplink has IPv6) to every AAAA record; without it
    AAAA records are removed unseen, whatever was asked."""
    fast = _fast_answer(upstream)  # A, CNAME and SOA only: an AAAA record takes the long path
    if fast is not None and fast[4][1] and not q.has_edns:
        # RFC 6891 7: no OPT record in the answer to a query that had none. Cut out where it
        # is the last record; elsewhere a later name may point at another past it (pointers
        # would move), and dnspython writes the answer anew.
        opt_start, opt_end = fast[4]
        if opt_end == len(upstream):
            arcount = int.from_bytes(upstream[10:12], "big") - 1
            upstream = upstream[:10] + arcount.to_bytes(2, "big") + upstream[12:opt_start]
        else:
            fast = None
    if fast is not None:
        raw_addresses, fast_ttl, fast_rcode, fast_aliases, _ = fast
        shown: list[str] = []
        for raw in raw_addresses:
            address = ipaddress.IPv4Address(raw)
            refused = check(address)
            if refused is not None:
                wire = blocked(q, refused, code=EDE_FILTERED)
                return Answer(wire, (), 0, dns.rcode.NXDOMAIN, refused, str(address))
            shown.append(socket.inet_ntoa(raw))  # str(address)'s text, in C
        # The answer as it came, under the guest's id and spelling of the name: the reader
        # checked every byte of it.
        reply = with_question(upstream, q.wire, q.name_end)
        return Answer(reply, tuple(shown), fast_ttl, fast_rcode, aliases=fast_aliases)
    try:
        resp = dns.message.from_wire(upstream)
    except (dns.exception.DNSException, ValueError):
        return Answer(servfail(q, "bad upstream answer"), (), 0, dns.rcode.SERVFAIL)
    resp.id = q.id
    addresses: list[str] = []
    aliases: set[tuple[str, str]] = set()
    ttl = 2**31
    kept = (A,) if check6 is None else (A, AAAA)  # the address records judged and passed on
    for rrset in resp.answer:
        if rrset.rdtype == CNAME:  # of any class: an odd one is judged, not passed unseen
            aliases.update((_text(rrset.name), _text(rdata.target)) for rdata in rrset)
        if rrset.rdtype in kept and rrset.rdclass != dns.rdataclass.IN:
            # Not an address record (dnspython keeps it as opaque data): refuse the answer
            # rather than fail on it.
            return Answer(servfail(q, "bad upstream answer"), (), 0, dns.rcode.SERVFAIL)
        if rrset.rdtype in kept:
            ttl = min(ttl, rrset.ttl)
            for rdata in rrset:
                addr = ipaddress.ip_address(rdata.address)
                if isinstance(addr, ipaddress.IPv4Address):
                    refused = check(addr)
                else:  # AAAA records are kept only with check6
                    refused = check6(addr) if check6 is not None else "deny.ipv6"
                if refused is not None:
                    wire = blocked(q, refused, code=EDE_FILTERED)
                    return Answer(wire, (), 0, dns.rcode.NXDOMAIN, refused, str(addr))
                addresses.append(str(addr))
    if check6 is None and (q.qtype == AAAA or any(r.rdtype == AAAA for r in resp.answer)):
        resp.answer = [r for r in resp.answer if r.rdtype != AAAA]
    ttl = 0 if ttl == 2**31 else ttl
    rcode = resp.rcode()  # as the upstream said it (with an OPT's extended bits)
    if not q.has_edns:
        resp.use_edns(False)  # RFC 6891 7: no OPT record for a query that had none
    reply = with_question(resp.to_wire(), q.wire, q.name_end)
    return Answer(reply, tuple(addresses), ttl, rcode, aliases=tuple(sorted(aliases)))


def _text(name: dns.name.Name) -> str:
    """A name as the policy takes it: lower-case, no trailing dot, "" for the root."""
    return "" if name == dns.name.root else name.to_text(omit_final_dot=True).lower()


def query_for_upstream(q: Question, new_id: int) -> bytes:
    """The guest's question, re-issued with our own id and recursion desired."""
    if q.qname_wire is not None:
        # Byte for byte what dnspython's make_query(..., use_edns=0) renders, with RD set.
        head = _HEADER.pack(new_id, 0x0100, 1, 0, 0, 1)
        return head + q.qname_wire + _QTAIL.pack(q.qtype, 1) + _OPT_1232
    msg = dns.message.make_query(
        dns.name.from_text(q.name or "."),
        dns.rdatatype.RdataType(q.qtype),
        use_edns=0,
        want_dnssec=False,
        id=new_id,
    )
    msg.flags |= dns.flags.RD
    return msg.to_wire()


def cache_key(wire: bytes) -> bytes | None:
    """Everything but the id, with the name's letters lower-cased: two queries with the same
    key ask the same question (None: no name ending in the bytes, not worth a lookup).

    The name is taken to end at the first zero byte, so no walk over labels is needed. That is
    sound for any bytes: ``lower()`` leaves zero bytes and bytes below 64 (every label length)
    as they are, so two wires with the same key have their first zero at the same place, the
    same bytes after it and the same label lengths before it, and differ at most in the case of
    letters inside labels, which DNS names do not tell apart (RFC 4343)."""
    end = wire.find(0, 12)
    if end < 0:
        return None
    return wire[2:12] + wire[12:end].lower() + wire[end:]


def qname_end(wire: bytes) -> int:
    """Where the question's name ends (after its zero label) when it is written out in full
    from offset 12, as a query's is; 0 when it is compressed or runs past the end."""
    pos, size = 12, len(wire)
    while pos < size:
        n = wire[pos]
        if n == 0:
            return pos + 1
        if n > 63:
            return 0
        pos += 1 + n
    return 0


def with_question(answer: bytes, query: bytes, end: int) -> bytes:
    """``answer`` under ``query``'s id and with the question's name spelt as the query spelt
    it (resolvers echo the case, and clients using 0x20 randomisation check it), where the
    answer's question is that name in full up to ``end`` (``qname_end``); else only the id."""
    if end > 12 and len(answer) >= end and answer[12:end].lower() == query[12:end].lower():
        return query[:2] + answer[2:12] + query[12:end] + answer[end:]
    return query[:2] + answer[2:]


def ttl_fields(wire: bytes) -> tuple[tuple[int, int], ...] | None:
    """(offset, TTL) of every record's TTL field but OPT's (whose "TTL" holds flags), for
    ageing a cached answer; None when the message cannot be walked (it is then not aged)."""
    size = len(wire)
    if size < 12:
        return None
    _qid, _flags, qd, an, ns, ar = _HEADER.unpack_from(wire)
    pos = 12
    for _ in range(qd):
        got = _read_name(wire, pos, size)
        if got is None or got[1] + 4 > size:
            return None
        pos = got[1] + 4
    out: list[tuple[int, int]] = []
    for _ in range(an + ns + ar):
        got = _read_name(wire, pos, size)
        if got is None or got[1] + 10 > size:
            return None
        pos = got[1]
        rtype, _rclass, ttl, rdlen = _RR.unpack_from(wire, pos)
        if rtype != T_OPT:
            out.append((pos + 4, ttl))
        pos += 10 + rdlen
        if pos > size:
            return None
    return tuple(out) if pos == size else None


def aged(wire: bytes, fields: tuple[tuple[int, int], ...], seconds: int) -> bytes:
    """``wire`` with each TTL of ``fields`` lowered by ``seconds`` (not below 0), as a cache
    hands out an answer it has held that long (RFC 1035 7.4)."""
    out = bytearray(wire)
    for offset, ttl in fields:
        _TTL.pack_into(out, offset, max(0, min(ttl, 0x7FFFFFFF) - seconds))
    return bytes(out)


# -- fast readers for the common shapes (see the module docstring) -----------------------------

_HEADER = struct.Struct("!HHHHHH")
_QTAIL = struct.Struct("!HH")
_RR = struct.Struct("!HHIH")
_TTL = struct.Struct("!I")
_OPT_1232 = b"\x00" + _RR.pack(41, 1232, 0, 0)  # dnspython's default EDNS payload
_OPT_8192 = b"\x00" + _RR.pack(41, 8192, 0, 0)  # what make_response advertises
# Label bytes the fast reader accepts: those dnspython prints without escaping, so the name's
# text is simply the labels joined by dots.
_PLAIN = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"
_MAX_POINTERS = 16  # dnspython's MAX_COMPRESSION_POINTER_CHAIN
T_A, T_CNAME, T_SOA, T_OPT = 1, 5, 6, 41
CLASS_IN = 1


def _fast_question(wire: bytes) -> Question | None:
    """A plain query: one IN question with an uncompressed, escape-free name, no records but
    an option-less OPT. None for anything else (dnspython then reads it)."""
    size = len(wire)
    if size < 17:
        return None
    qid, flags, qd, an, ns, ar = _HEADER.unpack_from(wire)
    if flags & 0xF800 or qd != 1 or an or ns or ar > 1:  # QR set, opcode not QUERY, records
        return None
    pos = 12
    labels: list[bytes] = []
    while True:
        if pos >= size:
            return None
        n = wire[pos]
        if n == 0:
            pos += 1
            break
        if n > 63:  # compression or a bad label type: not in a plain query
            return None
        labels.append(wire[pos + 1 : pos + 1 + n])
        pos += 1 + n
    if not labels or pos - 12 > 255 or pos + 4 > size:  # the root: dnspython's path
        return None
    text = b".".join(labels)
    if text.translate(None, _PLAIN) != b"." * (len(labels) - 1):  # a label that needs escapes
        return None
    qtype, qclass = _QTAIL.unpack_from(wire, pos)
    pos += 4
    if qclass != CLASS_IN:
        return None
    edns = False
    if ar:
        if size != pos + 11 or wire[pos] != 0:
            return None
        rtype, _payload, _ttl, rdlen = _RR.unpack_from(wire, pos + 1)
        if rtype != T_OPT or rdlen:
            return None
        edns = True
    elif size != pos:
        return None
    # Label lengths are below 64, so lower() changes only the letters of the labels.
    qname_wire = wire[12 : pos - 4].lower()
    return Question(qid, text.lower().decode("ascii"), qtype, wire, None, qname_wire, pos, edns)


def _read_name(wire: bytes, pos: int, end: int) -> tuple[bytes, int] | None:
    """A possibly compressed name starting at ``pos`` (not reading past ``end``): its lower-cased
    uncompressed form and the position after it; None where dnspython would refuse it."""
    parts: list[bytes] = []
    after = -1
    segment = pos
    hops = 0
    total = 1
    while True:
        if pos >= end:
            return None
        n = wire[pos]
        if n == 0:
            pos += 1
            break
        if n < 64:
            if pos + 1 + n > end:
                return None
            parts.append(wire[pos : pos + 1 + n])
            total += n + 1
            pos += 1 + n
        elif n >= 192:
            if pos + 2 > end:
                return None
            target = (n & 0x3F) << 8 | wire[pos + 1]
            if after < 0:
                after = pos + 2
            hops += 1
            if target >= segment or hops > _MAX_POINTERS:
                return None  # pointers go strictly backwards, never into what was read
            end = segment
            segment = pos = target
        else:
            return None
    if total > 255:
        return None
    return b"".join(parts).lower(), (after if after >= 0 else pos)


def _plain_text(name: bytes) -> str | None:
    """The text of an uncompressed wire name whose labels need no escapes; None otherwise."""
    labels: list[bytes] = []
    pos = 0
    while pos < len(name):
        n = name[pos]
        labels.append(name[pos + 1 : pos + 1 + n])
        pos += 1 + n
    text = b".".join(labels)
    if text.translate(None, _PLAIN) != b"." * max(0, len(labels) - 1):
        return None
    return text.decode("ascii")


def _fast_answer(
    wire: bytes,
) -> tuple[list[bytes], int, int, tuple[tuple[str, str], ...], tuple[int, int]] | None:
    """A plain upstream answer: (A addresses in dnspython's order, smallest A TTL, rcode, the
    answer's aliases as ``Answer.aliases``, where its OPT record starts and ends, (0, 0) if it
    has none), or None unless every record is IN A/CNAME/SOA (and one option-less OPT), every
    name in a CNAME of the answer needs no escapes, and every byte is accounted for."""
    size = len(wire)
    if size < 12:
        return None
    _qid, flags, qd, an, ns, ar = _HEADER.unpack_from(wire)
    if flags & 0x7800:  # an opcode other than QUERY
        return None
    pos = 12
    qname: bytes | None = None  # the first question's name: most owners point at it (0xC00C)
    for _ in range(qd):
        got = _read_name(wire, pos, size)
        if got is None or got[1] + 4 > size:
            return None
        if qname is None:
            qname = got[0]
        pos = got[1] + 4
    # A rdatasets of the answer section by owner, in order of first appearance (as dnspython
    # groups them into rrsets), each without duplicates, with the smallest TTL of its records.
    groups: dict[bytes, tuple[list[bytes], list[int]]] = {}
    ext_rcode = 0
    seen_opt = False
    aliases: set[tuple[str, str]] = set()
    opt = (0, 0)
    for section, count in ((1, an), (2, ns), (3, ar)):
        for _ in range(count):
            start = pos
            if qname is not None and wire[pos : pos + 2] == b"\xc0\x0c":
                # What _read_name returns for a pointer to offset 12: that name was read whole
                # before ``pos``, so no bound it checks can differ.
                got = qname, pos + 2
            else:
                got = _read_name(wire, pos, size)
            if got is None or got[1] + 10 > size:
                return None
            owner, pos = got
            rtype, rclass, ttl, rdlen = _RR.unpack_from(wire, pos)
            pos += 10
            rend = pos + rdlen
            if rend > size:
                return None
            if rtype == T_OPT:
                if section != 3 or seen_opt or owner != b"" or rdlen:
                    return None
                seen_opt = True
                ext_rcode = ttl >> 24
                opt = (start, rend)
            elif rclass != CLASS_IN:
                return None
            elif rtype == T_A:
                if rdlen != 4:
                    return None
                if section == 1:
                    group = groups.setdefault(owner, ([], []))
                    rdata = wire[pos:rend]
                    if rdata not in group[0]:
                        group[0].append(rdata)
                    group[1].append(0 if ttl > 0x7FFFFFFF else ttl)
            elif rtype == T_CNAME:
                got = _read_name(wire, pos, rend)
                if got is None or got[1] != rend:
                    return None
                if section == 1:
                    owner_text, target_text = _plain_text(owner), _plain_text(got[0])
                    if owner_text is None or target_text is None:
                        return None  # dnspython writes escapes: let it
                    if any(o == owner_text and t != target_text for o, t in aliases):
                        # Two aliases for one name (a singleton type): dnspython keeps the
                        # last, and the guest then hears only what was judged.
                        return None
                    aliases.add((owner_text, target_text))
            elif rtype == T_SOA:
                got = _read_name(wire, pos, rend)
                if got is None:
                    return None
                got = _read_name(wire, got[1], rend)
                if got is None or got[1] + 20 != rend:
                    return None
            else:
                return None
            pos = rend
    if pos != size:
        return None
    addresses = [a for rdatas, _ in groups.values() for a in rdatas]
    ttl_min = min((min(ttls) for _, ttls in groups.values()), default=0)
    return addresses, ttl_min, (flags & 0xF) | (ext_rcode << 4), tuple(sorted(aliases)), opt


def address_query(name: str, qid: int, qtype: dns.rdatatype.RdataType = A) -> bytes:
    """An A (or AAAA) query for ``name`` (the proxy resolves names it connects to)."""
    msg = dns.message.make_query(dns.name.from_text(name), qtype, use_edns=0)
    msg.id = qid
    msg.flags |= dns.flags.RD
    return msg.to_wire()


Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class Addresses:
    """What an upstream answer says about a name's addresses: read once, for the resolver's
    own lookups and for the proxy, which keeps them for ``ttl`` (gateway/proxy/lookup.py)."""

    found: tuple[Address, ...]  # the IN A and AAAA records of the answer section, in order
    ttl: int  # the smallest TTL in the answer section (a CNAME on the way bounds it); 0: none
    rcode: int

    @property
    def nodata(self) -> bool:
        """NOERROR without an A record: the name exists, maybe with other types."""
        return self.rcode == dns.rcode.NOERROR and not any(
            isinstance(a, ipaddress.IPv4Address) for a in self.found
        )


def read_addresses(wire: bytes) -> Addresses | None:
    """The addresses an answer gives (CNAME chains are already flattened upstream), or None
    when it cannot be read. A and AAAA records of another class than IN are opaque data to
    dnspython and not addresses; their TTL still bounds the answer's."""
    try:
        msg = dns.message.from_wire(wire)
    except (dns.exception.DNSException, ValueError):
        return None
    found: list[Address] = []
    ttl: int | None = None
    for rrset in msg.answer:
        ttl = rrset.ttl if ttl is None else min(ttl, rrset.ttl)
        if rrset.rdclass == dns.rdataclass.IN and rrset.rdtype in (A, AAAA):
            found.extend(ipaddress.ip_address(r.address) for r in rrset)
    return Addresses(tuple(found), ttl if found and ttl is not None else 0, msg.rcode())


def local_answer(q: Question, address: str, ttl: int = 60) -> bytes:
    """An answer the gateway gives itself: ``address`` for A, nothing for other types."""
    resp = dns.message.make_response(q.message)
    resp.flags |= dns.flags.RA | dns.flags.AA
    if q.qtype == A:
        rrset = dns.rrset.from_text(dns.name.from_text(q.name), ttl, "IN", "A", address)
        resp.answer.append(rrset)
    return resp.to_wire()


def refused_wire(wire: bytes) -> bytes | None:
    """REFUSED for any query (the gateway is cut off); None when even the id is unreadable."""
    if len(wire) < 12:
        return None
    try:
        resp = dns.message.make_response(dns.message.from_wire(wire))
        resp.set_rcode(dns.rcode.REFUSED)
        return resp.to_wire()
    except (dns.exception.DNSException, ValueError):
        flags = 0x8000 | (wire[2] & 0x79) << 8 | dns.rcode.REFUSED
        return wire[:2] + flags.to_bytes(2, "big") + bytes(8)
