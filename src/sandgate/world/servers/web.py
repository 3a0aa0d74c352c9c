"""The test world's public web: many virtual hosts over HTTP and HTTPS in one process.

    python -m sandgate.world.servers.web --config web.json [--log web.jsonl] \\
        [--http ADDR:PORT ...] [--https ADDR:PORT ...] [--ca-dir DIR] [--delay-ms N]

Config (flags of the same name override it)::

    {
      "http":  ["203.0.113.10:80"],            # plain HTTP listeners (port 0: any free one)
      "https": ["203.0.113.10:443"],           # TLS listeners; need ca_dir
      "ca_dir": "/run/sg/world-ca",            # ca.pem + ca.key from sandgate.gateway.proxy.ca
      "h2": true,                              # offer HTTP/2 by ALPN on HTTPS
      "delay_ms": 0,                           # pause before every response
      "lockstep_timeout": 30,
      "vhosts": [
        {"names": ["example.com", "*.example.com", "203.0.113.10"],
         "routes": {"/": {"status": 200, "headers": {"content-type": "text/html"},
                          "body": "<h1>hi</h1>"},
                    "/big.iso": {"file": "/srv/big.iso"}},
         "builtins": true,                     # /echo /bytes /sse /status /ws /lockstep
         "pypi": "/srv/wheels",                # PEP 503 index at /simple/, files at /files/
         "git": "/srv/git"}                    # git smart HTTP for /<owner>/<repo>.git
      ]
    }

Each HTTPS vhost gets a leaf from the CA for its names (SNI picks it); a client sending
no SNI or an unknown one gets a leaf for the listen addresses only. The Host header picks
the vhost (port ignored, `*.` matches any subdomain, `*` any host: the default when no
vhosts are configured); no match gives 421. Static routes
win over built-ins, which win over pypi and git.

Built-ins: `/echo[/...]` (JSON of method, target, headers, sni, body length/sha256 and
the first 64 KiB of body), `/bytes/<n>` (n bytes, byte i = i % 256), `/sse?n=5&lockstep=1
&interval_ms=0&id=...` (events `data: {"n": k, "stream": id}`, lock-step as in
`lockstep.py`), `/status/<code>`, `/ws` (WebSocket echo, HTTP/1.1 only), `/lockstep/...`.

READY: `{"server": "web", "pid": N, "http": [...], "https": [...], "vhosts": [...]}`.
Log: `request` per request (fields of `httpio.log_request` plus `vhost`), `ws_close`,
`lockstep_ack`, `lockstep_timeout`, `git_backend` (http-backend errors).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import ipaddress
import json
import re
import ssl
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sandgate.gateway.proxy.ca import CA
from sandgate.world.servers.gitcgi import handle_git
from sandgate.world.servers.httpio import (
    Request,
    Response,
    bound_addrs,
    header_dict,
    json_response,
    start_http,
    text_response,
)
from sandgate.world.servers.lockstep import ID_HEADER, LockstepRegistry, sse_event
from sandgate.world.servers.pypi import handle_index
from sandgate.world.servers.runtime import (
    JsonLog,
    announce_ready,
    close_servers,
    format_addr,
    leaf_context,
    merged_config,
    parse_addr,
    run,
)
from sandgate.world.servers.static import file_response, pattern_response
from sandgate.world.servers.websocket import handshake

__all__ = ["Route", "VHost", "WebConfig", "WebServer", "main"]

ECHO_BODY_KEEP = 64 * 1024


class Route(BaseModel):
    model_config = ConfigDict(extra="forbid")
    status: int = 200
    headers: dict[str, str] = {}
    body: str = ""
    file: str | None = None


class VHost(BaseModel):
    model_config = ConfigDict(extra="forbid")
    names: list[str] = Field(min_length=1)
    routes: dict[str, Route] = {}
    builtins: bool = True
    pypi: str | None = None
    git: str | None = None

    def matches(self, host: str) -> bool:
        host = host.rstrip(".").lower()
        for raw in self.names:
            name = raw.lower()
            if name in ("*", host) or (name.startswith("*.") and host.endswith(name[1:])):
                return True
        return False


class WebConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    http: list[str] = []
    https: list[str] = []
    ca_dir: str | None = None
    h2: bool = True
    delay_ms: float = 0.0
    lockstep_timeout: float = 30.0
    vhosts: list[VHost] = [VHost(names=["*"])]  # without a config: one catch-all vhost
    log: str | None = None


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class WebServer:
    def __init__(self, config: WebConfig, log: JsonLog) -> None:
        self.config = config
        self.log = log
        self.lockstep = LockstepRegistry(log, config.lockstep_timeout)

    def vhost_for(self, host: str) -> VHost | None:
        return next((v for v in self.config.vhosts if v.matches(host)), None)

    async def handle(self, req: Request) -> Response:
        vhost = self.vhost_for(req.host)
        if vhost is None:
            misdirected = text_response(421, f"no virtual host {req.host!r} here\n")
            misdirected.log["vhost"] = None
            return misdirected
        resp = self.lockstep.handle(req)
        if resp is None:
            if self.config.delay_ms:
                await asyncio.sleep(self.config.delay_ms / 1000)
            resp = await self._route(req, vhost)
        resp.log["vhost"] = vhost.names[0]
        return resp

    async def _route(self, req: Request, vhost: VHost) -> Response:
        route = vhost.routes.get(req.path)
        if route is not None:
            headers = {k.lower(): v for k, v in route.headers.items()}
            if route.file is not None:
                return file_response(Path(route.file), headers.pop("content-type", None),
                                     route.status, headers)  # fmt: skip
            headers.setdefault("content-type", "text/plain; charset=utf-8")
            return Response(route.status, list(headers.items()), route.body.encode())
        if vhost.builtins and (resp := await self._builtin(req)) is not None:
            return resp
        if vhost.pypi is not None and (resp := await handle_index(req, Path(vhost.pypi))):
            return resp
        if vhost.git is not None and (resp := await handle_git(req, Path(vhost.git), self.log)):
            return resp
        return text_response(404, f"no route for {req.path}\n")

    async def _builtin(self, req: Request) -> Response | None:
        path = req.path
        if path == "/echo" or path.startswith("/echo/"):
            return await self._echo(req)
        if m := re.fullmatch(r"/bytes/(\d{1,15})", path):
            return pattern_response(int(m.group(1)))
        if m := re.fullmatch(r"/status/(\d{3})", path):
            code = int(m.group(1))
            if not 200 <= code <= 599:
                return text_response(400, "status must be 200..599\n")
            no_body = code in (204, 304)
            return Response(code, [] if no_body else [("content-type", "text/plain")],
                            b"" if no_body else f"{code}\n".encode())  # fmt: skip
        if path == "/sse":
            return self._sse(req)
        if path == "/ws":
            return handshake(req, self.log)
        return None

    async def _echo(self, req: Request) -> Response:
        digest, size, kept = hashlib.sha256(), 0, bytearray()
        async for chunk in req.chunks():
            digest.update(chunk)
            size += len(chunk)
            if len(kept) < ECHO_BODY_KEEP:
                kept += chunk[: ECHO_BODY_KEEP - len(kept)]
        payload: dict[str, Any] = {
            "method": req.method,
            "target": req.target,
            "path": req.path,
            "query": req.query,
            "http_version": req.http_version,
            "scheme": req.conn.scheme,
            "host": req.host,
            "sni": req.conn.sni,
            "alpn": req.conn.alpn,
            "client": format_addr(req.conn.peer),
            "headers": header_dict(req.headers),
            "header_list": [[k, v] for k, v in req.headers],
            "body_length": size,
            "body_sha256": digest.hexdigest(),
            "body": bytes(kept).decode("utf-8", errors="replace"),
        }
        return json_response(200, payload)

    def _sse(self, req: Request) -> Response:
        query = req.query
        try:
            count = int(query.get("n", "5"))
            interval = float(query.get("interval_ms", "0")) / 1000
        except ValueError:
            return text_response(400, "n and interval_ms must be numbers\n")
        stream = self.lockstep.open(req) if query.get("lockstep") == "1" else None
        sid = stream.id if stream is not None else None
        events = [
            sse_event(json.dumps({"n": k, "stream": sid}), event_id=str(k)) for k in range(count)
        ]
        headers = [("content-type", "text/event-stream"), ("cache-control", "no-cache")]
        if sid is not None:
            headers.append((ID_HEADER, sid))
        resp = Response(200, headers, self.lockstep.events(stream, events, interval))
        resp.log["lockstep_id"] = sid
        return resp


def tls_context(config: WebConfig, listen_ips: list[str]) -> ssl.SSLContext:
    """The default context (listen-IP leaf) whose SNI callback switches to a vhost's leaf."""
    if config.ca_dir is None:
        raise ValueError("https listeners need ca_dir")
    ca = CA.load(config.ca_dir)
    alpn = ["h2", "http/1.1"] if config.h2 else ["http/1.1"]
    ip_names = [n for v in config.vhosts for n in v.names if _is_ip(n)]
    default = leaf_context(ca, [], list(dict.fromkeys(listen_ips + ip_names)), alpn)
    per_vhost = []
    for vhost in config.vhosts:
        dns = [n for n in vhost.names if not _is_ip(n) and n != "*"]
        ips = [n for n in vhost.names if _is_ip(n)]
        if dns:
            per_vhost.append((vhost, leaf_context(ca, dns, ips, alpn)))

    def on_sni(sslobj: ssl.SSLObject, server_name: str | None, _ctx: ssl.SSLContext) -> None:
        # remembered for logs and /echo: what the client asked for, not what we matched
        sslobj.sg_sni = server_name  # type: ignore[attr-defined]
        if server_name is None:
            return
        for vhost, ctx in per_vhost:
            if vhost.matches(server_name):
                sslobj.context = ctx
                return

    default.sni_callback = on_sni
    return default


def parse_args(argv: list[str] | None = None) -> WebConfig:
    p = argparse.ArgumentParser(prog="python -m sandgate.world.servers.web")
    p.add_argument("--config", help="JSON config (see module docstring)")
    p.add_argument("--http", action="append", help="ADDR:PORT for plain HTTP, repeatable")
    p.add_argument("--https", action="append", help="ADDR:PORT for HTTPS, repeatable")
    p.add_argument("--ca-dir", help="directory with ca.pem and ca.key")
    p.add_argument("--delay-ms", type=float, help="pause before every response")
    p.add_argument("--log", help="JSON-lines log file")
    config = WebConfig.model_validate(merged_config(p.parse_args(argv)))
    if not config.http and not config.https:
        p.error("give at least one --http or --https address")
    return config


async def serve(config: WebConfig, stop: asyncio.Event) -> None:
    log = JsonLog(config.log, "web")
    web = WebServer(config, log)
    http_addrs = [parse_addr(a, 80) for a in config.http]
    https_addrs = [parse_addr(a, 443) for a in config.https]
    servers = await start_http(http_addrs, web.handle, log)
    tls_servers: list[asyncio.Server] = []
    if https_addrs:
        ctx = tls_context(config, [host for host, _ in https_addrs])
        tls_servers = await start_http(https_addrs, web.handle, log, ctx)
    info = {
        "http": bound_addrs(servers),
        "https": bound_addrs(tls_servers),
        "vhosts": [v.names[0] for v in config.vhosts],
    }
    log.write("ready", **info)
    announce_ready("web", **info)
    await stop.wait()
    await close_servers(servers + tls_servers)
    log.close()


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    return run(lambda stop: serve(config, stop))


if __name__ == "__main__":
    raise SystemExit(main())
