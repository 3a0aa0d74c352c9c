"""The model server on this host, and inbound expose, against the real kernel (issue 10, parts 4
and 5).

Host loopback: the "model server" is a listener on the real host's 127.0.0.1 (a free port,
served by a thread of this test process and closed with it): the relay's host side runs in the
host's namespace in production, so this is the path a user's Ollama takes, and it is loopback
traffic only. A second listener on the host's loopback stands for every other host service.

Expose: from the test world's LAN, the model-server namespace (the named client) reaches the
orchestrator guest's port; the NAS namespace (another LAN host) does not.
"""

from __future__ import annotations

import http.server
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandgate.events.schema import Event, Kind
from sandgate.events.store import Store
from sandgate.session.stack import Stack, bring_up
from sandgate.world.topology import GATEWAY_UPLINK, MODEL, NAS

from .conftest import ROOT, Runner, leftovers

pytestmark = pytest.mark.kernel

EXPOSED = 9119
UPLINK = GATEWAY_UPLINK.split("/")[0]


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        port = self.connection.getsockname()[1]
        body = f"host loopback {port}\n".encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _serve_on_host_loopback() -> http.server.ThreadingHTTPServer:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def host() -> Iterator[tuple[int, int]]:
    model, other = _serve_on_host_loopback(), _serve_on_host_loopback()
    try:
        yield model.server_address[1], other.server_address[1]
    finally:
        for s in (model, other):
            s.shutdown()
            s.server_close()


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory, host: tuple[int, int]) -> Path:
    path = tmp_path_factory.mktemp("hostsvc") / "policy.toml"
    path.write_text(
        f"""
[gateway]
default_profile = "agent"

[profiles.agent]
internet = "open"
allow = [ {{ host_loopback = {host[0]}, name = "model server on the host" }} ]

[profiles.orchestrator]
internet = "locked"
allow = [ {{ host_loopback = {host[0]}, name = "model server on the host" }} ]

[[expose]]
guest = "orchestrator"
port = {EXPOSED}
from = "{MODEL}"
"""
    )
    path.chmod(0o644)
    path.parent.chmod(0o755)
    return path


@pytest.fixture(scope="module")
def hs(policy: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runner]:
    if not ROOT:
        pytest.skip("needs root")
    store = tmp_path_factory.mktemp("hs-store") / "events.db"
    stack = bring_up(world=True, store=str(store), policy=str(policy))
    try:
        yield Runner(stack, store)
    finally:
        stack.teardown()
        assert not [x for x in leftovers() if stack.instance in x]
        assert stack.gateway.hostlo is not None and stack.gateway.hostlo.poll() is not None


def _events(runner: Runner, session: str | None = None) -> list[Event]:
    store = Store(runner.store_path)
    try:
        return store.events(session=session, kinds=[Kind.CONN])
    finally:
        store.close()


def test_guest_reaches_exactly_the_host_loopback_port(
    hs: Runner, policy: Path, host: tuple[int, int]
) -> None:
    port, other = host
    result = hs.sh(
        f"""
        g=$SANDGATE_GATEWAY
        echo "direct: $(curl -s --noproxy '*' --max-time 10 http://$g:{port}/)"
        echo "proxied: $(curl -s --max-time 10 http://$g:{port}/)"
        curl -s --noproxy '*' --max-time 5 -o /dev/null http://$g:{other}/; echo "other: $?"
        curl -s --noproxy '*' --max-time 5 -o /dev/null http://127.0.0.1:{port}/; echo "own lo: $?"
        """,
        policy=str(policy),
    )
    assert result.exit_code == 0, result
    out = Path(result.report.output or "").read_text()
    lines = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
    assert lines["direct"] == f"host loopback {port}"
    assert lines["proxied"] == f"host loopback {port}"
    assert lines["other"] == "7"  # refused by the gateway (admin-prohibited): no connection
    assert lines["own lo"] == "7"  # the sandbox's own loopback has no such server
    conns = _events(hs, result.session)
    allowed = [e for e in conns if e.port == port and e.reason == "allow.host_loopback"]
    assert allowed and allowed[0].rule and "model server on the host" in allowed[0].rule
    refused = [e for e in conns if e.port == other]
    assert refused and all(e.reason == "deny.gateway" for e in refused), refused


def _curl_from(runner: Runner, role: str, url: str) -> subprocess.CompletedProcess[str]:
    stack: Stack = runner.stack
    assert stack.world is not None
    netns = next(n for n in stack.world.namespaces if n.endswith(f"-{role}"))
    return subprocess.run(
        ["ip", "netns", "exec", netns, "curl", "-s", "--max-time", "5", url],
        capture_output=True,
        text=True,
        check=False,
    )


def test_expose_admits_the_named_lan_client_only(hs: Runner, policy: Path) -> None:
    url = f"http://{UPLINK}:{EXPOSED}/"
    seen: dict[str, subprocess.CompletedProcess[str]] = {}

    def from_the_lan() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            got = _curl_from(hs, "model", url)
            if got.returncode == 0:
                seen["model"] = got
                break
            time.sleep(0.3)
        seen["nas"] = _curl_from(hs, "nas", url)
        seen["model-other-port"] = _curl_from(hs, "model", f"http://{UPLINK}:{EXPOSED + 1}/")

    lan = threading.Thread(target=from_the_lan)
    lan.start()
    result = hs.sh(
        f"cd /tmp && echo dashboard > index.html && "
        f"timeout 12 python3 -m http.server {EXPOSED} --bind 0.0.0.0 >/dev/null 2>&1; true",
        policy=str(policy),
        profile="orchestrator",
    )
    lan.join()
    assert result.exit_code == 0, result
    assert "model" in seen and seen["model"].stdout.strip() == "dashboard", seen
    assert seen["nas"].returncode != 0 and "dashboard" not in seen["nas"].stdout
    assert seen["model-other-port"].returncode != 0
    conns = _events(hs)
    inbound = [e for e in conns if e.src in (MODEL, NAS) and e.port in (EXPOSED, EXPOSED + 1)]
    assert any(e.src == MODEL and e.reason == "allow.expose" for e in inbound), inbound
    assert any(e.src == NAS and e.reason == "deny.inbound" for e in inbound), inbound
    assert any(e.port == EXPOSED + 1 and e.reason == "deny.inbound" for e in inbound), inbound
    # The guest left: its forward left with it (the maps are empty again, its chains gone).
    ruleset = subprocess.run(
        ["nsenter", f"--net=/proc/{hs.stack.gateway.pid}/ns/net", "nft", "list", "table", "inet",
         "sandgate"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "xpre_g" not in ruleset and "xfwd_g" not in ruleset, ruleset


def test_a_free_port_is_warned_about(tmp_path: Path) -> None:
    from sandgate.gateway.hostlo import unserved

    port = _free_port()
    assert unserved([port]) == [port]


def test_prove_probes_both_from_the_guest_and_from_the_lan(hs: Runner, policy: Path) -> None:
    from sandgate.prove.runner import ProveOptions, prove_on

    result = prove_on(
        hs.stack,
        ProveOptions(
            world="test",
            policy=str(policy),
            profile="orchestrator",
            store=str(hs.store_path),
        ),
    )
    rows = {r.probe: r for r in result.results}
    assert not result.failed, result.failed
    loopback = [r for r in rows.values() if r.probe.startswith("host loopback")]
    assert sorted(r.expected for r in loopback) == ["allow", "deny"], loopback
    inbound = {
        r.probe.split(" from ")[1].split()[0]: r for r in rows.values() if r.group == "inbound"
    }
    assert inbound["model"].expected == "allow" and inbound["model"].result == "PASS"
    assert inbound["nas"].expected == "deny" and inbound["nas"].result == "PASS"


def test_an_exposed_port_nobody_listens_on_is_warned_about(hs: Runner, policy: Path) -> None:
    result = hs.sh("sleep 8", policy=str(policy), profile="orchestrator")
    store = Store(hs.store_path)
    try:
        notices = store.events(session=result.session, kinds=[Kind.NOTICE])
    finally:
        store.close()
    warned = [e for e in notices if e.details.get("port") == EXPOSED]
    assert warned and "nothing listens" in warned[0].details["warning"], notices


def test_a_port_the_running_gateway_does_not_relay_is_refused_at_its_line(
    hs: Runner, tmp_path: Path, host: tuple[int, int]
) -> None:
    from sandgate.errors import SandgateError

    other = tmp_path / "other.toml"
    other.write_text(f"[profiles.agent]\nallow = [\n  {{ host_loopback = {host[1]} }},\n]\n")
    other.chmod(0o644)
    tmp_path.chmod(0o755)
    with pytest.raises(SandgateError) as caught:  # the daemon's refusal, through its socket
        hs.sh("true", policy=str(other))
    assert f"other.toml:3:3: host_loopback {host[1]} is not relayed" in str(caught.value)
    assert "sandgate down" in str(caught.value)
