"""`sandgate gateway`: the daemon on a gateway VM, on interfaces it did not create (issue 10).

The same daemon as on one host, told "this is the uplink, these are the guest links" instead
of making its links, and run in the machine's own network namespace (a gateway VM is the
gateway: there is nothing else on it to protect). The links are checked first (present,
with carrier, none twice, the uplink no guest link: net/handed.py, Plumber.check_handed), so
bad input changes nothing. The rest is the daemon's ``serve`` with ``cfg.handed``: rules (with
the alive fence) before forwarding, one guest per link, the resolver on guest links only.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from sandgate.errors import SandgateError
from sandgate.gateway.config import GatewayConfig, run_dir
from sandgate.net.handed import Handed, HandedGuest, handed_from
from sandgate.net.links import Uplink
from sandgate.policy.load import load_policy

INSTANCE = "gateway-vm"


def config_for(
    policy_path: str, links: Handed, upstream_dns: Sequence[str], pool: str
) -> GatewayConfig:
    return GatewayConfig(
        instance=INSTANCE,
        uplink=Uplink(kind="handed", ifname=links.uplink),
        guest_pool=pool,
        upstream_dns=tuple(upstream_dns),
        policy=policy_path,
        guest_links=tuple((g.ifname, g.profile) for g in links.guests),
    )


def handed_links(cfg: GatewayConfig) -> Handed:
    return Handed(cfg.uplink.ifname, tuple(HandedGuest(i, p, "") for i, p in cfg.guest_links))


def prepare(policy: str | None, uplink: str | None, guests: Sequence[str]) -> Path:
    """Check the links and write the daemon's configuration (run it with ``server.run``, in
    this namespace: the CLI does)."""
    pol = load_policy(policy)
    if pol.builtin:
        raise SandgateError("sandgate gateway needs a policy file", "give --policy FILE")
    links = handed_from(pol, uplink, guests)
    from sandgate.net.links import Plumber

    plumber = Plumber()
    try:
        problems = plumber.check_handed([links.uplink, *links.ifnames])
    finally:
        plumber.close()
    if problems:
        raise SandgateError(
            "the gateway's links are not right: " + "; ".join(problems),
            "fix them and start again; nothing was applied",
        )
    spec = pol.file.gateway
    upstream = spec.upstream_dns or machine_resolvers()
    cfg = config_for(os.path.abspath(pol.source), links, upstream, str(spec.pool))
    path = run_dir(cfg.instance) / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.write_text(cfg.dump())
    return path


def machine_resolvers() -> list[str]:
    """The gateway VM's own resolvers when the policy names none (its resolv.conf; a local
    stub such as systemd-resolved's 127.0.0.53 is skipped for the servers behind it)."""
    for path in ("/etc/resolv.conf", "/run/systemd/resolve/resolv.conf"):
        try:
            lines = Path(path).read_text().splitlines()
        except OSError:
            continue
        servers = [ln.split()[1] for ln in lines if ln.startswith("nameserver") and " " in ln]
        servers = [s for s in servers if not s.startswith("127.")]
        if servers:
            return servers
    return []


def own_listeners(port: int) -> list[str]:
    """The local IPv4 addresses this process's own sockets listen on at ``port`` (TCP in
    LISTEN, any UDP): read from /proc, matched to our file descriptors by inode."""
    mine = _socket_inodes()
    found: list[str] = []
    for table, listen_only in (("tcp", True), ("udp", False)):
        try:
            text = Path(f"/proc/self/net/{table}").read_text()
        except OSError:
            continue
        found += [addr for addr, inode in parse_proc_net(text, port, listen_only) if inode in mine]
    return sorted(set(found))


def parse_proc_net(text: str, port: int, listen_only: bool) -> list[tuple[str, int]]:
    """(address, inode) of /proc/net/tcp|udp rows bound to ``port`` (pure)."""
    out = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10:
            continue
        local, state, inode = fields[1], fields[3], fields[9]
        addr_hex, _, port_hex = local.partition(":")
        if int(port_hex, 16) != port or (listen_only and state != "0A"):
            continue
        addr = socket.inet_ntoa(int(addr_hex, 16).to_bytes(4, sys.byteorder))
        out.append((addr, int(inode)))
    return out


def _socket_inodes() -> set[int]:
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(int(target[8:-1]))
    return out


__all__ = [
    "INSTANCE",
    "config_for",
    "handed_links",
    "own_listeners",
    "parse_proc_net",
    "prepare",
]
