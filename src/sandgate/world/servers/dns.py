"""The test world's authoritative DNS server: UDP and TCP, optionally DoT and DoH.

    python -m sandgate.world.servers.dns --config dns.json [--log dns.jsonl] \\
        [--listen ADDR[:PORT] ...] [--dot ADDR[:PORT] ...] [--doh ADDR[:PORT] ...] \\
        [--ca-dir DIR] [--wildcard ORIGIN ...]

Config (flags of the same name override or, for `--wildcard`, amend it)::

    {"listen": ["198.51.100.53:53"],       # UDP and TCP on the same address and port
     "dot": ["198.51.100.53:853"],         # DNS over TLS (RFC 7858)
     "doh": ["198.51.100.53:443"],         # DNS over HTTPS at /dns-query (RFC 8484)
     "ca_dir": "/run/sg/world-ca",         # for DoT/DoH leaves
     "tls_names": ["dns.example.test"],    # leaf names besides the listen IPs
     "zones": [ZoneSpec, ...]}             # see dnszone.py

Port 0 picks a free port (the same one for UDP and TCP). READY:
`{"server": "dns", "pid": N, "listen": [...], "dot": [...], "doh": [...], "zones": [...]}`.

Every question is logged, whatever becomes of it, as `{"event": "query", "transport":
"udp"|"tcp"|"dot"|"doh", "src": "ip:port", "qname", "qtype", "qclass", "id", "rcode",
"answers", "edns", "truncated", "size"}`; undecodable packets as `malformed`. UDP
answers are cut to 512 bytes (or the EDNS payload size) with TC set, so the client
retries over TCP.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import ssl
from typing import Any, cast

import dns.exception
import dns.flags
import dns.message
import dns.rcode
import dns.rdataclass
import dns.rdatatype
from pydantic import BaseModel, ConfigDict

from sandgate.gateway.proxy.ca import CA
from sandgate.world.servers.dnszone import Zone, ZoneSpec, answer, build_zones
from sandgate.world.servers.httpio import Request, Response, bound_addrs, start_http, text_response
from sandgate.world.servers.runtime import (
    Addr,
    JsonLog,
    announce_ready,
    close_servers,
    format_addr,
    leaf_context,
    merged_config,
    parse_addr,
    run,
)

__all__ = ["DnsConfig", "Resolver", "main"]

UDP_MAX = 4096  # largest EDNS payload we honour
IDLE_TIMEOUT = 30.0


class DnsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    listen: list[str] = []
    dot: list[str] = []
    doh: list[str] = []
    ca_dir: str | None = None
    tls_names: list[str] = []
    zones: list[ZoneSpec] = []
    wildcard: list[str] = []
    log: str | None = None

    def zone_specs(self) -> list[ZoneSpec]:
        wanted = {w.rstrip(".").lower() for w in self.wildcard}
        specs = [
            z.model_copy(update={"wildcard": True}) if z.origin.rstrip(".").lower() in wanted else z
            for z in self.zones
        ]
        known = {z.origin.rstrip(".").lower() for z in specs}
        specs += [ZoneSpec(origin=w, wildcard=True) for w in sorted(wanted - known)]
        return specs


class Resolver:
    """Wire bytes in, wire bytes out, with one log line per question."""

    def __init__(self, zones: list[Zone], log: JsonLog) -> None:
        self.zones = zones
        self.log = log

    def respond(self, wire: bytes, src: Addr, transport: str) -> bytes | None:
        try:
            query = dns.message.from_wire(wire)
        except (dns.exception.DNSException, ValueError) as exc:
            self.log.write(
                "malformed",
                transport=transport,
                src=format_addr(src),
                size=len(wire),
                error=repr(exc),
                head=wire[:64].hex(),
            )
            return None
        response = answer(self.zones, query)
        if transport == "udp":
            limit = max(512, min(query.payload, UDP_MAX)) if query.edns >= 0 else 512
            out = response.to_wire(max_size=limit, prefer_truncation=True)
        else:
            out = response.to_wire(max_size=65535)
        truncated = transport == "udp" and bool(dns.message.from_wire(out).flags & dns.flags.TC)
        questions: list[tuple[str | None, str | None, str | None]] = [
            (q.name.to_text(), dns.rdatatype.to_text(q.rdtype), dns.rdataclass.to_text(q.rdclass))
            for q in query.question
        ]
        for qname, qtype, qclass in questions or [(None, None, None)]:
            self.log.write(
                "query",
                transport=transport,
                src=format_addr(src),
                qname=qname,
                qtype=qtype,
                qclass=qclass,
                id=query.id,
                rcode=dns.rcode.to_text(response.rcode()),
                answers=sum(len(rrset) for rrset in response.answer),
                edns=query.edns >= 0,
                truncated=truncated,
                size=len(out),
            )
        return out


class _Udp(asyncio.DatagramProtocol):
    def __init__(self, resolver: Resolver) -> None:
        self.resolver = resolver
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's UDP transport does not subclass asyncio.DatagramTransport
        self.transport = cast("asyncio.DatagramTransport", transport)

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        out = self.resolver.respond(data, (addr[0], addr[1]), "udp")
        if out is not None and self.transport is not None:
            self.transport.sendto(out, addr)


async def _stream_session(
    resolver: Resolver, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, transport: str
) -> None:
    peer = writer.get_extra_info("peername")
    try:
        while True:
            # RFC 1035 4.2.2 / RFC 7766: each message prefixed by a two-byte length
            size = int.from_bytes(await asyncio.wait_for(reader.readexactly(2), IDLE_TIMEOUT))
            wire = await asyncio.wait_for(reader.readexactly(size), IDLE_TIMEOUT)
            out = resolver.respond(wire, (peer[0], peer[1]), transport)
            if out is None:
                break
            writer.write(len(out).to_bytes(2, "big") + out)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, TimeoutError, ssl.SSLError):
        pass
    finally:
        writer.close()


def _doh_handler(resolver: Resolver) -> Any:
    async def handle(req: Request) -> Response:
        if req.path != "/dns-query":
            return text_response(404, "only /dns-query here\n")
        if req.method == "GET":
            param = req.query.get("dns", "")
            try:
                wire = base64.urlsafe_b64decode(param + "=" * (-len(param) % 4))
            except (binascii.Error, ValueError):
                return text_response(400, "dns= is not base64url\n")
        elif req.method == "POST":
            if (req.header("content-type") or "").split(";")[
                0
            ].strip() != "application/dns-message":
                return text_response(415, "use application/dns-message\n")
            wire = await req.body(limit=65535)
        else:
            return text_response(405, "GET or POST\n")
        out = resolver.respond(wire, req.conn.peer, "doh")
        if out is None:
            return text_response(400, "malformed DNS message\n")
        headers = [("content-type", "application/dns-message"), ("cache-control", "max-age=0")]
        return Response(200, headers, out)

    return handle


async def _bind_udp_tcp(
    resolver: Resolver, addr: Addr
) -> tuple[asyncio.DatagramTransport, asyncio.Server]:
    """UDP and TCP on one address; for port 0, a port free for both."""
    loop = asyncio.get_running_loop()
    last: OSError | None = None
    for _ in range(20):
        transport, _proto = await loop.create_datagram_endpoint(
            lambda: _Udp(resolver), local_addr=addr
        )
        port = transport.get_extra_info("sockname")[1]
        try:
            server = await asyncio.start_server(
                lambda r, w: _stream_session(resolver, r, w, "tcp"),
                addr[0],
                port,
                reuse_address=True,
            )
        except OSError as exc:  # someone holds that TCP port; try another UDP one
            transport.close()
            last = exc
            if addr[1] != 0:
                raise
            continue
        return transport, server
    raise last or OSError("no port free for both UDP and TCP")


async def serve(config: DnsConfig, stop: asyncio.Event) -> None:
    log = JsonLog(config.log, "dns")
    zone_specs = config.zone_specs()
    resolver = Resolver(build_zones(zone_specs), log)
    udp: list[asyncio.DatagramTransport] = []
    servers: list[asyncio.Server] = []
    for text in config.listen:
        transport, server = await _bind_udp_tcp(resolver, parse_addr(text, 53))
        udp.append(transport)
        servers.append(server)
    listen = bound_addrs(servers)
    dot_servers: list[asyncio.Server] = []
    doh_servers: list[asyncio.Server] = []
    if config.dot or config.doh:
        if config.ca_dir is None:
            raise SystemExit("DoT/DoH need --ca-dir")
        ca = CA.load(config.ca_dir)
        dot_addrs = [parse_addr(a, 853) for a in config.dot]
        doh_addrs = [parse_addr(a, 443) for a in config.doh]
        ips = list(dict.fromkeys(h for h, _ in dot_addrs + doh_addrs))
        for host, port in dot_addrs:
            ctx = leaf_context(ca, config.tls_names, ips, alpn=["dot"])
            dot_servers.append(
                await asyncio.start_server(
                    lambda r, w: _stream_session(resolver, r, w, "dot"), host, port, ssl=ctx
                )
            )
        if doh_addrs:
            ctx = leaf_context(ca, config.tls_names, ips, alpn=["h2", "http/1.1"])
            doh_servers = await start_http(doh_addrs, _doh_handler(resolver), log, ctx)
    info = {
        "listen": listen,
        "dot": bound_addrs(dot_servers),
        "doh": bound_addrs(doh_servers),
        "zones": [z.origin for z in zone_specs],
    }
    log.write("ready", **info)
    announce_ready("dns", **info)
    await stop.wait()
    for transport in udp:
        transport.close()
    await close_servers(servers + dot_servers + doh_servers)
    log.close()


def parse_args(argv: list[str] | None = None) -> DnsConfig:
    p = argparse.ArgumentParser(prog="python -m sandgate.world.servers.dns")
    p.add_argument("--config", help="JSON config (see module docstring)")
    p.add_argument("--listen", action="append", help="ADDR[:PORT] for UDP+TCP (53)")
    p.add_argument("--dot", action="append", help="ADDR[:PORT] for DNS over TLS (853)")
    p.add_argument("--doh", action="append", help="ADDR[:PORT] for DNS over HTTPS (443)")
    p.add_argument("--ca-dir", help="directory with ca.pem and ca.key")
    p.add_argument("--wildcard", action="append", help="zone origin answering every name")
    p.add_argument("--log", help="JSON-lines log file")
    args = p.parse_args(argv)
    merged = merged_config(args)
    if args.wildcard:  # amends the file's list instead of replacing it
        file_wild = merged_config(argparse.Namespace(config=args.config)).get("wildcard", [])
        merged["wildcard"] = [*file_wild, *args.wildcard]
    config = DnsConfig.model_validate(merged)
    if not (config.listen or config.dot or config.doh):
        p.error("give at least one --listen, --dot or --doh address")
    return config


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    return run(lambda stop: serve(config, stop))


if __name__ == "__main__":
    raise SystemExit(main())
