"""host_loopback and expose rules as written: located errors, the verdicts, the compiled sites.

(Their agreement with the kernel's ruleset over random policies is in test_enforcers_agree.py;
against the real kernel in tests/kernel/test_host_services.py.)
"""

from __future__ import annotations

import textwrap
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

import pytest

from sandgate.errors import PolicyError
from sandgate.gateway.hostlo import unserved
from sandgate.net.compile import GuestLink, guest_add, guest_remove
from sandgate.policy.decide import Attempt, decide, decide_inbound
from sandgate.policy.load import parse_policy
from sandgate.policy.model import Protocol
from sandgate.policy.profile import Profile

TCP, UDP = Protocol.TCP, Protocol.UDP
LINK = GuestLink.from_pool(IPv4Network("10.201.0.0/16"), 3, "02:00:00:00:00:03")

GOOD = """\
[profiles.coder]
internet = "open"
allow = [ { host_loopback = 11434, name = "ollama" } ]
deny = [ { cidr = "10.201.0.12/30", port = 22 } ]

[profiles.orchestrator]
internet = "locked"

[[expose]]
guest = "orchestrator"
port = 9119
from = "192.168.1.10"
"""


def _located(text: str) -> list[tuple[int | None, str, str]]:
    with pytest.raises(PolicyError) as caught:
        parse_policy(textwrap.dedent(text).encode(), "p.toml")
    return [(p.line, p.message, p.fix or "") for p in caught.value.problems]


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("allow = [ { host_loopback = 0 } ]", 2, "from 1 to 65535"),
        ('allow = [ { host_loopback = "11434" } ]', 2, "one TCP port"),
        ("allow = [ { host_loopback = 53 } ]", 2, "the gateway's own"),
        ("allow = [ { host_loopback = 443 } ]", 2, "the gateway's own"),
        ("allow = [ { host_loopback = 11434, port = 11434 } ]", 2, "drop 'port'"),
        ('allow = [ { host_loopback = 11434, protocol = "udp" } ]', 2, "TCP only"),
        ('allow = [ { host_loopback = 11434, host = "10.0.0.1" } ]', 2, "host_loopback alone"),
        ("deny = [ { host_loopback = 11434 } ]", 2, "closed to guests already"),
        (
            "allow = [\n  { host_loopback = 11434 },\n  { host_loopback = 11434 },\n]",
            4,
            "repeats",
        ),
    ],
)
def test_host_loopback_mistakes_are_located(text: str, line: int, words: str) -> None:
    found = _located(f"[profiles.p]\n{text}\n")
    assert len(found) == 1, found
    assert found[0][0] == line and words in found[0][1], found


@pytest.mark.parametrize(
    ("expose", "line", "words"),
    [
        ('guest = "orchestrater"\nport = 9119\nfrom = "192.168.1.10"', 3, "not a profile here"),
        ('guest = "p"\nport = 70000\nfrom = "192.168.1.10"', 4, "from 1 to 65535"),
        ('guest = "p"\nport = 9119\nfrom = "0.0.0.0/0"', 5, "every address"),
        ('guest = "p"\nport = 9119\nfrom = []', 5, "never everyone"),
        ('guest = "p"\nport = 9119\nfrom = "nas.lan"', 5, "not an address or network"),
        ('guest = "p"\nport = 9119\nfrom = "fd00::1"', 5, "IPv4 only"),
        ('guest = "p"\nport = 9119', 2, "'expose.0.from' is required"),
        ('guest = "p"\nport = 9119\nform = "192.168.1.10"', 5, "unknown key"),
    ],
)
def test_expose_mistakes_are_located(expose: str, line: int, words: str) -> None:
    found = _located(f"[profiles.p]\n[[expose]]\n{expose}\n")
    assert any(got == line and words in msg + fix for got, msg, fix in found), found


def test_one_uplink_port_leads_to_one_guest() -> None:
    text = GOOD + '\n[[expose]]\nguest = "coder"\nport = 9119\nfrom = "192.168.1.11"\n'
    ((line, message, fix),) = _located(text)
    assert line == 16 and "expose[0] already" in message and "merge" in fix


def _profiles() -> tuple[Profile, Profile]:
    policy = parse_policy(GOOD.encode(), "p.toml")
    coder = policy.profile("coder", gateway_address=LINK.gateway)
    orch = policy.profile("orchestrator", gateway_address=LINK.gateway)
    assert policy.host_loopback_ports() == (11434,)
    return coder, orch


def test_host_loopback_verdicts() -> None:
    coder, orch = _profiles()
    gw = LINK.gateway
    d = decide(coder, Attempt(TCP, gw, 11434))
    assert d.key == "allow.host_loopback" and d.rule_ref == "coder.allow[0] (ollama)"
    assert decide(coder, Attempt(UDP, gw, 11434)).key == "deny.gateway"
    assert decide(coder, Attempt(TCP, gw, 11435)).key == "deny.gateway"
    # Another profile, the host's real addresses, and 127.0.0.1 itself stay closed.
    assert decide(orch, Attempt(TCP, gw, 11434)).key == "deny.gateway"
    assert not decide(coder, Attempt(TCP, IPv4Address("127.0.0.1"), 11434)).allowed
    assert decide(coder, Attempt(TCP, gw, 22)).key == "deny.rule"


def test_inbound_verdicts() -> None:
    coder, orch = _profiles()
    proxy, nas = IPv4Address("192.168.1.10"), IPv4Address("192.168.1.20")
    assert decide_inbound(orch, proxy, TCP, 9119).key == "allow.expose"
    refused = decide_inbound(orch, nas, TCP, 9119)
    assert refused.key == "deny.inbound" and "192.168.1.20 is not a client" in refused.detail
    assert decide_inbound(orch, proxy, UDP, 9119).key == "deny.inbound"
    assert decide_inbound(orch, proxy, TCP, 9120).key == "deny.inbound"
    assert decide_inbound(coder, proxy, TCP, 9119).key == "deny.inbound"


def test_guest_remove_undoes_the_expose_parts() -> None:
    _, orch = _profiles()
    cmds, sites = guest_add(LINK, orch)
    made = {
        (kind, spec.get("name"))
        for c in cmds
        for op, body in c.items()
        for kind, spec in body.items()
        if kind in ("chain", "element") and spec.get("name", "").startswith(("x", "xpre"))
    }
    assert ("chain", "xpre_g3") in made and ("element", "xfwd") in made
    removed = {
        (kind, spec.get("name"))
        for c in guest_remove(LINK, sites.values(), orch)
        for op, body in c.items()
        if op == "delete"
        for kind, spec in body.items()
    }
    assert made <= removed, made - removed


PROC_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:2CAA 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1
   1: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2
   2: 0E00C90A:23A7 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 3
   3: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 4
"""
PROC_TCP6 = """\
  sl  local_address                         remote_address                        st
   0: 00000000000000000000000000000000:04D2 00000000000000000000000000000000:0000 0A
"""


def test_unserved_reads_listeners_without_connecting(tmp_path: Path) -> None:
    (tmp_path / "tcp").write_text(PROC_TCP)
    (tmp_path / "tcp6").write_text(PROC_TCP6)
    # 11434 on 127.0.0.1, 22 on 0.0.0.0, 1234 on [::]; 8080 is only an established flow.
    assert unserved([11434, 22, 1234, 8080, 9127], tmp_path) == [8080, 9127]
    # 9127 listens on 10.201.0.14 (a guest's own address), not on loopback.
    assert unserved([9127, 11434], tmp_path, ("10.201.0.14",)) == [11434]
