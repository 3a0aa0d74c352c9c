"""An answer's address, judged once per profile (policy/decide.py ``answer_refusal``): what the
resolver hears from the memo is what ``decide_answer`` says with nothing remembered, for
random profiles, names and addresses, asked in any order and more than once."""

from __future__ import annotations

import dataclasses
import ipaddress
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandgate.policy import decide as decide_mod
from sandgate.policy.decide import answer_refusal, decide_answer
from sandgate.policy.load import parse_policy
from sandgate.policy.profile import Profile

DOMAINS = ("a.example.com", "*.example.com", "x.b.example.com", "localhost.example.com")
NAMES = ("a.example.com", "x.b.example.com", "example.com", "other.org")
NETS = ("10.0.0.0/8", "10.1.2.3/32", "203.0.113.0/24", "192.168.0.0/16", "169.254.169.254/32")
ADDRESSES = (
    "10.1.2.3",  # private, opened by some profiles
    "10.201.0.6",  # another guest (the default guest pool)
    "10.201.0.1",  # this guest's gateway
    "203.0.113.5",  # public here (public_override)
    "198.51.100.1",  # documentation: special
    "169.254.169.254",  # metadata
    "127.0.0.1",
    "8.8.8.8",
    "::ffff:10.1.2.3",  # mapped: judged as 10.1.2.3, the same memo entry
    "::ffff:8.8.8.8",
    "2001:db8::1",
    "fd00::1",
)


def _rule(kind: str, target: str, port: int | None) -> str:
    scope = f", port = {port}" if port is not None else ""
    return f'{{ {kind} = "{target}"{scope} }}'


rule = st.one_of(
    st.builds(_rule, st.just("domain"), st.sampled_from(DOMAINS), st.sampled_from((None, 22))),
    st.builds(_rule, st.just("cidr"), st.sampled_from(NETS), st.sampled_from((None, 443))),
)


@st.composite
def profiles(draw: st.DrawFn) -> Profile:
    mode = draw(st.sampled_from(("locked", "open", "allowlist")))
    allow = draw(st.lists(rule, max_size=6, unique=True))
    deny = draw(st.lists(rule, max_size=3, unique=True))
    text = f'[profiles.p]\ninternet = "{mode}"\nallow = [{", ".join(allow)}]\n'
    text += f"deny = [{', '.join(deny)}]\n"
    try:
        return parse_policy(text.encode(), "m.toml").profile(
            "p",
            public_override=(ipaddress.ip_network("203.0.113.0/24"),),
            gateway_address=ipaddress.ip_address("10.201.0.1"),
            uplink_ipv6=draw(st.booleans()),
        )
    except Exception:  # a policy the loader refuses (a repeat, a dead allow rule)
        from hypothesis import reject

        reject()


def _afresh(profile: Profile, name: str, address: Any) -> tuple[str, str | None, str]:
    """decide_answer on a copy of the profile with an index (and so a memo) of its own."""
    d = decide_answer(dataclasses.replace(profile), name, address)
    return d.key, d.rule_ref, d.detail


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(
    profiles(),
    st.lists(
        st.tuples(st.sampled_from(NAMES), st.sampled_from(ADDRESSES)), min_size=1, max_size=16
    ),
)
def test_the_memo_answers_as_a_fresh_verdict(profile: Profile, asks: list[Any]) -> None:
    for name, text in asks + asks:  # every address met again: the second time from the memo
        address = ipaddress.ip_address(text)
        fresh = _afresh(profile, name, address)
        refused = answer_refusal(profile, name, address)
        if refused is None:
            assert fresh[0] == "allow.answer", (name, text, fresh)
        else:
            assert (refused.key, refused.rule_ref, refused.detail) == fresh, (name, text)
        d = decide_answer(profile, name, address)
        assert (d.key, d.rule_ref, d.detail) == fresh, (name, text)


def test_a_full_memo_starts_again(monkeypatch: Any) -> None:
    monkeypatch.setattr(decide_mod, "_ANSWER_MEMO_MAX", 4)
    profile = parse_policy(b'[profiles.p]\ninternet = "open"\n', "m.toml").profile("p")
    memo_of = lambda: profile.index.memo[decide_mod._ANSWER_MEMO]  # noqa: E731
    for i in range(1, 11):
        assert answer_refusal(profile, "a.example.com", ipaddress.ip_address(f"8.8.8.{i}")) is None
        assert 1 <= len(memo_of()) <= 4
    # A refused address is never remembered as fine, however often it is asked.
    for _ in range(3):
        refused = answer_refusal(profile, "a.example.com", ipaddress.ip_address("127.0.0.1"))
        assert refused is not None and refused.key == "deny.rebinding"
    assert 2130706433 not in memo_of()
