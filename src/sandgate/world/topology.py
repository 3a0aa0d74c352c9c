"""The test world: a LAN and an "internet" made of namespaces of our own.

    [gateway ns] up0 ── gw0 ┐
                            br0 10.77.0.1/24  [sg-I-lan: router]  wan0 ── lan0  [sg-I-wan]
    [sg-I-model] eth0 ──────┤  10.77.0.10:8000 model server            203.0.113.x, 198.51.100.x
    [sg-I-nas]   eth0 ──────┘  10.77.0.20: 22, 445, 2049 (tripwires)   web, DNS (+DoT, DoH)

Nothing here has a link to the host or the real network: the only way out of the world is
into the gateway. The public addresses are documentation ranges, which sandgate rightly treats
as special; the world declares them public through ``public_override``, a setting only the
world can make (policy/load.py refuses it in files).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import secrets
import shutil
import socket
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandgate.net import ns
from sandgate.net.links import Uplink
from sandgate.world.info import WorldInfo
from sandgate.world.servers.launch import Running, start

if TYPE_CHECKING:
    from sandgate.gateway.proxy.ca import CA

LAN = ipaddress.IPv4Network("10.77.0.0/24")
ROUTER = "10.77.0.1"
GATEWAY_UPLINK = "10.77.0.2/24"
MODEL = "10.77.0.10"
MODEL_PORT = 8000
LLM_PORT = 8001  # llama.cpp on the model namespace's loopback, behind the relay
NAS = "10.77.0.20"
NAS_TCP = (22, 139, 445, 2049, 111)
NAS_UDP = (2049, 137)
TRANSIT = ("10.77.255.1/30", "10.77.255.2/30")
PUBLIC = ("203.0.113.0/24", "198.51.100.0/24")
RESOLVER = "198.51.100.53"
PUBLIC_IP = "198.51.100.10"  # a "hardcoded public IP" with a web server on it
PROBE_HOST = "198.51.100.123"  # UDP echo on 123 (NTP) and 443 (QUIC): did a datagram get out?
MODEL_TRIPWIRES = (22, 11434)  # the model server's other ports, listening, so a leak shows
OPENAI = "203.0.113.50"  # api.openai.com: a model server that requires the world's API key

# IPv6 (issue 14 part 5), for a world made with ``ipv6=True``: the LAN, the transit and the
# "internet" get addresses in the documentation prefix 2001:db8::/32, which the world declares
# public (``public_override``) as it does its IPv4 ranges; some names get AAAA records, one
# (v6only.example.net) only that.
ROUTER6 = "2001:db8:77::1"
GATEWAY_UPLINK6 = "2001:db8:77::2/64"
TRANSIT6 = ("2001:db8:77:ff::1/64", "2001:db8:77:ff::2/64")
PUBLIC6 = ("2001:db8::/32",)
V6_ONLY = "v6only.example.net"
HOSTS6: dict[str, str] = {
    "example.com": "2001:db8:203::10",
    "www.example.com": "2001:db8:203::10",
    "pypi.org": "2001:db8:203::20",
    "github.com": "2001:db8:203::30",
    "evil.example": "2001:db8:203::40",
    V6_ONLY: "2001:db8:203::66",
}

# name -> address of the "public" hosts. Enough for report 000's tasks and the probes.
HOSTS: dict[str, str] = {
    "example.com": "203.0.113.10",
    "www.example.com": "203.0.113.10",
    "pypi.org": "203.0.113.20",
    "files.pythonhosted.org": "203.0.113.21",
    "github.com": "203.0.113.30",
    "api.github.com": "203.0.113.31",
    "raw.githubusercontent.com": "203.0.113.32",
    "codeload.github.com": "203.0.113.30",
    "gist.github.com": "203.0.113.33",
    "evil.example": "203.0.113.40",
    "exfil.evil.example": "203.0.113.40",
    "api.openai.com": OPENAI,
    "wttr.in": "203.0.113.60",
    "api.open-meteo.com": "203.0.113.61",
    "llmbits.com": "203.0.113.70",
    "ollama.com": "203.0.113.71",
    "deb.debian.org": "203.0.113.80",
    "security.debian.org": "203.0.113.80",
    "dns.example.net": RESOLVER,
    "public.example.net": PUBLIC_IP,
}
# Names that resolve into special-purpose space: DNS rebinding bait.
REBIND: dict[str, str] = {
    "rebind.example": NAS,
    "metadata.example": "169.254.169.254",
    "loopback.example": "127.0.0.1",
    "models.example": MODEL,
}
WILDCARD_ZONES = ("exfil.evil.example",)
# Aliases that must not reach a guest (tests/kernel/test_resolver_leaks.py): to special-use
# names, to themselves, and a chain back to where it began.
CNAMES: dict[str, str] = {
    "cname-localhost.example.com": "localhost.",
    "cname-metadata.example.com": "metadata.google.internal.",
    "cname-self.example.com": "cname-self.example.com.",
    "cname-loop-a.example.com": "cname-loop-b.example.com.",
    "cname-loop-b.example.com": "cname-loop-a.example.com.",
}


def resolve_name(name: str) -> list[str]:
    """What the test world's DNS server answers for ``name`` (A records), without asking it:
    ``sandgate explain --world test`` judges what a test-world run would see."""
    name = name.rstrip(".").lower()
    table = {**HOSTS, **REBIND}
    if name in table:
        return [table[name]]
    zone = next((z for z in WILDCARD_ZONES if name.endswith("." + z)), None)
    return [HOSTS[zone]] if zone is not None else []


@dataclass
class TestWorld:
    instance: str
    base: Path | None = None
    servers: list[Running] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)
    info: WorldInfo | None = None
    api_key: str = ""
    on_start: Callable[[int], None] | None = None  # told each server's pid as it starts
    # The model servers' scripted turns (agents.frameworks.world_script(), given by whoever
    # builds the world: the test world imports no agents); None: every chat is echoed.
    model_script: dict[str, Any] | None = None
    # The LAN model server: None, the scripted one; a world/llm.py model name ("smollm2"),
    # llama.cpp serving that model behind a metering relay (world/servers/llmrelay.py).
    real_model: str | None = None
    ipv6: bool = False  # the world's IPv6 internet (HOSTS6): off unless asked for

    def ns(self, role: str) -> str:
        return f"sg-{self.instance}-{role}"

    # -- build and tear down ------------------------------------------------------------------

    def up(self) -> WorldInfo:
        try:
            return self._up()
        except BaseException:
            self.down()
            raise

    def _up(self) -> WorldInfo:
        self.base = Path(tempfile.mkdtemp(prefix=f"sandgate-world-{self.instance}-"))
        self.base.chmod(0o755)
        lan, wan, model, nas = (self.ns(r) for r in ("lan", "wan", "model", "nas"))
        for name in (lan, wan, model, nas):
            ns.create(name)
            self.namespaces.append(name)
        self._wire(lan, wan, model, nas)
        if self.ipv6:
            self._wire6(lan, wan)
        from sandgate.gateway.proxy.ca import make_ca, write_pair  # cryptography: up, not run

        ca = make_ca(f"sandgate test world {self.instance}", days=30)
        ca_dir = self.base / "ca"
        write_pair(ca_dir, "ca", ca.cert_pem, ca.key_pem)
        logs = {
            k: self.base / f"{k}.jsonl"
            for k in ("dns", "web", "model", "nas", "openai", "tripwires", "probe")
        }
        self.api_key = "sk-world-" + secrets.token_hex(20)
        # Imported here: zipfile and the rest cost a run on a running gateway ~10 ms (issue 13).
        from sandgate.world.fixtures import build_fixtures

        build_fixtures(self.base)
        self._start_servers(ca, ca_dir, logs, wan, model, nas)
        policy = self.base / "testworld.toml"
        policy.write_bytes(
            resources.files("sandgate.world").joinpath("testworld.toml").read_bytes()
        )
        self.info = WorldInfo(
            uplink=Uplink(
                kind="netns",
                address=GATEWAY_UPLINK,
                via=ROUTER,
                peer_netns=lan,
                peer_ifname="gw0",
                peer_master="br0",
                address6=GATEWAY_UPLINK6 if self.ipv6 else "",
                via6=ROUTER6 if self.ipv6 else "",
            ),
            upstream_dns=(RESOLVER,),
            public_override=PUBLIC + PUBLIC6 if self.ipv6 else PUBLIC,
            ca_cert=ca_dir / "ca.pem",
            policy=policy,
            logs=logs,
            namespaces=tuple(self.namespaces),
            gateway_env={"OPENAI_API_KEY": self.api_key},
            model=self.real_model or "scripted",
        )
        return self.info

    def down(self) -> None:
        for server in reversed(self.servers):
            with contextlib.suppress(Exception):
                server.stop()
        self.servers.clear()
        for name in reversed(self.namespaces):
            with contextlib.suppress(Exception):
                ns.remove(name)
        self.namespaces.clear()
        if self.base is not None:
            shutil.rmtree(self.base, ignore_errors=True)
            self.base = None

    def __enter__(self) -> WorldInfo:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    # -- links --------------------------------------------------------------------------------

    def _wire(self, lan: str, wan: str, model: str, nas: str) -> None:
        ipr = ns.iproute(lan)
        try:
            ipr.link("add", ifname="br0", kind="bridge")
            br = ipr.link_lookup(ifname="br0")[0]
            ipr.addr("add", index=br, address=ROUTER, prefixlen=24)
            ipr.link("set", index=br, state="up")
            _lo_up(ipr)
            for host, addr in ((model, MODEL), (nas, NAS)):
                port = f"p-{host.rsplit('-', 1)[1]}"
                fd = _open_ns(host)
                try:
                    ipr.link(
                        "add", ifname=port, kind="veth", peer={"ifname": "eth0", "net_ns_fd": fd}
                    )
                finally:
                    os.close(fd)
                idx = ipr.link_lookup(ifname=port)[0]
                ipr.link("set", index=idx, master=br, state="up")
                _host_side(host, addr, 24, ROUTER)
            fd = _open_ns(wan)
            try:
                ipr.link(
                    "add", ifname="wan0", kind="veth", peer={"ifname": "lan0", "net_ns_fd": fd}
                )
            finally:
                os.close(fd)
            idx = ipr.link_lookup(ifname="wan0")[0]
            iface = ipaddress.IPv4Interface(TRANSIT[0])
            ipr.addr("add", index=idx, address=str(iface.ip), prefixlen=30)
            ipr.link("set", index=idx, state="up")
            ipr.route("add", dst="default", gateway=str(ipaddress.IPv4Interface(TRANSIT[1]).ip))
        finally:
            ipr.close()
        ns.run_in(
            lan,
            lambda: ns.write_sysctls(
                {"net.ipv4.ip_forward": "1", "net.ipv6.conf.all.disable_ipv6": "1"}
            ),
        )
        self._wire_wan(wan)

    def _wire_wan(self, wan: str) -> None:
        ipr = ns.iproute(wan)
        try:
            _lo_up(ipr)
            lo = ipr.link_lookup(ifname="lo")[0]
            for address in sorted({*HOSTS.values(), RESOLVER, PUBLIC_IP, PROBE_HOST}):
                ipr.addr("add", index=lo, address=address, prefixlen=32)
            idx = ipr.link_lookup(ifname="lan0")[0]
            iface = ipaddress.IPv4Interface(TRANSIT[1])
            ipr.addr("add", index=idx, address=str(iface.ip), prefixlen=30)
            ipr.link("set", index=idx, state="up")
            ipr.route(
                "add", dst="10.77.0.0/16", gateway=str(ipaddress.IPv4Interface(TRANSIT[0]).ip)
            )
        finally:
            ipr.close()
        ns.run_in(wan, lambda: ns.write_sysctls({"net.ipv6.conf.all.disable_ipv6": "1"}))

    def _wire6(self, lan: str, wan: str) -> None:
        """IPv6 on the router's LAN bridge and transit, and the internet's hosts on wan's lo."""
        v6 = {"net.ipv6.conf.all.disable_ipv6": "0", "net.ipv6.conf.default.disable_ipv6": "0"}
        ns.run_in(lan, lambda: ns.write_sysctls({**v6, "net.ipv6.conf.all.forwarding": "1"}))
        ns.run_in(wan, lambda: ns.write_sysctls(v6))
        six = socket.AF_INET6
        ipr = ns.iproute(lan)
        try:
            _addr6(ipr, "br0", f"{ROUTER6}/64")
            _addr6(ipr, "wan0", TRANSIT6[0])
            via = str(ipaddress.IPv6Interface(TRANSIT6[1]).ip)
            ipr.route("add", dst="::/0", gateway=via, family=six)
        finally:
            ipr.close()
        ipr = ns.iproute(wan)
        try:
            for address in sorted(set(HOSTS6.values())):
                _addr6(ipr, "lo", f"{address}/128")
            _addr6(ipr, "lan0", TRANSIT6[1])
            via = str(ipaddress.IPv6Interface(TRANSIT6[0]).ip)
            ipr.route("add", dst="2001:db8:77::/48", gateway=via, family=six)
        finally:
            ipr.close()

    # -- servers ------------------------------------------------------------------------------

    def _start_servers(
        self, ca: CA, ca_dir: Path, logs: dict[str, Path], wan: str, model: str, nas: str
    ) -> None:
        assert self.base is not None
        dns_cfg = {
            "listen": [f"{RESOLVER}:53"],
            "dot": [f"{RESOLVER}:853"],
            "doh": [f"{RESOLVER}:443"],
            "ca_dir": str(ca_dir),
            "tls_names": ["dns.example.net"],
            "zones": _zones(self.ipv6),
        }
        web_ips = sorted({*HOSTS.values(), PUBLIC_IP} - {RESOLVER, OPENAI})
        if self.ipv6:
            web_ips += [f"[{a}]" for a in sorted(set(HOSTS6.values()))]
        web_cfg = {
            "http": [f"{a}:80" for a in web_ips],
            "https": [f"{a}:443" for a in web_ips],
            "ca_dir": str(ca_dir),
            "h2": True,
            "vhosts": _vhosts(self.base, self.ipv6),
        }
        self.servers.append(self._start("dns", dns_cfg, logs["dns"], wan))
        self.servers.append(self._start("web", web_cfg, logs["web"], wan))
        # The model servers replay scripted turns (tool calls) for the real agent frameworks'
        # tasks, matched by the task marker in the first message; anything else is echoed.
        script = self.model_script
        if self.real_model is not None:
            from sandgate.world import llm

            relay_cfg = {
                "listen": [f"{MODEL}:{MODEL_PORT}"],
                "upstream": llm.server_argv(self.real_model, "127.0.0.1", LLM_PORT),
                "upstream_port": LLM_PORT,
            }
            print(f"sandgate: starting {self.real_model} in the test world", file=sys.stderr)
            relay = self._start("llmrelay", relay_cfg, logs["model"], model, timeout=200)
            self.servers.append(relay)
        else:
            model_cfg = {"listen": [f"{MODEL}:{MODEL_PORT}"], "script": script}
            self.servers.append(self._start("model", model_cfg, logs["model"], model))
        # A hosted model API that wants a key: what placeholder credentials are swapped for.
        openai_cfg = {
            "listen": [f"{OPENAI}:80"],
            "tls_listen": [f"{OPENAI}:443"],
            "tls_names": ["api.openai.com"],
            "ca_dir": str(ca_dir),
            "require_key": [self.api_key],
            "model": "gpt-sandgate",
            "script": script,
        }
        self.servers.append(self._start("model", openai_cfg, logs["openai"], wan, label="openai"))
        self.servers.append(
            self._start(
                "listen",
                {"bind": [NAS], "tcp": [str(p) for p in NAS_TCP], "udp": [str(p) for p in NAS_UDP]},
                logs["nas"],
                nas,
            )
        )
        # Tripwires: a forbidden connection that got through shows up as an answer and a log line.
        tripwires = {"bind": [MODEL], "tcp": [str(p) for p in MODEL_TRIPWIRES]}
        self.servers.append(
            self._start("listen", tripwires, logs["tripwires"], model, "model-trip")
        )
        echo = {"bind": [PROBE_HOST], "udp": ["123", "443"], "tcp": ["9"]}
        self.servers.append(self._start("listen", echo, logs["probe"], wan, "probe-host"))

    def _start(
        self,
        server: str,
        config: dict[str, Any],
        log: Path,
        netns: str,
        label: str | None = None,
        timeout: float = 15.0,
    ) -> Running:
        assert self.base is not None
        path = self.base / f"{label or server}.json"
        path.write_text(json.dumps(config, indent=2))
        running = start(
            server,
            ["--config", str(path), "--log", str(log)],
            prefix=ns.nsenter_argv(netns),
            timeout=timeout,
        )
        if self.on_start is not None:
            self.on_start(running.proc.pid)
        return running


def _zones(ipv6: bool = False) -> list[dict[str, Any]]:
    zones: dict[str, list[dict[str, str]]] = {}
    records = [(n, "A", a) for n, a in {**HOSTS, **REBIND}.items()]
    records += [(n, "AAAA", a) for n, a in HOSTS6.items()] if ipv6 else []
    for name, rtype, address in records:
        origin = ".".join(name.split(".")[-2:])
        rel = name[: -len(origin)].rstrip(".") or "@"
        zones.setdefault(origin, []).append({"name": rel, "type": rtype, "value": address})
    for name, target in CNAMES.items():
        origin = ".".join(name.split(".")[-2:])
        rel = name[: -len(origin)].rstrip(".")
        zones[origin].append({"name": rel, "type": "CNAME", "value": target})
    out = [{"origin": o, "ttl": 300, "records": r} for o, r in sorted(zones.items())]
    for origin in WILDCARD_ZONES:
        out.append(
            {
                "origin": origin,
                "ttl": 60,
                "wildcard": True,
                "records": [{"name": "@", "type": "A", "value": HOSTS[origin]}],
            }
        )
    return out


def _vhosts(base: Path, ipv6: bool = False) -> list[dict[str, Any]]:
    title = (
        "<!doctype html><html><head><title>Example Domain</title></head>"
        "<body><h1>Example Domain</h1></body></html>"
    )
    vhosts: list[dict[str, Any]] = [
        {
            "names": ["example.com", "www.example.com", HOSTS["example.com"]],
            "routes": {
                "/": {"status": 200, "headers": {"content-type": "text/html"}, "body": title}
            },
            "builtins": True,
        },
        {
            "names": ["pypi.org", "files.pythonhosted.org"],
            "builtins": True,
            "pypi": str(base / "wheels"),
        },
        {
            "names": ["github.com", "*.github.com", "raw.githubusercontent.com"],
            "builtins": True,
            "git": str(base / "git"),
            "routes": {
                "/repos/ollama/ollama/releases/latest": {
                    "status": 200,
                    "headers": {"content-type": "application/json"},
                    "body": json.dumps({"tag_name": "v0.40.11", "name": "v0.40.11"}),
                }
            },
        },
        {
            # Report 000's T14 asked for Seattle's weather.
            "names": ["wttr.in", HOSTS["wttr.in"]],
            "builtins": True,
            "routes": {"/Seattle": {"status": 200, "body": "Seattle: \u26c5\ufe0f  +12\u00b0C\n"}},
        },
    ]
    taken = {n for v in vhosts for n in v["names"]}
    for name, address in sorted(HOSTS.items()):
        if name not in taken:
            vhosts.append({"names": [name, address], "builtins": True})
            taken.add(name)
    vhosts.append({"names": [PUBLIC_IP], "builtins": True})
    if ipv6:
        page = {"status": 200, "headers": {"content-type": "text/plain"}, "body": "IPv6 only\n"}
        vhosts.append({"names": [V6_ONLY, HOSTS6[V6_ONLY]], "routes": {"/": page}})
        for v in vhosts:  # each host also by its IPv6 literal
            more = [HOSTS6[n] for n in v["names"] if n in HOSTS6 and n != V6_ONLY]
            v["names"] = list(dict.fromkeys([*v["names"], *more]))
    (base / "wheels").mkdir(exist_ok=True)
    (base / "git").mkdir(exist_ok=True)
    return vhosts


def _addr6(ipr: Any, ifname: str, cidr: str) -> None:
    iface = ipaddress.IPv6Interface(cidr)
    idx = ipr.link_lookup(ifname=ifname)[0]
    ipr.addr(
        "add", index=idx, address=str(iface.ip), prefixlen=iface.network.prefixlen, flags=0x02
    )  # IFA_F_NODAD: usable at once


def _lo_up(ipr: Any) -> None:
    lo = ipr.link_lookup(ifname="lo")[0]
    ipr.link("set", index=lo, state="up")


def _open_ns(name: str) -> int:
    return os.open(ns.path(name), os.O_RDONLY | os.O_CLOEXEC)


def _host_side(netns: str, address: str, prefixlen: int, via: str) -> None:
    ipr = ns.iproute(netns)
    try:
        _lo_up(ipr)
        idx = ipr.link_lookup(ifname="eth0")[0]
        ipr.addr("add", index=idx, address=address, prefixlen=prefixlen)
        ipr.link("set", index=idx, state="up")
        ipr.route("add", dst="default", gateway=via)
    finally:
        ipr.close()
    ns.run_in(netns, lambda: ns.write_sysctls({"net.ipv6.conf.all.disable_ipv6": "1"}))
