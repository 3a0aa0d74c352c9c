"""The watchdog's ruleset digest from nft's text (integrity.live_digest), in a scratch namespace:
what the gateway changes by design leaves it alone, anything else changes it."""

from __future__ import annotations

import ipaddress
import os
import secrets
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from sandgate.gateway.integrity import live_digest
from sandgate.net import ns
from sandgate.net.compile import TABLE, GuestLink, Limits, base_ruleset, guest_add, pin_elements
from sandgate.net.nft import Commit, CommitMonitor, Nft, NftIn, batch
from sandgate.policy.load import load_policy
from sandgate.policy.model import Mode
from sandgate.policy.pins import pinned_rules
from sandgate.policy.profile import Profile

POOL = ipaddress.ip_network("10.201.0.0/16")
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")


@pytest.fixture
def nft() -> Iterator[NftIn]:
    name = f"sg-digest-{secrets.token_hex(3)}"
    ns.create(name)
    worker = ns.NsThread(name)
    try:
        yield Nft.on(worker)
    finally:
        worker.close()
        ns.remove(name)


def _profile(link: GuestLink) -> Profile:
    return load_policy(None).profile(
        None,
        mode=Mode.ALLOWLIST,
        extra_allow=("example.com",),  # a name: its addresses are pinned into a timed set
        gateway_address=link.gateway,
        guest_pool=POOL,
    )


def _guest(nft: NftIn, index: int) -> GuestLink:
    link = GuestLink.from_pool(POOL, index, f"02:00:00:00:01:{index:02x}")
    cmds, _ = guest_add(link, _profile(link), Limits())
    nft.run(batch(*cmds))
    return link


def test_digest_follows_rules_not_counts_or_pins(nft: NftIn) -> None:
    cmds, _ = base_ruleset("up0", POOL, limits=Limits())
    nft.run(batch(*cmds))
    first = _guest(nft, 0)
    _guest(nft, 1)
    lister = nft
    digest = live_digest(lister)
    assert live_digest(lister) == digest  # the same rules, the same digest
    pins = pinned_rules(_profile(first))
    assert pins
    # A pinned address (a set that times out) is the resolver's, by design: unchanged.
    nft.run(batch(*pin_elements(first, ["203.0.113.7"], 60, (pins[0].tag,), Limits())))
    assert live_digest(lister) == digest
    # A verdict-map element taken away (a set that does not time out): changed.
    spec = {"family": "inet", "table": TABLE, "name": "fwd", "elem": [first.ifname]}
    nft.run(batch({"delete": {"element": spec}}))
    changed = live_digest(lister)
    assert changed != digest
    # A rule taken out of a guest chain: changed again.
    listing = nft.run(
        {
            "nftables": [
                {
                    "list": {
                        "chain": {"family": "inet", "table": TABLE, "name": f"fwd_{first.ifname}"}
                    }
                }
            ]
        }
    )
    rule = next(i["rule"] for i in (listing or {})["nftables"] if "rule" in i)
    nft.run(
        batch(
            {
                "delete": {
                    "rule": {
                        "family": "inet",
                        "table": TABLE,
                        "chain": rule["chain"],
                        "handle": rule["handle"],
                    }
                }
            }
        )
    )
    assert live_digest(lister) not in (digest, changed)


def test_commit_monitor_tells_our_commits_from_others() -> None:
    """The watchdog's O(1) test: every transaction is reported with the task that made it."""
    name = f"sg-digest-{secrets.token_hex(3)}"
    ns.create(name)
    worker = ns.NsThread(name)
    try:

        def inside() -> tuple[list[Commit], int]:
            monitor = CommitMonitor()
            try:
                nft = Nft()
                nft.run(batch({"add": {"table": {"family": "inet", "name": TABLE}}}))
                subprocess.run(["nft", "add", "chain", "inet", TABLE, "x"], check=True)
                time.sleep(0.05)
                return monitor.read(), threading.get_native_id()
            finally:
                monitor.close()

        commits, tid = worker.call(inside)
    finally:
        worker.close()
        ns.remove(name)
    assert len(commits) == 2, commits
    assert commits[0].pid == tid  # ours: the thread that committed
    assert commits[1].name == "nft" and commits[1].pid not in (tid, os.getpid())
