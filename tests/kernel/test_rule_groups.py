"""Grouped address rules in a real kernel: 2,000 CIDR rules become one interval set and one
site, apply in one batch, and ``guest_remove`` takes the set away with the guest (issue 11)."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import secrets
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from sandgate.net import ns
from sandgate.net.compile import (
    TABLE,
    GuestLink,
    Limits,
    base_ruleset,
    guest_add,
    guest_remove,
    pin_elements,
)
from sandgate.net.nft import CommitMonitor, Nft, NftIn, batch
from sandgate.policy.load import parse_policy
from sandgate.policy.pins import pin_rules
from sandgate.policy.profile import Profile

POOL = ipaddress.ip_network("10.201.0.0/16")
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")


def _sets(name: str) -> dict[str, int]:
    out = subprocess.run(
        ["ip", "netns", "exec", name, "nft", "-j", "list", "sets", "inet"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = [i["set"] for i in json.loads(out)["nftables"] if "set" in i]
    return {s["name"]: len(s.get("elem", [])) for s in found if s["table"] == TABLE}


@contextlib.contextmanager
def _applied(
    text: str, prefix: str
) -> Iterator[tuple[str, NftIn, GuestLink, Profile, dict[str, Any]]]:
    """The base ruleset and one guest of profile "big" of ``text``, applied in one batch in a
    namespace of its own (removed after): yields (namespace, nft, link, profile, sites)."""
    link = GuestLink.from_pool(POOL, 0, "02:00:00:00:02:01")
    profile = parse_policy(text.encode(), "big.toml").profile(
        "big", gateway_address=link.gateway, guest_pool=POOL
    )
    name = f"sg-{prefix}-{secrets.token_hex(3)}"
    ns.create(name)
    worker = ns.NsThread(name)
    try:
        subprocess.run(
            ["ip", "-n", name, "link", "add", link.ifname, "type", "veth", "peer", "name", "pg0"],
            check=True,
        )
        nft = Nft.on(worker)
        base, _ = base_ruleset("up0", POOL)
        cmds, sites = guest_add(link, profile)
        nft.run(batch(*base, *cmds))
        yield name, nft, link, profile, sites
    finally:
        worker.close()
        ns.remove(name)


def test_grouped_rules_apply_and_go_with_the_guest() -> None:
    # /24s with gaps between them, and two that touch (one interval in the kernel).
    allow = [f'{{ cidr = "11.{i // 128}.{i % 128 * 2}.0/24", port = 443 }}' for i in range(2000)]
    allow += ['{ cidr = "12.0.0.0/24", port = 443 }', '{ cidr = "12.0.1.0/24", port = 443 }']
    allow += ['{ cidr = "11.0.0.0/22", port = "440-450" }']  # overlaps: sites of their own
    # Deny rules: one set for the forward and the input chain, removed once.
    deny = [f'{{ cidr = "13.0.{i * 2}.0/24", port = 22 }}' for i in range(20)]
    text = (
        f'[profiles.big]\ninternet = "allowlist"\nallow = [{", ".join(allow)}]\n'
        f"deny = [{', '.join(deny)}]\n"
    )
    with _applied(text, "groups") as (name, nft, link, profile, sites):
        grouped = [s for s in sites.values() if s.group is not None]
        assert sorted(len(s.group.rules) for s in grouped if s.group) == [20, 20, 2000]
        allowed = next(s for s in grouped if s.group and len(s.group.rules) == 2000)
        assert _sets(name)[allowed.group_set] == 1999  # 1998 apart, 2 touching as one
        denied = {s.group_set for s in grouped if s.group and len(s.group.rules) == 20}
        assert len(denied) == 1 and _sets(name)[denied.pop()] == 20
        nft.run(batch(*guest_remove(link, sites.values(), profile)))
        assert not [s for s in _sets(name) if s.startswith("r") and s.endswith("_g0")]


def test_domain_rules_share_pin_sets_in_the_kernel() -> None:
    """3,000 domain rules on three (list, scope) groups are three pin sets; a pinned address
    joins its group's set, and the sets go with the guest (policy/pins.py)."""
    allow = [f'{{ domain = "d{i}.x.example" }}' for i in range(1500)]
    allow += [f'{{ domain = "d{i}.y.example", port = 443 }}' for i in range(1000)]
    deny = [f'{{ domain = "e{i}.x.example", port = 22 }}' for i in range(500)]
    text = (
        f'[profiles.big]\ninternet = "allowlist"\nallow = [{", ".join(allow)}]\n'
        f"deny = [{', '.join(deny)}]\n"
    )
    with _applied(text, "pins") as (name, nft, link, profile, sites):
        pins = {s: n for s, n in _sets(name).items() if s.startswith("pin_")}
        assert pins == {"pin_g0_d0": 0, "pin_g0_a0": 0, "pin_g0_a1": 0}, pins
        assert len([s for s in sites.values() if s.pins is not None]) == 3
        tags = [p.tag for p in pin_rules(profile, "d7.y.example")]
        assert tags == ["a1.1507"], tags
        nft.run(batch(*pin_elements(link, ["203.0.113.7", "203.0.113.8"], 60, tags, Limits())))
        assert _sets(name)["pin_g0_a1"] == 2
        nft.run(batch(*guest_remove(link, sites.values(), profile)))
        assert not [s for s in _sets(name) if s.startswith("pin_")]


def test_the_commit_monitor_sees_a_large_commit_whole() -> None:
    """The gateway's commit monitor (net/nft.py) listens while the gateway adds a 100,000-rule
    guest: the kernel sends it a message per set element before the commit's NEWGEN, and the
    loop that would drain it is the one committing. Lost messages would read as another's
    commit (gateway/selfcheck.py). 60,000 elements: twice the 100,000-rule bench's."""
    name = f"sg-bigcommit-{secrets.token_hex(3)}"
    ns.create(name)
    worker = ns.NsThread(name)
    try:

        def inside() -> tuple[int, int]:
            monitor = CommitMonitor()
            try:
                nft = Nft()
                elems = [f"11.{i >> 16}.{i >> 8 & 255}.{i & 255}" for i in range(60_000)]
                table = {"family": "inet", "table": TABLE}
                nft.run(
                    batch(
                        {"add": {"table": {"family": "inet", "name": TABLE}}},
                        {"add": {"set": {**table, "name": "big", "type": "ipv4_addr"}}},
                        {"add": {"element": {**table, "name": "big", "elem": elems}}},
                    )
                )
                nft.close()
                seen = 0
                for _ in range(200):  # drained to the NEWGEN; an overrun shows on reading
                    seen += len(monitor.read())
                    if seen or monitor.overruns:
                        break
                return seen, monitor.overruns
            finally:
                monitor.close()

        seen, lost = worker.call(inside)
    finally:
        worker.close()
        ns.remove(name)
    assert (seen, lost) == (1, 0)
