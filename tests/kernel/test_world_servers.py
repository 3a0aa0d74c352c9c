"""The world's servers inside a network namespace, on their real test-world addresses.

One namespace `sg-tw<hex>` holds the addresses on its own loopback; every server runs
in it through `ip netns exec` (as the world builder will start them) and every client
too, so no packet leaves the namespace. The namespace is deleted even on failure.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandgate.gateway.proxy.ca import make_ca
from sandgate.world.servers.launch import Running, start, wait_log

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and ip"),
]

ADDRS = ["10.77.0.10", "10.77.0.20", "203.0.113.10", "198.51.100.53"]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@pytest.fixture(scope="module")
def netns() -> Iterator[str]:
    name = f"sg-tw{secrets.token_hex(3)}"
    _ip("netns", "add", name)
    try:
        _ip("-n", name, "link", "set", "lo", "up")
        for addr in ADDRS:
            _ip("-n", name, "addr", "add", f"{addr}/32", "dev", "lo")
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, timeout=10)


def _inside(netns: str, *cmd: str) -> str:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    done = subprocess.run(
        ["ip", "netns", "exec", netns, *cmd],
        capture_output=True, text=True, timeout=20, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def world(netns: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("kworld")
    make_ca("sg kernel world CA").save(tmp / "ca")
    web = {
        "http": ["203.0.113.10:80"],
        "https": ["203.0.113.10:443"],
        "ca_dir": str(tmp / "ca"),
        "vhosts": [{"names": ["example.test"]}],
    }
    dns = {
        "listen": ["198.51.100.53"],
        "dot": ["198.51.100.53"],
        "doh": ["198.51.100.53"],
        "ca_dir": str(tmp / "ca"),
        "zones": [{"origin": "example.test", "records": [{"type": "A", "value": "203.0.113.10"}]}],
    }
    (tmp / "web.json").write_text(json.dumps(web))
    (tmp / "dns.json").write_text(json.dumps(dns))
    prefix = ["ip", "netns", "exec", netns]
    specs = {
        "model": ["--listen", "10.77.0.10"],
        "web": ["--config", str(tmp / "web.json")],
        "dns": ["--config", str(tmp / "dns.json")],
        "listen": ["--bind", "10.77.0.20", "--tcp", "22", "--tcp", "445", "--udp", "2049"],
    }
    running: list[Running] = []
    try:
        for name, args in specs.items():
            log = str(tmp / f"{name}.jsonl")
            running.append(start(name, [*args, "--log", log], prefix=prefix))
        yield {"servers": {r.name: r for r in running}, "tmp": tmp}
    finally:
        codes = [r.stop() for r in running]
    assert codes == [0] * len(specs)


def test_ready_lines_carry_the_world_addresses(world: dict[str, Any]) -> None:
    ready = {name: r.ready for name, r in world["servers"].items()}
    assert ready["model"]["listen"] == ["10.77.0.10:8000"]
    assert ready["web"]["http"] == ["203.0.113.10:80"]
    assert ready["web"]["https"] == ["203.0.113.10:443"]
    assert ready["dns"]["listen"] == ["198.51.100.53:53"]
    assert ready["dns"]["dot"] == ["198.51.100.53:853"]
    assert ready["listen"]["tcp"] == ["10.77.0.20:22", "10.77.0.20:445"]


def test_clients_inside_the_namespace(world: dict[str, Any], netns: str) -> None:
    tmp: Path = world["tmp"]
    models = _inside(netns, "curl", "-sS", "http://10.77.0.10:8000/v1/models")
    assert json.loads(models)["data"][0]["id"] == "sg-test-model"
    echo = _inside(
        netns, "curl", "-sS", "--cacert", str(tmp / "ca" / "ca.pem"),
        "--resolve", "example.test:443:203.0.113.10", "https://example.test/echo",
    )  # fmt: skip
    assert json.loads(echo)["sni"] == "example.test"
    script = (
        "import dns.message, dns.query, socket\n"
        "q = dns.message.make_query('example.test', 'A')\n"
        "print(dns.query.udp(q, '198.51.100.53', timeout=3).answer[0][0])\n"
        "s = socket.create_connection(('10.77.0.20', 22), timeout=3)\n"
        "print(s.recv(100).decode().strip())\n"
    )
    out = _inside(netns, sys.executable, "-c", script).split()
    assert out == ["203.0.113.10", "SSH-2.0-sg-nas"]
    dns_log = tmp / "dns.jsonl"
    assert wait_log(dns_log, lambda r: r.get("qname") == "example.test.")["transport"] == "udp"
    listen_log = tmp / "listen.jsonl"
    assert wait_log(listen_log, lambda r: r["event"] == "connect")["dst"] == "10.77.0.20:22"
