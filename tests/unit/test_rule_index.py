"""The rule index (policy/index.py) gives ``decide()`` the answer of the linear scan: random
profiles with overlapping networks, nested wildcards and scopes, random attempts, judged with
the index and with every rule as a candidate (the scan it replaces)."""

from __future__ import annotations

import dataclasses
import ipaddress
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandgate.policy.decide import Attempt, decide, decide_answer
from sandgate.policy.index import RuleIndex
from sandgate.policy.load import parse_policy
from sandgate.policy.model import Protocol
from sandgate.policy.pins import pin_rules
from sandgate.policy.profile import Profile

DOMAINS = ("a.example.com", "*.example.com", "*.b.example.com", "x.b.example.com", "example.com")
NAMES = ("a.example.com", "x.b.example.com", "y.b.example.com", "example.com", "other.org", "com")
NETS = ("10.0.0.0/8", "10.1.0.0/16", "10.1.2.0/24", "10.1.2.3/32", "203.0.113.0/24", "0.0.0.0/0")
ADDRESSES = ("10.1.2.3", "10.1.2.4", "10.9.0.1", "203.0.113.5", "198.51.100.1", "::ffff:10.1.2.3")
PORTS = (None, 22, 443, "8000-8100")


def _rule(kind: str, target: str, port: Any, proto: str | None) -> str:
    scope = f", port = {port!r}".replace("'", '"') if port is not None else ""
    scope += f', protocol = "{proto}"' if proto else ""
    return f'{{ {kind} = "{target}"{scope} }}'


rule = st.one_of(
    st.builds(
        _rule,
        st.just("domain"),
        st.sampled_from(DOMAINS),
        st.sampled_from(PORTS),
        st.sampled_from((None, "udp")),
    ),
    st.builds(
        _rule,
        st.just("cidr"),
        st.sampled_from(NETS),
        st.sampled_from(PORTS),
        st.sampled_from((None, "udp")),
    ),
)


@st.composite
def profiles(draw: st.DrawFn) -> Profile:
    mode = draw(st.sampled_from(("locked", "open", "allowlist")))
    allow = draw(st.lists(rule, max_size=8, unique=True))
    deny = draw(st.lists(rule, max_size=4, unique=True))
    text = f'[profiles.p]\ninternet = "{mode}"\nallow = [{", ".join(allow)}]\n'
    text += f"deny = [{', '.join(deny)}]\n"
    try:
        return parse_policy(text.encode(), "r.toml").profile(
            "p", public_override=(ipaddress.ip_network("203.0.113.0/24"),)
        )
    except Exception:  # a policy the loader refuses (a repeat, a dead allow rule)
        from hypothesis import reject

        reject()


attempts = st.tuples(
    st.sampled_from((*ADDRESSES, None)),
    st.sampled_from((*NAMES, None)),
    st.sampled_from((None, 22, 443, 8080)),
    st.sampled_from(tuple(Protocol)),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(profiles(), st.lists(attempts, min_size=1, max_size=10))
def test_the_index_answers_as_the_scan(profile: Profile, tries: list[Any]) -> None:
    scan = dataclasses.replace(profile)
    scan.__dict__["index"] = RuleIndex.of(scan.allow, scan.deny, linear=True)
    for address, name, port, proto in tries:
        ip = ipaddress.ip_address(address) if address else None
        attempt = Attempt(proto, ip, port, name)
        fast, slow = decide(profile, attempt), decide(scan, attempt)
        assert (fast.key, fast.rule_ref, fast.detail) == (slow.key, slow.rule_ref, slow.detail)
        if name is not None:
            assert pin_rules(profile, name) == pin_rules(scan, name), name
            assert profile.proxied(name) == scan.proxied(name)
            if ip is not None:
                a, b = decide_answer(profile, name, ip), decide_answer(scan, name, ip)
                assert (a.key, a.rule_ref) == (b.key, b.rule_ref), (name, ip)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(profiles(), st.lists(attempts, min_size=1, max_size=12))
def test_a_lookup_asked_again_is_the_lookup_made_afresh(profile: Profile, tries: list[Any]) -> None:
    """``candidates`` answers a repeat from its last lookup: interleaved with others, every
    answer is the one a list with nothing remembered gives."""
    for address, name, _, _ in tries + tries[::-1]:
        ip = ipaddress.ip_address(address) if address else None
        for rules in (profile.index.allow, profile.index.deny):
            fresh = RuleIndex.of(rules.rules, ()).allow.candidates(ip, name)
            assert rules.candidates(ip, name) == fresh
            assert rules.candidates(ip, name) == fresh  # the repeat, from the last lookup
