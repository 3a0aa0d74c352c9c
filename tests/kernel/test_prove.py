"""`sandgate prove` in the test world: every probe runs and passes in every mode, and the
catalogue fails when the gateway is weakened behind the policy's back."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sandgate.prove.runner import ProveOptions, ProveResult, prove_on
from sandgate.session.stack import Stack

pytestmark = pytest.mark.kernel


def _prove(stack: Stack, store_path: Path, mode: str) -> ProveResult:
    return prove_on(stack, ProveOptions(world="test", mode=mode, store=str(store_path)))


@pytest.mark.parametrize("mode", ["locked", "open", "allowlist"])
def test_every_probe_runs_and_passes(stack: Stack, store_path: Path, mode: str) -> None:
    result = _prove(stack, store_path, mode)
    totals = result.totals()
    assert totals["SKIP"] == 0
    assert len(result.results) >= 40
    assert not result.failed, "\n".join(f"{r.probe}: {r.why}" for r in result.failed)
    groups = {r.group for r in result.results}
    assert {
        "special ranges",
        "metadata",
        "lan",
        "gateway",
        "lateral",
        "dns",
        "internet",
        "proxy",
        "credentials",
        "sandbox",
        "ipv6",
        "l2",
        "host",
    } <= groups


def test_a_rule_added_behind_the_policys_back_makes_prove_fail(
    stack: Stack, store_path: Path
) -> None:
    ns = f"--net=/proc/{stack.gateway.pid}/ns/net"
    rule = [
        "nft",
        "insert",
        "rule",
        "inet",
        "sandgate",
        "forward",
        "ip",
        "daddr",
        "10.77.0.0/24",
        "accept",
    ]
    subprocess.run(["nsenter", ns, *rule], check=True)
    try:
        result = _prove(stack, store_path, "open")
    finally:
        listing = subprocess.run(
            ["nsenter", ns, "nft", "-a", "list", "chain", "inet", "sandgate", "forward"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        handle = next(
            line.rsplit("# handle ", 1)[1]
            for line in listing.splitlines()
            if "10.77.0.0/24 accept" in line
        )
        subprocess.run(
            [
                "nsenter",
                ns,
                "nft",
                "delete",
                "rule",
                "inet",
                "sandgate",
                "forward",
                "handle",
                handle,
            ],
            check=True,
        )
    leaks = [r for r in result.failed if r.why.startswith("LEAK")]
    assert {r.probe for r in leaks} >= {"NAS 22/tcp", "NAS 445/tcp", "model server port 22"}
