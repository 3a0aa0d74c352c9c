"""Fuzz targets: each parser that reads what a guest (or the kernel on its behalf) sends, with a
hypothesis strategy for its input and a check of its contract.

A check returns normally when the parser kept its contract: a result, or its documented
"need more" / "malformed" outcome, and (where there is one) agreement with the reference
reader (h11 for heads and chunked bodies, dnspython for DNS). Anything else raises: an
unexpected exception, or an ``AssertionError`` saying what disagreed. The same targets run
bounded in tests/unit/test_fuzz.py and for as long as asked in ``fuzz/run``.

Strategies mix plain random bytes with structure-aware inputs (valid seeds, then byte flips,
inserts, cuts and splices), so that the fuzzing gets past the first length field.
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import socket
import ssl
import struct
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.rdataclass
import dns.rdatatype
import dns.rrset
import h11
from hypothesis import strategies as st

from sandgate.errors import PeerProtocolError, PolicyError
from sandgate.gateway.dns import dnslogic
from sandgate.gateway.proxy import chunked, firstflight, httphead, sni
from sandgate.net import iphead, nflog, nfqueue, sockdiag
from sandgate.net.iptables import Action
from sandgate.net.netlink import NLMSGHDR, NetlinkParseError, pack_attr
from sandgate.policy import hostparse, load

Check = Callable[[Any], None]


@dataclass(frozen=True)
class Target:
    name: str
    strategy: st.SearchStrategy[Any]
    check: Check
    about: str


# -- mutation ----------------------------------------------------------------------------------

_INTERESTING = st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF, 0x0D, 0x0A, 0x20, 0x3A, 0x3B])


@st.composite
def mutated(draw: st.DrawFn, seeds: st.SearchStrategy[bytes], max_ops: int = 4) -> bytes:
    """A seed with up to ``max_ops`` flips, inserts, deletions, duplications or a cut."""
    buf = bytearray(draw(seeds))
    for _ in range(draw(st.integers(0, max_ops))):
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "dup", "cut"]))
        pos = draw(st.integers(0, len(buf)))
        if op == "flip" and pos < len(buf):
            buf[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and pos < len(buf):
            buf[pos] = draw(st.one_of(_INTERESTING, st.integers(0, 255)))
        elif op == "insert":
            buf[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del buf[pos : pos + draw(st.integers(1, 8))]
        elif op == "dup":
            buf[pos:pos] = buf[pos : pos + draw(st.integers(1, 16))]
        elif op == "cut":
            del buf[pos:]
    return bytes(buf)


def seeded(seeds: list[bytes], max_random: int) -> st.SearchStrategy[bytes]:
    """Random bytes, a seed as it is, or a mutated seed."""
    pick = st.sampled_from(seeds)
    return st.one_of(st.binary(max_size=max_random), pick, mutated(pick), mutated(pick, 12))


# -- TLS ClientHello ---------------------------------------------------------------------------


@cache
def _hellos() -> list[bytes]:
    """Real ClientHellos from the stdlib's OpenSSL (no network), and a few by hand."""
    out = []
    for name, alpn in (("example.com", ["h2", "http/1.1"]), ("pypi.org", None), (None, None)):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        if alpn:
            ctx.set_alpn_protocols(alpn)
        outgoing = ssl.MemoryBIO()
        tls = ctx.wrap_bio(ssl.MemoryBIO(), outgoing, server_hostname=name)
        with contextlib.suppress(ssl.SSLWantReadError):
            tls.do_handshake()
        out.append(outgoing.read())
    # The first real hello again, split into records of 7 bytes (the record layer's seams).
    body = out[0][5:]
    out.append(b"".join(b"\x16\x03\x01" + len(c).to_bytes(2, "big") + c for c in _chunks(body, 7)))
    return out


def _record_payloads(buf: bytes) -> bytes:
    out, pos = b"", 0
    while pos + 5 <= len(buf):
        size = int.from_bytes(buf[pos + 3 : pos + 5], "big")
        out, pos = out + buf[pos + 5 : pos + 5 + size], pos + 5 + size
    return out


def _chunks(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def check_sni(buf: bytes) -> None:
    sni.looks_like_tls(buf)
    try:
        result = sni.parse_client_hello(buf)
    except sni.Malformed:
        return
    if isinstance(result, sni.NeedMore):
        assert result.needed is None or result.needed > 0, result
        return
    assert isinstance(result, sni.ClientHello)
    assert 0 < result.raw_len <= len(buf)
    assert sni.looks_like_tls(buf) is True
    # Trailing bytes are ignored: the hello alone reads the same.
    assert sni.parse_client_hello(buf[: result.raw_len]) == result
    if result.sni is not None:
        assert sni.EXT_SERVER_NAME in result.extensions
        assert result.sni.encode() in _record_payloads(buf[: result.raw_len]).lower()
        assert isinstance(hostparse.parse_host(result.sni), hostparse.NameHost)


# -- TCP first flight --------------------------------------------------------------------------

_SEG = st.tuples(st.integers(0, 300), st.integers(0, 120))


@st.composite
def flights(draw: st.DrawFn) -> tuple[bytes, list[tuple[int, int]], int, list[tuple[int, bytes]]]:
    stream = draw(st.one_of(st.sampled_from(_hellos()[:2]), st.binary(max_size=300)))
    isn = draw(st.integers(0, 2**32 - 1))
    segments = draw(st.lists(_SEG, max_size=12))
    # Arbitrary segments too: any sequence number, any bytes (overlaps that disagree).
    wild = draw(st.lists(st.tuples(st.integers(0, 2**32 - 1), st.binary(max_size=40)), max_size=4))
    return stream, segments, isn, wild


def _queued(seq: int, data: bytes, sport: int = 40000) -> nfqueue.QueuedPacket:
    return replace(
        _BASE_PACKET, tcp_seq=seq, payload=data, data_offset=0, data_len=len(data), sport=sport
    )


def check_firstflight(
    case: tuple[bytes, list[tuple[int, int]], int, list[tuple[int, bytes]]],
) -> None:
    stream, segments, isn, wild = case
    # Segments cut from one true stream, start known: never a conflict, and what is contiguous
    # is always a prefix of that stream.
    prefix = firstflight.StreamPrefix(start=isn, limit=256)
    for off, size in segments:
        prefix.add((isn + off) & 0xFFFFFFFF, stream[off : off + size])
    got = prefix.contiguous()
    assert not prefix.conflict and not prefix.out_of_order
    assert len(got) <= 256 and stream.startswith(got)
    # Anything at all: no exception, and the holder releases every packet exactly once.
    flows = firstflight.FirstFlights(_judge_hello, limit=512, max_flows=2)
    fed, released = 0, 0
    packets = [((isn + off) & 0xFFFFFFFF, stream[off : off + size]) for off, size in segments]
    for i, (seq, data) in enumerate([*packets, *wild]):
        fed += 1
        out = flows.feed(_queued(seq, data, 40000 + i % 3), float(i))
        released += len(out)
        assert all(a in (Action.ALLOW, Action.DENY, Action.PASS) for _, a in out)
    released += len(flows.expire(1e9))
    assert flows.holding == 0
    assert released == fed, (released, fed)


def _judge_hello(_first: nfqueue.QueuedPacket, data: bytes) -> bool | None:
    result = sni.parse_client_hello(data)
    return None if isinstance(result, sni.NeedMore) else result.sni is not None


# -- HTTP heads ---------------------------------------------------------------------------------

_METHODS = st.sampled_from([b"GET", b"POST", b"CONNECT", b"OPTIONS", b"TRACE", b"get", b"G\x00T"])
_TARGETS = st.sampled_from(
    [
        b"/",
        b"/a?b=c",
        b"*",
        b"http://example.com/",
        b"https://Example.COM:8443/x",
        b"example.com:443",
        b"http://u:p@example.com/",
        b"http://[::1]:80/",
        b"/#frag",
        b"http://0x7f.1/",
        b"ftp://example.com/",
        b"http://ex%61mple.com/",
        b"/\xff",
    ]
)
_NAMES = st.sampled_from(
    [
        b"Host",
        b"host",
        b"Content-Length",
        b"Transfer-Encoding",
        b"Upgrade",
        b"Content_Length",
        b"Transfer_Encoding",
        b"X-A",
        b"Host ",
        b" Host",
        b"Authorization",
        b"",
    ]
)
_VALUES = st.sampled_from(
    [
        b"example.com",
        b"EXAMPLE.com:8443",
        b"[::1]",
        b"5",
        b"05",
        b"-1",
        b"1,1",
        b"chunked",
        b" chunked",
        b"\tchunked",
        b"gzip, chunked",
        b"h2c",
        b"a\x00b",
        b"",
        b"example.com:0",
        b"10.0.0.1",
        b"0x7f.1",
        b"example.com.",
        b"xn--bcher-kva.de",
        b"Bearer s3cret",
    ]
)
_EOLS = st.sampled_from([b"\r\n", b"\r\n", b"\r\n", b"\n", b"\r", b"\r\n "])


@st.composite
def heads(draw: st.DrawFn) -> bytes:
    """A request head from plausible parts, some of them wrong, then maybe mutated."""
    eol = draw(_EOLS)
    line = (
        draw(_METHODS)
        + b" "
        + draw(_TARGETS)
        + b" HTTP/"
        + draw(st.sampled_from([b"1.1", b"1.0", b"2"]))
    )
    fields = draw(st.lists(st.tuples(_NAMES, _VALUES, _EOLS), max_size=6))
    head = line + eol + b"".join(n + b": " + v + e for n, v, e in fields) + draw(_EOLS)
    if draw(st.booleans()):
        head += draw(st.sampled_from([b"", b"hello", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"]))
    return draw(mutated(st.just(head), 3))


def _h11_request(raw: bytes) -> tuple[h11.Request | None, bool]:
    """(h11's Request or None, whether h11 refused the bytes)."""
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(raw)
    try:
        event = conn.next_event()
    except h11.RemoteProtocolError:
        return None, True
    return (event, False) if isinstance(event, h11.Request) else (None, False)


def check_httphead(raw: bytes) -> None:
    _check_aim(raw)
    try:
        end = httphead.head_end(raw)
    except PeerProtocolError:
        assert len(raw) > httphead.MAX_HEAD_BYTES
        return
    request, refused = _h11_request(raw)
    if request is None:
        # h11 saw no whole head (or refused it): the proxy never gets to judge; check_head
        # must still only accept or refuse.
        assert refused or end is None or len(raw) > 16384 or raw[:1] in (b"\r", b"\n"), raw
        with contextlib.suppress(PeerProtocolError):
            httphead.check_head(raw)
        return
    assert end is not None, raw  # h11 found the head's end where head_end did
    try:
        httphead.check_head(raw)
        for explicit in (False, True):
            try:
                target = httphead.judge_request(
                    request.method,
                    request.target,
                    list(request.headers),
                    explicit_proxy=explicit,
                    http_version=request.http_version,
                )
            except PeerProtocolError as exc:
                assert 400 <= exc.status_hint < 600
                continue
            _agrees_with_h11(raw[:end], request, target)
    except PeerProtocolError as exc:
        assert 400 <= exc.status_hint < 600


def _agrees_with_h11(head: bytes, request: h11.Request, target: httphead.RequestTarget) -> None:
    """What check_head passed, h11 read line for line: one header per raw header line (no
    folding, nothing hidden), and the judged host is the Host header h11 saw."""
    lines = head.split(b"\r\n")[1:]
    assert len([ln for ln in lines if ln]) == len(request.headers), head
    hosts = [v for n, v in request.headers if n == b"host"]
    if target.kind in ("origin", "asterisk"):
        assert len(hosts) == 1
        expected = httphead._parse_host_header(hosts[0])[0]
        assert target.host == httphead._host_str(expected), (target, hosts)


def _check_aim(raw: bytes) -> None:
    aim = httphead.aimed_at(raw)
    for text in (aim.name, aim.path, aim.address):
        assert text is None or all("!" <= c <= "~" or c == "…" for c in text), aim
    assert aim.port is None or 0 < aim.port < 65536


def check_aimed_at(raw: bytes) -> None:
    _check_aim(raw)
    message = httphead.h11_message(h11.RemoteProtocolError(f"illegal header line: {raw!r}"))
    assert repr(raw) not in message or not raw


# -- chunked bodies -----------------------------------------------------------------------------


@st.composite
def bodies(draw: st.DrawFn) -> tuple[bytes, list[int]]:
    parts = []
    for data in draw(st.lists(st.binary(min_size=1, max_size=20), max_size=4)):
        size = draw(st.sampled_from([f"{len(data):x}", f"{len(data):X}", f"0{len(data):x}"]))
        ext = draw(st.sampled_from(["", "", ";a", ';a="b c"', ";a=b", " ;a", ";"]))
        parts.append(size.encode() + ext.encode() + b"\r\n" + data + b"\r\n")
    trailer = draw(st.sampled_from([b"", b"", b"X-T: 1\r\n", b"Host: x\r\n", b"X : 1\r\n"]))
    body = b"".join(parts) + b"0\r\n" + trailer + b"\r\n"
    body = draw(st.one_of(st.just(body), mutated(st.just(body), 3), st.binary(max_size=60)))
    cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=4)))
    return body, cuts


def _run_chunked(pieces: list[bytes]) -> tuple[bool, int, int] | None:
    """(done, bytes taken, data bytes), or None if refused."""
    check = chunked.ChunkedCheck()
    taken = 0
    try:
        for piece in pieces:
            n = check.feed(piece)
            assert 0 <= n <= len(piece)
            taken += n
    except PeerProtocolError as exc:
        assert exc.status_hint == 400
        return None
    return check.done, taken, check.body_bytes


def check_chunked(case: tuple[bytes, list[int]]) -> None:
    body, cuts = case
    whole = _run_chunked([body])
    bounds = [0, *cuts, len(body)]
    split = _run_chunked([body[a:b] for a, b in itertools.pairwise(bounds)])
    # However the bytes arrive, the verdict is the same (a refusal may only come earlier).
    assert (whole is None) == (split is None) or (
        whole is None and split is not None and not split[0]
    ), (whole, split)
    if whole is None or not whole[0]:
        return
    assert split == whole
    # Accepted and complete: h11 frames the same body, byte for byte.
    _, taken, data_bytes = whole
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n")
    conn.receive_data(body[:taken])
    assert isinstance(conn.next_event(), h11.Request)
    seen = 0
    while True:
        event = conn.next_event()
        if isinstance(event, h11.Data):
            seen += len(event.data)
            continue
        assert isinstance(event, h11.EndOfMessage), (event, body)
        break
    assert seen == data_bytes


# -- DNS ---------------------------------------------------------------------------------------

_LABELS = st.one_of(
    st.sampled_from([b"www", b"Example", b"COM", b"pypi", b"a-b_c", b"xn--bcher-kva", b"*"]),
    st.binary(min_size=1, max_size=12),
)


@st.composite
def queries(draw: st.DrawFn) -> bytes:
    labels = draw(st.lists(_LABELS, max_size=5))
    try:
        name = dns.name.Name([*labels, b""])
    except dns.exception.DNSException:
        name = dns.name.root
    qtype = draw(st.sampled_from(["A", "AAAA", "ANY", "AXFR", "TXT", "PTR", "TYPE65000"]))
    edns = draw(st.sampled_from([None, 0]))
    msg = dns.message.make_query(name, qtype, use_edns=edns, id=draw(st.integers(0, 0xFFFF)))
    return draw(st.one_of(st.just(msg.to_wire()), mutated(st.just(msg.to_wire()), 3)))


def _dnspython_question(wire: bytes) -> tuple[int, str, int] | None:
    try:
        msg = dns.message.from_wire(wire)
    except Exception:  # the reference may raise anything: that only means "unreadable"
        return None
    if msg.flags & dns.flags.QR or msg.opcode() != 0 or len(msg.question) != 1:
        return None
    rrset = msg.question[0]
    if rrset.rdclass != dns.rdataclass.IN:
        return None
    root = rrset.name == dns.name.root
    return msg.id, "" if root else rrset.name.to_text(omit_final_dot=True).lower(), rrset.rdtype


def check_dns_question(wire: bytes) -> None:
    expected = _dnspython_question(wire)
    try:
        q = dnslogic.parse_question(wire)
    except dnslogic.Malformed as exc:
        assert expected is None, wire.hex()
        assert exc.reply is None or exc.reply[:2] == wire[:2]
        return
    assert (q.id, q.name, q.qtype) == expected, wire.hex()
    # The answers the resolver writes itself, from either reader, parse back.
    for reply in (dnslogic.empty(q), dnslogic.blocked(q, "deny.x"), dnslogic.refused(q, "x")):
        assert dns.message.from_wire(reply).id == q.id
    dns.message.from_wire(dnslogic.query_for_upstream(q, 7))
    refusal = dnslogic.refused_wire(wire)
    assert refusal is not None and refusal[:2] == wire[:2]


@st.composite
def answers(draw: st.DrawFn) -> tuple[bytes, bytes]:
    query = dns.message.make_query("www.example.com.", draw(st.sampled_from(["A", "AAAA"])), id=9)
    resp = dns.message.make_response(query)
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["A", "A", "CNAME", "AAAA", "TXT", "SOA"]))
        owner = draw(st.sampled_from(["www.example.com.", "WWW.example.COM.", "o.example."]))
        value = {
            "A": draw(st.sampled_from(["203.0.113.10", "10.0.0.1", "127.0.0.1"])),
            "CNAME": draw(st.sampled_from(["t.example.", "localhost.", "."])),
            "AAAA": "2001:db8::1",
            "TXT": '"hi"',
            "SOA": "ns.example. h.example. 1 2 3 4 5",
        }[kind]
        ttl = draw(st.sampled_from([0, 60, 2**31 + 5]))
        rrset = dns.rrset.from_text(owner, ttl & 0x7FFFFFFF, "IN", kind, value)
        (resp.answer if kind != "SOA" else resp.authority).append(rrset)
    wire = resp.to_wire(want_shuffle=False)
    return query.to_wire(), draw(
        st.one_of(st.just(wire), mutated(st.just(wire), 4), st.binary(max_size=80))
    )


def check_dns_answer(case: tuple[bytes, bytes]) -> None:
    query, upstream = case
    q = dnslogic.parse_question(query)

    def check(address: ipaddress.IPv4Address) -> str | None:
        return "deny.private" if address.is_private else None

    got = dnslogic.judge_answer(q, upstream, check)
    reply = dns.message.from_wire(got.wire)
    assert reply.id == q.id
    fast = dnslogic._fast_answer(upstream)
    if fast is not None:
        # The fast reader read only what dnspython reads the same way.
        msg = dns.message.from_wire(upstream)
        addresses = [r.address for s in msg.answer if s.rdtype == dns.rdatatype.A for r in s]
        assert [str(ipaddress.IPv4Address(a)) for a in fast[0]] == addresses, upstream.hex()
        assert fast[2] == msg.rcode()
    if got.refused is None:
        assert all(not ipaddress.IPv4Address(a).is_private for a in got.addresses)
    dnslogic.read_addresses(upstream)  # never raises on any bytes


# -- netlink records ---------------------------------------------------------------------------

_IPV4_TCP = bytes.fromhex(
    "450000280001400040060000cb00710a0a0000010050c35000000001000000005002ffff00000000"
)
_IPV6_UDP = bytes.fromhex(
    "60000000000c1140"
    + "20010db8"
    + "00" * 11
    + "01"
    + "fe80"
    + "00" * 13
    + "02"
    + "0035c350000c0000"
    + "61626364"
)
_IPV6_EXT = _IPV6_UDP[:6] + b"\x00" + _IPV6_UDP[7:40] + b"\x11\x00" + bytes(6) + _IPV6_UDP[40:]
_ARP = bytes.fromhex("0001080006040001" + "020000000001" + "0a000001" + "000000000000" + "0a000002")
_PAYLOADS = [_IPV4_TCP, _IPV6_UDP, _IPV6_EXT, _ARP, _IPV4_TCP[:20] + b"\x16\x03\x01"]


def _nlmsg(mtype: int, body: bytes, seq: int = 0) -> bytes:
    return NLMSGHDR.pack(NLMSGHDR.size + len(body), mtype, 0, seq, 0) + body


@cache
def _nflog_seeds() -> list[bytes]:
    out = []
    for payload, hw in zip(_PAYLOADS, (0x0800, 0x86DD, 0x86DD, 0x0806, 0x0800), strict=True):
        attrs = pack_attr(nflog.NFULA_PACKET_HDR, struct.pack("!HBx", hw, 3))
        attrs += pack_attr(nflog.NFULA_PREFIX, b"sg-drop\0")
        attrs += pack_attr(nflog.NFULA_UID, (1000).to_bytes(4, "big"))
        attrs += pack_attr(nflog.NFULA_TIMESTAMP, struct.pack("!QQ", 1, 2))
        attrs += pack_attr(nflog.NFULA_PAYLOAD, payload)
        out.append(_nlmsg(0x0400, struct.pack("!BBH", 2, 0, 5) + attrs))
    out.append(out[0] + out[3] + _nlmsg(3, b"\0\0\0\0"))  # a batch closed by NLMSG_DONE
    return out


@cache
def _nfqueue_seeds() -> list[bytes]:
    out = []
    for i, payload in enumerate(_PAYLOADS[:3]):
        attrs = pack_attr(nfqueue.NFQA_PACKET_HDR, struct.pack("!IHB", i + 1, 0x0800, 2) + b"\0")
        ct = pack_attr(nfqueue.CTA_MARK, (7).to_bytes(4, "big"))
        attrs += pack_attr(nfqueue.NFQA_CT | 0x8000, ct)
        attrs += pack_attr(nfqueue.NFQA_MARK, (1).to_bytes(4, "big"))
        attrs += pack_attr(nfqueue.NFQA_PAYLOAD, payload + sni_tail())
        out.append(_nlmsg(0x0300, struct.pack("!BBH", 2, 0, 7) + attrs))
    out.append(_nlmsg(2, struct.pack("=i", -2) + out[0][:20]))  # NLMSG_ERROR
    return out


def sni_tail() -> bytes:
    return _hellos()[0][:40]


def check_nflog(buf: bytes) -> None:
    try:
        packets = nflog.parse_nflog(buf)
    except NetlinkParseError:
        return
    for p in packets:
        assert p.length >= 0
        for address in (p.src, p.dst):
            assert address is None or ipaddress.ip_address(address)


def check_nfqueue(buf: bytes) -> None:
    try:
        packets = nfqueue.parse_nfqueue(buf)
    except NetlinkParseError:
        return
    for p in packets:
        assert p.data_len >= 0
        assert len(p.data) <= p.data_len or p.data_offset is None
        assert p.data_offset is None or p.data_offset <= len(p.payload) + 60 * 4 + 60


def check_iphead(p: bytes) -> None:
    for read, family in ((iphead.ipv4, 4), (iphead.ipv6, 6)):
        h = read(p)
        header = 20 if family == 4 else 40
        assert (h.src is None) == (len(p) < header) == (h.dst is None)
        if h.src is not None:
            raw = p[12:16] if family == 4 else p[8:24]
            assert ipaddress.ip_address(h.src) == ipaddress.ip_address(raw)
        assert h.l4 is None or h.l4 >= 20
        assert h.end >= 0


@st.composite
def diag_replies(draw: st.DrawFn) -> tuple[bytes, int | None]:
    msg = struct.pack("=BBBB", 2, 1, 0, 0) + bytes(48) + struct.pack("=IIIII", 0, 0, 0, 1000, 4242)
    seeds = [
        _nlmsg(sockdiag.SOCK_DIAG_BY_FAMILY, msg, 3),
        _nlmsg(2, struct.pack("=i", -2), 3),
        _nlmsg(3, b"\0\0\0\0", 3) + _nlmsg(sockdiag.SOCK_DIAG_BY_FAMILY, msg, 4),
    ]
    return draw(seeded(seeds, 120)), draw(st.sampled_from([None, 3, 4]))


def check_sockdiag(case: tuple[bytes, int | None]) -> None:
    buf, seq = case
    try:
        answer = sockdiag.parse_diag_reply(buf, seq)
    except NetlinkParseError:
        return
    assert answer is None or isinstance(answer, int) or len(answer) == 3


# -- host strings and policy files ------------------------------------------------------------

_HOST_TEXTS = [
    "example.com",
    "Example.COM.",
    "0x7f.1",
    "2130706433",
    "127.1",
    "[::1]",
    "::ffff:127.0.0.1",
    "fe80::1%eth0",
    "[fe80::1%25eth0]:80",
    "bücher.de",
    "xn--bcher-kva.de",
    "a..b",
    "*.x.com",
    "http://u:p@example.com:8080/x?y",
    "https://[2001:db8::1]/",
    "example.com:443",
    "0300.0250.1.1",
    "١٢٧.0.0.1",
    "ｅｘａｍｐｌｅ.com",
    "example.com:0",
    "a" * 64 + ".com",
    "%31.2.3.4",
]


@st.composite
def host_texts(draw: st.DrawFn) -> str:
    seed = draw(st.sampled_from(_HOST_TEXTS))
    how = draw(st.sampled_from(["seed", "text", "mutate"]))
    if how == "seed":
        return seed
    if how == "text":
        return draw(st.text(st.characters(codec="utf-8"), max_size=40))
    raw = draw(mutated(st.just(seed.encode()), 3))
    return raw.decode("utf-8", "replace")


def check_hostparse(text: str) -> None:
    try:
        host = hostparse.parse_host(text)
    except hostparse.HostParseError:
        pass
    else:
        # Normal form is a fixed point: reading what it wrote gives the same host.
        again = hostparse.parse_host(
            host.name if isinstance(host, hostparse.NameHost) else str(host.address)
        )
        if isinstance(host, hostparse.NameHost):
            assert again == host, (text, host, again)
        else:
            assert isinstance(again, hostparse.IPHost) and again.address == host.address
    try:
        target = hostparse.parse_target(text)
        assert target.port is None or 1 <= target.port <= 65535
    except hostparse.HostParseError:
        pass
    with contextlib.suppress(hostparse.HostParseError):
        assert 1 <= hostparse.parse_port(text) <= 65535
    with contextlib.suppress(ValueError):  # pydantic's ValidationError is one
        load.parse_rule_text(text)


_ROOT = Path(__file__).resolve().parent.parent


@cache
def _policy_seeds() -> list[bytes]:
    paths = [
        *sorted((_ROOT / "examples").glob("*.toml")),
        _ROOT / "src/sandgate/policy/default.toml",
    ]
    return [p.read_bytes() for p in paths if p.is_file()]


_TOML_BITS = [
    b"\n[profiles.x]\n",
    b'internet = "open"\n',
    b'internet = "nope"\n',
    b"allow = [",
    b'{ domain = "*.a.com", port = 443 }',
    b'{ host = "10.0.0.1", port = [80, 443] }',
    b'{ cidr = "0.0.0.0/0" }',
    b"]\n",
    b'\n[gateway]\nguest_pool = "10.0.0.0/30"\n',
    b'deny = [{ domain = "a.com", protocol = "udp" }]\n',
    b"public_override = true\n",
    b"\xff",
    b'"\\u0000"',
    b"= = =",
    b"[[profiles]]\n",
]


@st.composite
def policies(draw: st.DrawFn) -> bytes:
    base = draw(st.sampled_from(_policy_seeds()))
    for _ in range(draw(st.integers(0, 3))):
        pos = draw(st.integers(0, len(base)))
        base = base[:pos] + draw(st.sampled_from(_TOML_BITS)) + base[pos:]
    return draw(st.one_of(st.just(base), mutated(st.just(base), 3)))


def check_policy(text: bytes) -> None:
    try:
        load.parse_policy(text, "fuzz.toml")
    except PolicyError as exc:
        assert exc.problems
        lines = text.count(b"\n") + 1
        for problem in exc.problems:
            assert problem.line is None or 1 <= problem.line <= lines, (problem, lines)
            assert problem.message


# -- the list ----------------------------------------------------------------------------------

_BASE_PACKET = nfqueue.QueuedPacket(
    queue=0,
    id=1,
    hook=2,
    hw_proto=0x0800,
    family=socket.AF_INET,
    indev=None,
    outdev=None,
    mark=0,
    ct_mark=None,
    ct_info=None,
    ct_id=None,
    uid=None,
    gid=None,
    cap_len=None,
    skb_info=0,
    timestamp=None,
    payload=b"",
    proto=6,
    src="10.0.0.2",
    dst="203.0.113.1",
    sport=40000,
    dport=443,
    tcp_seq=0,
    tcp_ack=0,
    tcp_flags=0x18,
    data_offset=0,
    data_len=0,
)

TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target(
            "sni",
            st.deferred(lambda: seeded(_hellos(), 600)),
            check_sni,
            "sni.parse_client_hello: ClientHello | NeedMore | Malformed",
        ),
        Target(
            "firstflight",
            flights(),
            check_firstflight,
            "StreamPrefix / FirstFlights: prefix of the stream, every packet released once",
        ),
        Target(
            "httphead", heads(), check_httphead, "head_end, check_head, judge_request against h11"
        ),
        Target(
            "aimed_at",
            st.one_of(heads(), st.binary(max_size=300)),
            check_aimed_at,
            "aimed_at and h11_message never raise, show only printable text",
        ),
        Target("chunked", bodies(), check_chunked, "ChunkedCheck against h11, any split"),
        Target(
            "dns_question",
            st.one_of(queries(), st.binary(max_size=80)),
            check_dns_question,
            "parse_question (fast path and dnspython) against dnspython",
        ),
        Target(
            "dns_answer",
            answers(),
            check_dns_answer,
            "judge_answer (fast path and dnspython) against dnspython",
        ),
        Target(
            "nflog",
            st.deferred(lambda: seeded(_nflog_seeds(), 200)),
            check_nflog,
            "parse_nflog: packets | NetlinkParseError",
        ),
        Target(
            "nfqueue",
            st.deferred(lambda: seeded(_nfqueue_seeds(), 200)),
            check_nfqueue,
            "parse_nfqueue: packets | NetlinkParseError",
        ),
        Target("iphead", seeded(_PAYLOADS, 80), check_iphead, "iphead.ipv4 / ipv6 on any bytes"),
        Target(
            "sockdiag",
            diag_replies(),
            check_sockdiag,
            "parse_diag_reply: answer | errno | None | NetlinkParseError",
        ),
        Target(
            "hostparse",
            host_texts(),
            check_hostparse,
            "parse_host / parse_target / parse_port / parse_rule_text; normal form is fixed",
        ),
        Target(
            "policy",
            st.deferred(policies),
            check_policy,
            "parse_policy: Policy | PolicyError with lines inside the file",
        ),
    )
}
