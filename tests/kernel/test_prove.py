"""`sandgate prove` in the test world: every probe runs and passes in every mode, and the
catalogue fails when the gateway is weakened behind the policy's back."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


@contextlib.contextmanager
def accepted_behind_the_policys_back(stack: Stack, daddr: str) -> Iterator[None]:
    """``ip daddr DADDR accept`` at the top of the gateway's forward chain, for the block."""
    ns = f"--net=/proc/{stack.gateway.pid}/ns/net"
    chain = ["inet", "sandgate", "forward"]
    subprocess.run(
        ["nsenter", ns, "nft", "insert", "rule", *chain, "ip", "daddr", daddr, "accept"], check=True
    )
    try:
        yield
    finally:
        listing = subprocess.run(
            ["nsenter", ns, "nft", "-a", "list", "chain", *chain],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        handles = [
            line.rsplit("# handle ", 1)[1]
            for line in listing.splitlines()
            if f"{daddr} accept" in line
        ]
        for handle in handles:  # none: the watchdog's repair took it out already
            subprocess.run(
                ["nsenter", ns, "nft", "delete", "rule", *chain, "handle", handle], check=True
            )


def test_a_rule_added_behind_the_policys_back_makes_prove_fail(
    stack: Stack, store_path: Path
) -> None:
    with accepted_behind_the_policys_back(stack, "10.77.0.0/24"):
        result = _prove(stack, store_path, "open")
    leaks = [r for r in result.failed if r.why.startswith("LEAK")]
    assert {r.probe for r in leaks} >= {"NAS 22/tcp", "NAS 445/tcp", "model server port 22"}


def test_a_weakened_decide_is_caught_by_the_never_rules(
    stack: Stack, store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """decide() and the gateway weakened together (guest to guest allowed): expectation and
    observation agree, and only the invariant can tell."""
    from sandgate.policy import decide as decide_module
    from sandgate.prove import catalogue

    real = decide_module.decide

    def weakened(profile: Any, attempt: Any) -> Any:
        a = attempt.address
        if a is not None and a in profile.guest_pool and a != profile.gateway_address:
            return decide_module.allow(decide_module.Reason.RULE_ALLOW, detail="weakened")
        return real(profile, attempt)

    monkeypatch.setattr(catalogue, "decide", weakened)
    pool = stack.config.guest_pool if stack.config else "10.201.0.0/16"
    with accepted_behind_the_policys_back(stack, pool):
        result = _prove(stack, store_path, "open")
    lateral = next(r for r in result.results if r.group == "lateral")
    assert lateral.expected == "allow" and lateral.observed == "allow"
    assert lateral.result == "FAIL"
    assert "policy and invariant disagree" in lateral.why and "never.lateral" in lateral.why
