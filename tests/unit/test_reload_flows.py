"""After a reload, which open flows the new profile refuses (gateway/reload.py): a table of
flows, judged by ``decide()`` by address and by the names the guest's resolver answered."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network

import pytest

from sandgate.gateway.reload import denied_flows
from sandgate.net.conntrack import Flow
from sandgate.policy.load import parse_policy
from sandgate.policy.model import Mode
from sandgate.policy.profile import Profile

GUEST = "10.201.0.22"
TEST_INTERNET = (IPv4Network("203.0.113.0/24"), IPv4Network("198.51.100.0/24"))
POLICY = parse_policy(
    b"""
[gateway]
guest_pool = "10.201.0.0/16"

[profiles.agent]
internet = "allowlist"
allow = [
  { host = "203.0.113.10", port = 80, name = "web" },
  { domain = "pypi.org" },
]
deny = [ { host = "203.0.113.20" } ]
""",
    "test.toml",
)


def profile(mode: Mode = Mode.ALLOWLIST) -> Profile:
    return POLICY.profile(
        "agent",
        mode=mode,
        gateway_address=IPv4Address("10.201.0.21"),
        public_override=TEST_INTERNET,  # the test world's "public" documentation ranges
    )


def flow(dst: str, dport: int, proto: str = "tcp") -> Flow:
    return Flow(proto, GUEST, 40000, dst, dport)


NAMES = {"198.51.100.7": {"pypi.org"}, "198.51.100.8": {"evil.example", "pypi.org"}}


@pytest.mark.parametrize(
    ("f", "expected"),
    [
        (flow("203.0.113.10", 80), None),  # a host rule still allows it
        (flow("203.0.113.10", 443), "deny.not_allowlisted"),  # the rule names port 80 only
        (flow("203.0.113.20", 80), "deny.rule"),  # the new deny rule
        (flow("198.51.100.7", 443), None),  # reached through an allowed name
        (flow("198.51.100.8", 443), None),  # one of its names is allowed: it stays
        (flow("198.51.100.9", 443), "deny.not_allowlisted"),  # no name, no rule
        (flow("10.77.0.10", 8000), "deny.private"),  # special-purpose, no exemption
        (flow("203.0.113.10", 443, "udp"), "deny.quic"),
    ],
)
def test_each_flow_is_judged_by_decide(f: Flow, expected: str | None) -> None:
    denied = dict(denied_flows(profile(), [f], NAMES))
    assert (denied[f].key if f in denied else None) == expected


def test_open_keeps_public_flows_and_locked_cuts_them() -> None:
    flows = [flow("198.51.100.9", 443), flow("203.0.113.20", 80)]
    assert [f for f, _ in denied_flows(profile(Mode.OPEN), flows, {})] == [flows[1]]
    assert [d.key for _, d in denied_flows(profile(Mode.LOCKED), flows, {})] == [
        "deny.locked",
        "deny.rule",
    ]
