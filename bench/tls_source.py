"""A fast TLS source on a "public" address of the test world, for ``bench/run proxy``.

Debian's nginx, as one process (``master_process off``), listening on ``ADDRESS:443`` inside the
world's WAN namespace (the address is added to its loopback, next to the world's own web
addresses) with a leaf from the test world's CA for ``NAME``, so sandboxes (which trust that CA)
and every peer verify it as they would a real site. It serves:

* ``/bulk``: a 1 GiB file (sparse, so it costs no disk and reads from the page cache);
* ``/small``: three bytes, for keep-alive round trips (``keepalive_requests`` is lifted so one
  connection carries them all);
* ``/sse``: proxied unbuffered to ``sse_server.py`` on the namespace's loopback, which stamps
  each event with its send time.

HTTP/1.1 only (no h2), as sandgate's inspection speaks. No kTLS on this kernel (CONFIG_TLS is
off), so nginx encrypts in user space (``openssl speed``: AES-128-GCM ~4.4 GB/s, AES-256-GCM
~4.1 GB/s per core in 16 KiB records): its CPU is sampled and reported beside every figure.

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
from sandgate.world.ca import CA, write_pair

NAME = "tls.bench.example"
ADDRESS = "203.0.113.90"  # in the world's public range, unused by the world itself
SSE_PORT = 8090
SIZE = 1 << 30

NGINX_CONF = """\
daemon off;
master_process off;
worker_processes 1;
pid {base}/nginx.pid;
error_log {base}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    default_type application/octet-stream;
    client_body_temp_path {base}/tmp/body;
    proxy_temp_path {base}/tmp/proxy;
    fastcgi_temp_path {base}/tmp/fastcgi;
    uwsgi_temp_path {base}/tmp/uwsgi;
    scgi_temp_path {base}/tmp/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 300s;
    sendfile off;
    output_buffers 2 1m;
    ssl_buffer_size 16k;
    server {{
        listen {address}:443 ssl;
        server_name {name};
        ssl_certificate {base}/leaf.pem;
        ssl_certificate_key {base}/leaf.key;
        ssl_protocols TLSv1.2 TLSv1.3;
        root {base}/www;
        location = /bulk {{ }}
        location = /small {{ default_type text/plain; return 200 "ok\\n"; }}
        location = /sse {{
            proxy_pass http://127.0.0.1:{sse_port};
            proxy_http_version 1.1;
            proxy_buffering off;
            proxy_cache off;
        }}
    }}
}}
"""


@dataclass
class TlsSource:
    nginx: subprocess.Popen[bytes]
    sse: subprocess.Popen[bytes]
    ca_pem: Path  # the world CA: what a peer client must trust for the server

    @property
    def url(self) -> str:
        return f"https://{NAME}"


def world_ca(bs: BenchStack) -> CA:
    world = bs.stack.world
    assert world is not None
    return CA.load(world.ca_cert.parent)


def start(bs: BenchStack) -> TlsSource:
    """nginx and the SSE source in the world's WAN namespace; the name in the fast DNS."""
    base = bs.base / "tls-source"
    (base / "www").mkdir(parents=True)
    (base / "tmp").mkdir()
    with open(base / "www" / "bulk", "wb") as f:
        f.truncate(SIZE)
    ca = world_ca(bs)
    cert, key = ca.issue([NAME], [ADDRESS], days=2)
    write_pair(base, "leaf", cert + ca.cert_pem, key)
    (base / "nginx.conf").write_text(
        NGINX_CONF.format(base=base, address=ADDRESS, name=NAME, sse_port=SSE_PORT)
    )
    wan = bs.net.name("wan")  # the world's namespace (same instance prefix)
    bs.net.ip(wan, "addr", "add", f"{ADDRESS}/32", "dev", "lo")
    _add_name(bs)
    sse = spawn_ready(
        bs.net,
        wan,
        ["python3", str(Path(__file__).with_name("sse_server.py")), "127.0.0.1", str(SSE_PORT)],
    )
    nginx = bs.net.spawn_in(
        wan,
        ["nginx", "-c", str(base / "nginx.conf"), "-p", str(base)],
        stdout=open(base / "nginx.out", "wb"),  # noqa: SIM115 - the child's
        stderr=subprocess.STDOUT,
    )
    wait_tcp(bs.net, wan, f"{ADDRESS}:443", nginx)
    # Read the sparse file once, so its pages are cached (zero pages, but still copied).
    subprocess.run(
        ["dd", f"if={base / 'www' / 'bulk'}", "of=/dev/null", "bs=4M"],
        check=True,
        capture_output=True,
    )
    log(f"TLS source: nginx at {ADDRESS}:443 as {NAME} (pid {nginx.pid})")
    world = bs.stack.world
    assert world is not None
    return TlsSource(nginx, sse, world.ca_cert)


def _add_name(bs: BenchStack) -> None:
    """Restart the bench's fast upstream DNS with ``NAME`` added (its other answers unchanged)."""
    old = next(
        p
        for p in bs.net.procs
        if isinstance(p.args, list) and f"--listen-address={UPSTREAM}" in p.args
    )
    argv = [str(a) for a in old.args]
    argv = [*argv[argv.index("dnsmasq") :], f"--address=/{NAME}/{ADDRESS}"]
    stop(old)
    bs.net.procs.remove(old)
    log_path = bs.base / "upstream-dnsmasq-proxy.log"
    bs.net.spawn_in(
        bs.net.name("up"),
        argv,
        stdout=open(log_path, "wb"),  # noqa: SIM115 - the child's
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
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        out = run(["ip", "netns", "exec", netns, "ss", "-Hltn"], check=False).stdout
        if want in out:
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on tcp {want} in {netns}")
