"""Tripwire listeners for the NAS and friends: did a forbidden connection get through?

    python -m sandgate.world.servers.listen --bind 10.77.0.20 --tcp 22 --tcp 445 \\
        --tcp 2049 --udp 2049 [--tcp 'PORT=BANNER'] [--read-ms 200] [--log nas.jsonl]

`--config FILE.json` takes the same keys: `{"bind": ["10.77.0.20"], "tcp": ["22",
"8022=hello\\r\\n"], "udp": ["137"], "read_ms": 200}`. A TCP port may carry a banner
after `=` (backslash escapes such as `\\r\\n` are decoded); without one, well-known ports
get theirs (22: `SSH-2.0-sg-nas\\r\\n`, 21/25: a 220 line) and others send nothing.
Port 0 picks a free port.

TCP: on accept log `connect`, send the banner, read what the client sends for
`read_ms`, log `closed` (with `received` byte count and the first 64 bytes in `head`
as hex), close. UDP: log `datagram` and echo it back.

READY: `{"server": "listen", "pid": N, "tcp": ["10.77.0.20:22", ...], "udp": [...]}`.
Log fields: `proto`, `src` and `dst` as "ip:port", `port` (the local port).
"""

from __future__ import annotations

import argparse
import asyncio
import codecs
from typing import Any, cast

from pydantic import BaseModel, ConfigDict, Field

from sandgate.world.servers.runtime import (
    JsonLog,
    announce_ready,
    close_servers,
    format_addr,
    merged_config,
    parse_addr,
    run,
)

__all__ = ["DEFAULT_BANNERS", "ListenConfig", "main", "parse_port_spec"]

DEFAULT_BANNERS = {
    21: b"220 sg-nas FTP ready\r\n",
    22: b"SSH-2.0-sg-nas\r\n",
    25: b"220 sg-nas ESMTP\r\n",
}
HEAD = 64


class ListenConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    bind: list[str] = Field(min_length=1)
    tcp: list[str] = []
    udp: list[str] = []
    read_ms: float = 200.0
    log: str | None = None


def parse_port_spec(spec: str) -> tuple[int, bytes]:
    """`"22"` -> (22, default banner); `"8022=hi\\r\\n"` -> (8022, b"hi\\r\\n")."""
    port_text, sep, banner = spec.partition("=")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ValueError(f"port out of range: {port}")
    if not sep:
        return port, DEFAULT_BANNERS.get(port, b"")
    return port, codecs.decode(banner, "unicode_escape").encode("latin-1")


def _addr(info: Any) -> str:
    return format_addr((info[0], info[1])) if info else "?"


class _Udp(asyncio.DatagramProtocol):
    def __init__(self, log: JsonLog) -> None:
        self.log = log
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's UDP transport does not subclass asyncio.DatagramTransport
        self.transport = cast("asyncio.DatagramTransport", transport)

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        assert self.transport is not None
        local = self.transport.get_extra_info("sockname")
        self.log.write(
            "datagram",
            proto="udp",
            src=_addr(addr),
            dst=_addr(local),
            port=local[1],
            size=len(data),
            head=data[:HEAD].hex(),
        )
        self.transport.sendto(data, addr)


def _tcp_handler(log: JsonLog, banner: bytes, read_s: float) -> Any:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer, local = writer.get_extra_info("peername"), writer.get_extra_info("sockname")
        fields = {"proto": "tcp", "src": _addr(peer), "dst": _addr(local), "port": local[1]}
        log.write("connect", **fields)
        received = bytearray()
        try:
            if banner:
                writer.write(banner)
                await writer.drain()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + read_s
            while (remaining := deadline - loop.time()) > 0:
                try:
                    chunk = await asyncio.wait_for(reader.read(4096), remaining)
                except TimeoutError:
                    break
                if not chunk:
                    break
                received += chunk
        except ConnectionError:
            pass
        finally:
            log.write("closed", **fields, received=len(received), head=bytes(received[:HEAD]).hex())
            writer.close()

    return handle


async def serve(config: ListenConfig, stop: asyncio.Event) -> None:
    log = JsonLog(config.log, "listen")
    loop = asyncio.get_running_loop()
    tcp_specs = [parse_port_spec(s) for s in config.tcp]
    udp_ports = [parse_port_spec(s)[0] for s in config.udp]
    servers: list[asyncio.Server] = []
    udp: list[asyncio.DatagramTransport] = []
    tcp_bound: list[str] = []
    udp_bound: list[str] = []
    for bind in config.bind:
        host, _ = parse_addr(bind, 0)
        for port, banner in tcp_specs:
            handler = _tcp_handler(log, banner, config.read_ms / 1000)
            server = await asyncio.start_server(handler, host, port, reuse_address=True)
            servers.append(server)
            tcp_bound += [format_addr(s.getsockname()) for s in server.sockets]
        for port in udp_ports:
            transport, _ = await loop.create_datagram_endpoint(
                lambda: _Udp(log), local_addr=(host, port)
            )
            udp.append(transport)
            udp_bound.append(format_addr(transport.get_extra_info("sockname")))
    log.write("ready", tcp=tcp_bound, udp=udp_bound)
    announce_ready("listen", tcp=tcp_bound, udp=udp_bound)
    await stop.wait()
    for transport in udp:
        transport.close()
    await close_servers(servers)
    log.close()


def parse_args(argv: list[str] | None = None) -> ListenConfig:
    p = argparse.ArgumentParser(prog="python -m sandgate.world.servers.listen")
    p.add_argument("--config", help="JSON config with the keys below")
    p.add_argument("--bind", action="append", help="address to listen on, repeatable")
    p.add_argument("--tcp", action="append", help="PORT or PORT=BANNER, repeatable")
    p.add_argument("--udp", action="append", help="PORT, repeatable")
    p.add_argument("--read-ms", type=float, help="how long to read from a TCP client")
    p.add_argument("--log", help="JSON-lines log file")
    config = ListenConfig.model_validate(merged_config(p.parse_args(argv)))
    if not config.tcp and not config.udp:
        p.error("give at least one --tcp or --udp port")
    return config


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    return run(lambda stop: serve(config, stop))


if __name__ == "__main__":
    raise SystemExit(main())
