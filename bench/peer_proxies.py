"""The peer proxies of ``bench/run proxy``: mitmproxy, squid, HAProxy, socat, on the peer gateway.

They run in the peer router namespace (``sg-I-rt``) and listen on its guest-side address
(10.77.251.1), so the peer guest (``sg-I-cl``) reaches them as a sandbox reaches its gateway's
port 3128: over its own veth, to its next hop, which dials out over the world's LAN.

* mitmproxy 11 (``mitmdump``), from PyPI in its own virtualenv (``MITM_VENV``, default
  /opt/sandgate/bench-venv; never sandgate's): one process passing every host through
  (``--ignore-hosts '.*'``), one intercepting (its CA trusted by the client;
  ``stream_large_bodies=1`` so bodies stream instead of being held whole).
* Debian's squid (``squid-openssl``: the build with ssl-bump), one process (``-N``), two ports:
  a plain CONNECT port and an ``ssl-bump`` port that bumps every tunnel, with a CA of its own.
* Debian's HAProxy 2.6 and socat as plain TCP relays to the source (no CONNECT): HAProxy does
  not answer CONNECT itself (in ``mode http`` it forwards the request to a server and tunnels
  after that server's 2xx: haproxy/haproxy#2056), so they are measured as what a CONNECT tunnel
  is once its handshake is done, a byte relay: the floor any userspace relay meets here. One
  HAProxy process (its default threads, one a CPU) with two ``mode tcp`` listeners, one with
  ``option splice-auto``; socat forks one process a connection (its tree's CPU is counted).

Both resolve names through the bench's fast upstream DNS, as the gateway does: squid by its
``dns_nameservers``; mitmproxy through a resolv.conf bound over /etc/resolv.conf in the private
mount namespace ``ip netns exec`` gives it (nothing outside that process sees it). Their
output goes to files (mitmproxy stalls when a pipe it writes is not read: FIELD-NOTES).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import log
from bench.stack import PEER_LINK, UPSTREAM, BenchStack
from bench.tls_source import ADDRESS, wait_tcp

MITM_VENV = Path(os.environ.get("SANDGATE_BENCH_VENV", "/opt/sandgate/bench-venv"))
LISTEN = PEER_LINK[0]
PORTS = {"mitm-pass": 8080, "mitm-intercept": 8081, "squid-tunnel": 3128, "squid-bump": 3129,
         # plain TCP relays, no CONNECT: the client dials them
         "haproxy-tcp": 3130, "haproxy-splice": 3131, "socat-tcp": 3132,
         "hub-tcp": 3133}  # fmt: skip
CERTGEN = "/usr/lib/squid/security_file_certgen"

SQUID_CONF = """\
http_port {listen}:{tunnel}
http_port {listen}:{bump} ssl-bump name=bump tls-cert={dir}/ca.pem tls-key={dir}/ca.key \
generate-host-certificates=on dynamic_cert_mem_cache_size=4MB
sslcrtd_program {certgen} -s {dir}/ssl_db -M 4MB
sslcrtd_children 2 startup=1 idle=1
acl bumping myportname bump
ssl_bump bump bumping
ssl_bump splice all
tls_outgoing_options cafile={world_ca}
http_access allow all
cache deny all
access_log none
cache_log {dir}/cache.log
pid_filename none
netdb_filename none
coredump_dir {dir}
dns_nameservers {dns}
shutdown_lifetime 0 seconds
cache_effective_user proxy
"""

# Timeouts long enough for a 1 GiB transfer's pauses and an idle keep-alive round; no logs.
HAPROXY_CONF = """\
global
    maxconn 256
defaults
    mode tcp
    timeout connect 5s
    timeout client 120s
    timeout server 120s
listen tcp
    bind {listen}:{tcp}
    server source {source}:443
listen splice
    bind {listen}:{splice}
    option splice-auto
    server source {source}:443
"""


@dataclass
class Peers:
    pids: dict[str, int] = field(default_factory=dict)  # role -> pid, for CPU sampling
    proxies: dict[str, str] = field(default_factory=dict)  # path key -> host:port
    missing: dict[str, str] = field(default_factory=dict)  # path key -> why it is not measured
    ca_bundle: Path | None = None  # world CA + mitmproxy's + squid's, for the peer client
    trees: dict[str, int] = field(default_factory=dict)  # role -> pid whose children count too


def start(bs: BenchStack, world_ca: Path) -> Peers:
    """Start what is installed; say what is not (the bench then skips that path)."""
    peers = Peers()
    base = bs.base / "peers"
    base.mkdir()
    rt = bs.router_ns
    resolv = base / "resolv.conf"
    resolv.write_text(f"nameserver {UPSTREAM}\n")
    cas = [world_ca.read_bytes()]
    mitmdump = MITM_VENV / "bin" / "mitmdump"
    if mitmdump.exists():
        confdir = base / "mitm"
        confdir.mkdir()
        for key, extra in (
            ("mitm-intercept", ["--set", "stream_large_bodies=1"]),
            ("mitm-pass", ["--ignore-hosts", ".*"]),
        ):
            argv = [
                "sh", "-c", 'mount --bind "$0" /etc/resolv.conf && exec "$@"', str(resolv),
                str(mitmdump), "-q",
                "--listen-host", LISTEN, "--listen-port", str(PORTS[key]),
                "--set", f"confdir={confdir}",
                "--set", f"ssl_verify_upstream_trusted_ca={world_ca}",
                *extra,
            ]  # fmt: skip
            proc = bs.net.spawn_in(
                rt,
                argv,
                stdout=open(base / f"{key}.log", "wb"),  # noqa: SIM115 - the child's
                stderr=subprocess.STDOUT,
            )
            wait_tcp(bs.net, rt, f"{LISTEN}:{PORTS[key]}", proc, 30)
            peers.pids[key] = proc.pid
            peers.proxies[key] = f"{LISTEN}:{PORTS[key]}"
        cas.append((confdir / "mitmproxy-ca-cert.pem").read_bytes())
        log(f"peers: mitmdump {PORTS['mitm-pass']} (pass), {PORTS['mitm-intercept']} (intercept)")
    else:
        why = f"{mitmdump} not found (python3.11 -m venv {MITM_VENV}; pip install mitmproxy)"
        peers.missing.update({"mitm-pass": why, "mitm-intercept": why})
    squid = shutil.which("squid") or ("/usr/sbin/squid" if Path("/usr/sbin/squid").exists() else "")
    if squid:
        cas.append(_start_squid(bs, peers, squid, base / "squid", world_ca))
    else:
        why = "squid not installed (apt-get install squid-openssl)"
        peers.missing.update({"squid-tunnel": why, "squid-bump": why})
    _start_relays(bs, peers, base)
    peers.ca_bundle = base / "ca-bundle.pem"
    peers.ca_bundle.write_bytes(b"\n".join(c.strip() for c in cas) + b"\n")
    return peers


def _start_squid(bs: BenchStack, peers: Peers, squid: str, folder: Path, world_ca: Path) -> bytes:
    folder.mkdir()
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-keyout", str(folder / "ca.key"), "-out", str(folder / "ca.pem"),
            "-subj", "/CN=sandgate bench squid CA",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        ],
        check=True, capture_output=True,
    )  # fmt: skip
    bump = Path(CERTGEN).exists() and b"--with-openssl" in _squid_version(squid)
    if bump:
        subprocess.run(
            [CERTGEN, "-c", "-s", str(folder / "ssl_db"), "-M", "4MB"],
            check=True,
            capture_output=True,
        )
    proxy = pwd.getpwnam("proxy")
    for path in [folder, *folder.rglob("*")]:
        os.chown(path, proxy.pw_uid, proxy.pw_gid)
    conf = SQUID_CONF.format(
        listen=LISTEN,
        tunnel=PORTS["squid-tunnel"],
        bump=PORTS["squid-bump"],
        dir=folder,
        certgen=CERTGEN,
        world_ca=world_ca,
        dns=UPSTREAM,
    )
    if not bump:
        # This squid was built without OpenSSL (Debian's plain ``squid`` uses GnuTLS): no bump.
        conf = "\n".join(ln for ln in conf.splitlines() if "bump" not in ln and "sslcrtd" not in ln)
        peers.missing["squid-bump"] = "this squid has no ssl-bump (install squid-openssl)"
    (folder / "squid.conf").write_text(conf + "\n")
    proc = bs.net.spawn_in(
        bs.router_ns,
        [squid, "-N", "-f", str(folder / "squid.conf")],
        stdout=open(folder / "squid.out", "wb"),  # noqa: SIM115 - the child's
        stderr=subprocess.STDOUT,
    )
    wait_tcp(bs.net, bs.router_ns, f"{LISTEN}:{PORTS['squid-tunnel']}", proc, 30)
    peers.pids["squid"] = proc.pid
    peers.proxies["squid-tunnel"] = f"{LISTEN}:{PORTS['squid-tunnel']}"
    if bump:
        wait_tcp(bs.net, bs.router_ns, f"{LISTEN}:{PORTS['squid-bump']}", proc, 30)
        peers.proxies["squid-bump"] = f"{LISTEN}:{PORTS['squid-bump']}"
    log(f"peers: squid {PORTS['squid-tunnel']} (CONNECT)" + (", 3129 (ssl-bump)" if bump else ""))
    return (folder / "ca.pem").read_bytes()


def _squid_version(squid: str) -> bytes:
    return subprocess.run([squid, "-v"], capture_output=True, check=False).stdout


def _start_relays(bs: BenchStack, peers: Peers, base: Path) -> None:
    haproxy = shutil.which("haproxy") or ""
    if haproxy:
        conf = base / "haproxy.cfg"
        conf.write_text(HAPROXY_CONF.format(
            listen=LISTEN, tcp=PORTS["haproxy-tcp"], splice=PORTS["haproxy-splice"], source=ADDRESS
        ))  # fmt: skip
        proc = bs.net.spawn_in(
            bs.router_ns,
            [haproxy, "-db", "-f", str(conf)],  # -db: foreground, no daemon, no master
            stdout=open(base / "haproxy.log", "wb"),  # noqa: SIM115 - the child's
            stderr=subprocess.STDOUT,
        )
        for key in ("haproxy-tcp", "haproxy-splice"):
            wait_tcp(bs.net, bs.router_ns, f"{LISTEN}:{PORTS[key]}", proc, 30)
            peers.proxies[key] = f"{LISTEN}:{PORTS[key]}"
        peers.pids["haproxy"] = proc.pid
        log(f"peers: haproxy {PORTS['haproxy-tcp']}, {PORTS['haproxy-splice']} (splice-auto)")
    else:
        why = "haproxy not installed (apt-get install haproxy; do not enable its service)"
        peers.missing.update({"haproxy-tcp": why, "haproxy-splice": why})
    # sandgate's own hub as the same kind of peer (bench/relayfloor.py's accept loop, this tree's
    # relay.py): the same hops as HAProxy's, so the difference is the relays' alone.
    tree = Path(__file__).resolve().parents[1]
    hub = bs.net.spawn_in(
        bs.router_ns,
        ["env", f"PYTHONPATH={tree}/src:{tree}", sys.executable, "-m", "bench.relayfloor",
         "--hub", LISTEN, str(PORTS["hub-tcp"]), ADDRESS, "443"],
        stdout=open(base / "hub.log", "wb"),  # noqa: SIM115 - the child's
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    wait_tcp(bs.net, bs.router_ns, f"{LISTEN}:{PORTS['hub-tcp']}", hub, 30)
    peers.pids["hub"] = hub.pid
    peers.proxies["hub-tcp"] = f"{LISTEN}:{PORTS['hub-tcp']}"
    socat = shutil.which("socat") or ""
    if socat:
        listen = f"TCP-LISTEN:{PORTS['socat-tcp']},bind={LISTEN},reuseaddr,fork"
        proc = bs.net.spawn_in(
            bs.router_ns,
            [socat, listen, f"TCP:{ADDRESS}:443"],
            stdout=open(base / "socat.log", "wb"),  # noqa: SIM115 - the child's
            stderr=subprocess.STDOUT,
        )
        wait_tcp(bs.net, bs.router_ns, f"{LISTEN}:{PORTS['socat-tcp']}", proc, 30)
        peers.trees["socat"] = proc.pid
        peers.proxies["socat-tcp"] = f"{LISTEN}:{PORTS['socat-tcp']}"
        log(f"peers: socat {PORTS['socat-tcp']} (TCP relay, a process a connection)")
    else:
        peers.missing["socat-tcp"] = "socat not installed (apt-get install socat)"
