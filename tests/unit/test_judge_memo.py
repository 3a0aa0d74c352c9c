"""A connection's remembered verdicts (flow.Judgements) against judging afresh (flow.judge).

Differential: a long random run of requests on one connection, as an inspected keep-alive
connection makes them (names, literal addresses, ports, methods and paths under request rules,
processes under process rules), while the name's answers change (rebinding to an address the
policy refuses, or back) and the guest's profile is swapped (a reload, an approval). Every
verdict must equal the fresh one, and the name must be resolved as often as before.
"""

from __future__ import annotations

import ipaddress
import random

from sandgate.gateway.proxy.flow import Judgements, judge
from sandgate.policy.load import parse_policy
from sandgate.policy.model import IPAddress
from sandgate.policy.profile import Profile

PUBLIC = (ipaddress.ip_network("203.0.113.0/24"),)
POLICY = b"""
[profiles.wide]
internet = "open"
deny = [ { domain = "bad.test" } ]

[profiles.narrow]
internet = "allowlist"
allow = [
  { domain = "api.test", port = 443, http = ["GET /v1/*", "POST /v1/chat"] },
  { domain = "git.test", process = ["/usr/bin/git"] },
  { host = "203.0.113.7", port = 443 },
]
"""
NAMES = [None, "api.test", "git.test", "bad.test", "other.test", "203.0.113.7", "127.0.0.1"]
ADDRESSES = [ipaddress.ip_address(a) for a in ("203.0.113.7", "203.0.113.9", "10.0.0.5")]
ANSWERS: list[list[IPAddress]] = [
    [ipaddress.ip_address("203.0.113.5")],
    [ipaddress.ip_address("203.0.113.5"), ipaddress.ip_address("203.0.113.6")],
    [ipaddress.ip_address("203.0.113.5"), ipaddress.ip_address("127.0.0.1")],  # rebinding
    [],  # NXDOMAIN
]
REQUESTS = [None, ("GET", "/v1/models"), ("POST", "/v1/chat"), ("GET", "/admin"), ("PUT", "/v1/x")]
PROCESSES = [None, ("/usr/bin/git", ("/bin/sh",)), ("/usr/bin/curl", ()), (None, ())]


def profiles() -> list[Profile]:
    """Two profiles, each loaded twice: equal content, distinct objects (a reload)."""
    out = []
    for _ in range(2):
        policy = parse_policy(POLICY, "memo.toml")
        out += [policy.profile(p, public_override=PUBLIC) for p in ("wide", "narrow")]
    return out


def test_remembered_verdicts_equal_fresh_ones_over_a_random_run() -> None:
    rng = random.Random(13)
    choices = profiles()
    memo = Judgements(bound=8)  # small: entries are also evicted and judged again
    answers = ANSWERS[0]
    asked = {"memo": 0, "fresh": 0}

    def resolver(who: str):  # type: ignore[no-untyped-def]
        def resolve(name: str) -> list[IPAddress]:
            asked[who] += 1
            return list(answers)

        return resolve

    profile = choices[0]
    for step in range(3000):
        if rng.random() < 0.05:
            answers = rng.choice(ANSWERS)
        if rng.random() < 0.03:
            profile = rng.choice(choices)
        if step == 0 or rng.random() < 0.4:  # else the same request again, as clients do
            name = rng.choice(NAMES)
            address = rng.choice(ADDRESSES) if name is None else None
            port = rng.choice((443, 443, 80))
            request = rng.choice(REQUESTS)
            process = rng.choice(PROCESSES)
        got = memo(profile, name, address, port, resolver("memo"), request, process)
        want = judge(profile, name, address, port, resolver("fresh"), request, process)
        assert got == want, (step, profile.name, name, address, port, request, process, answers)
        assert asked["memo"] == asked["fresh"], step  # resolved exactly as often as before
    assert memo.hits > 1000  # the run did exercise remembered verdicts
    assert memo.hits < 2500  # and fresh ones


def test_a_swapped_profile_is_judged_afresh_even_when_equal() -> None:
    """A reload's profile may compare equal to the old one: it is still another object, and
    judged anew (identity, never equality, selects a remembered verdict)."""
    wide, narrow, wide2, _ = profiles()
    memo = Judgements()

    def resolve(name: str) -> list[IPAddress]:
        return [ipaddress.ip_address("203.0.113.5")]

    first = memo(wide, "api.test", None, 443, resolve, ("GET", "/admin"))
    assert first.decision.allowed and memo.hits == 0
    assert not memo(narrow, "api.test", None, 443, resolve, ("GET", "/admin")).decision.allowed
    memo(wide2, "api.test", None, 443, resolve, ("GET", "/admin"))
    assert memo.hits == 0
    memo(wide2, "api.test", None, 443, resolve, ("GET", "/admin"))
    assert memo.hits == 1
