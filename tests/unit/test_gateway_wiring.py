"""The daemon's wiring comes from the policy's [gateway], checked against the uplink first."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from sandgate.errors import PolicyError
from sandgate.net.links import Uplink
from sandgate.policy.load import Policy, parse_policy
from sandgate.session.stack import gateway_config
from sandgate.world.info import WorldInfo

WORLD = WorldInfo(
    uplink=Uplink(kind="netns", address="10.77.0.2/24", via="10.77.0.1"),
    upstream_dns=("198.51.100.53",),
    public_override=("203.0.113.0/24", "198.51.100.0/24"),
    ca_cert=Path("/nonexistent/ca.pem"),
    policy=Path("/nonexistent/testworld.toml"),
    logs={},
    namespaces=(),
)


def policy(gateway: str) -> Policy:
    text = textwrap.dedent(f'[gateway]\n{gateway}\n[profiles.p]\ninternet = "open"\n')
    return parse_policy(text.encode(), "user.toml")


def test_the_policys_pool_and_resolvers_reach_the_daemon() -> None:
    cfg = gateway_config(
        "t", WORLD, None, policy('guest_pool = "10.202.0.0/16"\nupstream_dns = ["192.0.2.53"]')
    )
    assert cfg.guest_pool == "10.202.0.0/16"
    assert cfg.upstream_dns == ("192.0.2.53",)
    assert cfg.policy == "user.toml"


def test_the_worlds_resolver_when_the_policy_names_none() -> None:
    cfg = gateway_config("t", WORLD, None, policy(""))
    assert cfg.guest_pool == "10.201.0.0/16" and cfg.upstream_dns == ("198.51.100.53",)


@pytest.mark.parametrize("pool", ["10.77.0.0/16", "10.77.0.0/28", "203.0.113.0/24"])
def test_a_pool_over_the_uplinks_network_is_refused_at_its_line(pool: str) -> None:
    with pytest.raises(PolicyError) as caught:
        gateway_config("t", WORLD, None, policy(f'guest_pool = "{pool}"'))
    (problem,) = caught.value.problems
    assert (problem.file, problem.line) == ("user.toml", 2)
    assert "overlaps the uplink's network" in problem.message
    assert "10.201.0.0/16" in (problem.fix or "")


def test_a_full_pool_says_so() -> None:
    import ipaddress

    from sandgate.errors import SandgateError
    from sandgate.gateway.guests import GuestTable

    table = GuestTable(ipaddress.ip_network("10.202.0.0/28"))  # 3 guests and the canary
    table.draining |= {"g0", "g1", "g2"}
    with pytest.raises(SandgateError, match="is full"):
        table.free_index()
    table.draining.discard("g1")
    assert table.free_index() == 1
