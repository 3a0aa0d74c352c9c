"""Every parser that reads what a guest sends, fuzzed for a bounded time (fuzz/targets.py).

Each target's check asserts the parser's contract: a result or its documented "need more" /
"malformed" outcome, never another exception, and agreement with h11 or dnspython where that
is defined. ``fuzz/run`` runs the same targets for as long as asked.
"""

from __future__ import annotations

import pytest
from fuzz.targets import TARGETS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

# Bounded: each target stays well under ~2 s here.
_SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.mark.parametrize("name", sorted(TARGETS))
@_SETTINGS
@given(data=st.data())
def test_parser_keeps_its_contract(name: str, data: st.DataObject) -> None:
    target = TARGETS[name]
    target.check(data.draw(target.strategy, label=name))


def test_every_listed_parser_has_a_target() -> None:
    assert set(TARGETS) >= {
        "sni",
        "firstflight",
        "httphead",
        "aimed_at",
        "chunked",
        "dns_question",
        "dns_answer",
        "nflog",
        "nfqueue",
        "iphead",
        "sockdiag",
        "hostparse",
        "policy",
    }
