"""Authoritative answers for the test world's zones: `answer(zones, query) -> response`.

Pure: dnspython messages in, dnspython messages out, no sockets. Zone config::

    {"origin": "example.test", "ttl": 300, "wildcard": false,
     "records": [{"name": "@",   "type": "A",     "value": "203.0.113.10", "ttl": 60},
                 {"name": "www", "type": "CNAME", "value": "@"},
                 {"name": "txt", "type": "TXT",   "value": "any text, split at 255 bytes"},
                 {"name": "*.wild", "type": "A",  "value": "203.0.113.11"}]}

Names are relative to the origin unless they end in a dot; values use zone-file syntax
(except TXT, taken verbatim). SOA and NS at the apex are made up when not given.
`wildcard: true` makes every name in the zone exist, answering with copies of the apex
A/AAAA/TXT records (NODATA for other types): exfiltration tests need lookups to succeed.

Rules: names outside every zone get REFUSED; unknown names NXDOMAIN with the SOA in the
authority section; known names without the type NOERROR/NODATA with the SOA; CNAMEs
are followed inside our zones; `*` records match names with no records of their own
(a simplification of RFC 4592: any missing name below the `*`'s parent matches).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import dns.flags
import dns.message
import dns.name
import dns.opcode
import dns.rcode
import dns.rdata
import dns.rdataclass
import dns.rdatatype
import dns.rdtypes.ANY.TXT
import dns.rrset
from pydantic import BaseModel, ConfigDict

__all__ = ["RecordSpec", "Zone", "ZoneSpec", "answer", "build_zones"]

_IN = dns.rdataclass.IN
_MAX_CHASE = 8


class RecordSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = "@"
    type: str
    value: str
    ttl: int | None = None


class ZoneSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    origin: str
    ttl: int = 300
    wildcard: bool = False
    records: list[RecordSpec] = []


@dataclass
class Zone:
    origin: dns.name.Name
    rrsets: dict[tuple[dns.name.Name, int], dns.rrset.RRset] = field(default_factory=dict)
    names: set[dns.name.Name] = field(default_factory=set)  # owners plus empty non-terminals

    def add(
        self, name: dns.name.Name, rdtype: dns.rdatatype.RdataType, ttl: int, rdata: dns.rdata.Rdata
    ) -> None:
        key = (name, rdtype)
        if key not in self.rrsets:
            self.rrsets[key] = dns.rrset.RRset(name, _IN, rdtype)
        self.rrsets[key].add(rdata, ttl)
        while name != self.origin and name.is_subdomain(self.origin):
            self.names.add(name)
            name = name.parent()
        self.names.add(self.origin)

    def soa(self) -> dns.rrset.RRset:
        return self.rrsets[(self.origin, dns.rdatatype.SOA)]


def _rdata(rdtype: dns.rdatatype.RdataType, value: str, origin: dns.name.Name) -> dns.rdata.Rdata:
    if rdtype == dns.rdatatype.TXT:
        raw = value.encode()
        chunks = [raw[i : i + 255] for i in range(0, len(raw), 255)] or [b""]
        return dns.rdtypes.ANY.TXT.TXT(_IN, dns.rdatatype.TXT, chunks)
    return dns.rdata.from_text(_IN, rdtype, value, origin=origin, relativize=False)


def build_zone(spec: ZoneSpec) -> Zone:
    origin = dns.name.from_text(spec.origin)
    zone = Zone(origin)
    for rec in spec.records:
        name = origin if rec.name == "@" else dns.name.from_text(rec.name, origin=origin)
        if not name.is_subdomain(origin):
            raise ValueError(f"{rec.name} is outside the zone {spec.origin}")
        rdtype = dns.rdatatype.from_text(rec.type.upper())
        zone.add(name, rdtype, rec.ttl or spec.ttl, _rdata(rdtype, rec.value, origin))
    if (origin, dns.rdatatype.SOA) not in zone.rrsets:
        soa = f"ns1 hostmaster 1 3600 600 86400 {min(spec.ttl, 60)}"
        zone.add(origin, dns.rdatatype.SOA, spec.ttl, _rdata(dns.rdatatype.SOA, soa, origin))
    if (origin, dns.rdatatype.NS) not in zone.rrsets:
        zone.add(origin, dns.rdatatype.NS, spec.ttl, _rdata(dns.rdatatype.NS, "ns1", origin))
    star = dns.name.from_text("*", origin=origin)
    if spec.wildcard and not any(name == star for name, _ in zone.rrsets):
        zone.names.add(star)  # every name exists, even where the apex has nothing to copy
        for rdtype in (dns.rdatatype.A, dns.rdatatype.AAAA, dns.rdatatype.TXT):
            apex = zone.rrsets.get((origin, rdtype))
            for rd in apex or ():
                zone.add(star, rdtype, apex.ttl if apex else spec.ttl, rd)
    return zone


def build_zones(specs: list[ZoneSpec]) -> list[Zone]:
    # longest origin first, so a delegated child zone wins over its parent
    return sorted((build_zone(s) for s in specs), key=lambda z: -len(z.origin))


def _zone_for(zones: list[Zone], name: dns.name.Name) -> Zone | None:
    return next((z for z in zones if name.is_subdomain(z.origin)), None)


def _lookup(zone: Zone, name: dns.name.Name) -> dns.name.Name | None:
    """The owner whose records answer `name`: itself, a matching `*`, or None (NXDOMAIN)."""
    if name in zone.names:
        return name
    ancestor = name.parent()
    while ancestor.is_subdomain(zone.origin):
        star = dns.name.Name((b"*", *ancestor.labels))
        if star in zone.names:
            return star
        if ancestor == zone.origin:
            break
        ancestor = ancestor.parent()
    return None


def _copy(rrset: dns.rrset.RRset, owner: dns.name.Name) -> dns.rrset.RRset:
    # a wildcard answer carries the asked name as its owner (RFC 4592 synthesis)
    out = dns.rrset.RRset(owner, rrset.rdclass, rrset.rdtype)
    for rd in rrset:
        out.add(rd, rrset.ttl)
    return out


def answer(zones: list[Zone], query: dns.message.Message) -> dns.message.Message:
    """The authoritative response to `query` (its first and only question)."""
    response = dns.message.make_response(query)
    response.flags &= ~dns.flags.RA
    if query.opcode() != dns.opcode.QUERY:
        response.set_rcode(dns.rcode.NOTIMP)
        return response
    if len(query.question) != 1:
        response.set_rcode(dns.rcode.FORMERR)
        return response
    question = query.question[0]
    name, rdtype = question.name, question.rdtype
    zone = _zone_for(zones, name)
    if zone is None or question.rdclass != _IN:
        response.set_rcode(dns.rcode.REFUSED)
        return response
    response.flags |= dns.flags.AA
    for _ in range(_MAX_CHASE):
        owner = _lookup(zone, name)
        if owner is None:
            response.set_rcode(dns.rcode.NXDOMAIN)
            response.authority.append(zone.soa())
            return response
        cname = zone.rrsets.get((owner, dns.rdatatype.CNAME))
        if cname is not None and rdtype not in (dns.rdatatype.CNAME, dns.rdatatype.ANY):
            response.answer.append(_copy(cname, name))
            target: dns.name.Name = cname[0].target
            next_zone = _zone_for(zones, target)
            if next_zone is None:
                return response  # the resolver follows it outside our zones
            zone, name = next_zone, target
            continue
        found = [
            _copy(rrset, name)
            for (rr_owner, rr_type), rrset in zone.rrsets.items()
            if rr_owner == owner and rdtype in (rr_type, dns.rdatatype.ANY)
        ]
        if found:
            response.answer.extend(found)
        else:
            response.authority.append(zone.soa())
        return response
    response.set_rcode(dns.rcode.SERVFAIL)  # a CNAME loop inside our own zones
    return response
