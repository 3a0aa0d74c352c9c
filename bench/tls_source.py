"""A fast TLS source on a "public" address of the test world, for ``bench/run proxy``.

``tls_server.py`` (why not nginx: its docstring) listens on ``ADDRESS:443`` inside the world's
WAN namespace (the address is added to its loopback, beside the world's own web addresses),
with a leaf from the test world's CA for ``NAME``, so sandboxes (which trust that CA) and every
peer verify it as they would a real site. Every path under test reaches this one server over
the world's router, as the world's web server is reached.

The name resolves through the bench's fast upstream DNS (restarted with one more
``--address``), so the gateway's resolver, mitmproxy and squid all learn it the same way.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import BenchNet, log, run, spawn_ready, stop, wait_udp_port
from bench.stack import UPSTREAM, BenchStack
from sandgate.gateway.proxy.ca import CA, write_pair

NAME = "tls.bench.example"
ADDRESS = "203.0.113.90"  # in the world's public range, unused by the world itself


@dataclass
class TlsSource:
    server: subprocess.Popen[bytes]
    ca_pem: Path  # the world CA: what a peer client must trust for the server

    @property
    def url(self) -> str:
        return f"https://{NAME}"


def start(bs: BenchStack) -> TlsSource:
    """The server in the world's WAN namespace; its name in the fast upstream DNS."""
    world = bs.stack.world
    assert world is not None
    base = bs.base / "tls-source"
    base.mkdir()
    ca = CA.load(world.ca_cert.parent)
    cert, key = ca.issue([NAME], [ADDRESS], days=2)
    leaf, leaf_key = write_pair(base, "leaf", cert + ca.cert_pem, key)
    wan = bs.net.name("wan")  # the world's namespace (the world shares the bench's instance)
    bs.net.ip(wan, "addr", "add", f"{ADDRESS}/32", "dev", "lo")
    _add_name(bs)
    server = spawn_ready(
        bs.net,
        wan,
        [
            "python3",
            str(Path(__file__).with_name("tls_server.py")),
            *(ADDRESS, "443", str(leaf), str(leaf_key)),
        ],
    )
    log(f"TLS source: tls_server.py at {ADDRESS}:443 as {NAME} (pid {server.pid})")
    return TlsSource(server, world.ca_cert)


def _add_name(bs: BenchStack) -> None:
    """Restart the bench's fast upstream DNS with ``NAME`` added (its other answers unchanged)."""
    old = next(
        p
        for p in bs.net.procs
        if isinstance(p.args, list) and f"--listen-address={UPSTREAM}" in p.args
    )
    assert isinstance(old.args, list)
    argv = [str(a) for a in old.args]
    argv = [*argv[argv.index("dnsmasq") :], f"--address=/{NAME}/{ADDRESS}"]
    stop(old)
    bs.net.procs.remove(old)
    bs.net.spawn_in(
        bs.net.name("up"),
        argv,
        stdout=open(bs.base / "upstream-dnsmasq-proxy.log", "wb"),  # noqa: SIM115 - the child's
        stderr=subprocess.STDOUT,
    )
    wait_udp_port(bs.net.name("up"), UPSTREAM, 53)


def wait_tcp(
    net: BenchNet, netns: str, want: str, proc: subprocess.Popen[bytes], timeout: float = 10
) -> None:
    """Wait until something listens on tcp ``want`` (ADDR:PORT) in ``netns``, or ``proc`` dies."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        out = run(["ip", "netns", "exec", netns, "ss", "-Hltn"], check=False).stdout
        if want in out:
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on tcp {want} in {netns}")
