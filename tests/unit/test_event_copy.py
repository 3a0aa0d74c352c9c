"""``Event.but`` is ``dataclasses.replace`` without its cost (issue 13: every DNS answer's event
is copied when it is joined with its sender). Differential: for generated events and changes,
the copy equals replace's, leaves the original as it was, and stores the same row."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandgate.events.schema import FIELDS, Event, Kind, category_of
from sandgate.policy.decide import Decision, Reason, allow, deny

TEXT = st.one_of(st.none(), st.text(max_size=8))
NUMBER = st.one_of(st.none(), st.integers(0, 70000))
VALUES: dict[str, st.SearchStrategy[Any]] = {
    "kind": st.sampled_from(list(Kind)),
    "ts": st.floats(0, 2e9),
    "port": NUMBER,
    "uid": NUMBER,
    "pid": NUMBER,
    "count": st.integers(1, 1000),
    "details": st.dictionaries(st.text(max_size=4), st.integers(), max_size=3),
}


def _value(name: str) -> st.SearchStrategy[Any]:
    return VALUES.get(name, TEXT)


EVENTS = st.builds(Event, **{name: _value(name) for name in FIELDS})
CHANGES = st.sampled_from(FIELDS).flatmap(
    lambda first: st.fixed_dictionaries(
        {first: _value(first)},
        optional={name: _value(name) for name in FIELDS if name != first},
    )
)


@given(EVENTS, CHANGES)
def test_but_is_what_replace_makes(event: Event, changes: dict[str, Any]) -> None:
    before = event.row()
    copy = event.but(**changes)
    want = dataclasses.replace(event, **changes)
    assert copy == want and type(copy) is Event
    assert copy.row() == want.row()
    assert event.row() == before  # the original is untouched
    with pytest.raises(dataclasses.FrozenInstanceError):
        copy.uid = 1  # type: ignore[misc]


def test_an_unknown_field_is_refused_as_replace_refuses_it() -> None:
    event = Event(kind=Kind.DNS)
    with pytest.raises(TypeError):
        dataclasses.replace(event, nope=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="nope"):
        event.but(nope=1)


# Event.attempt builds its event without __init__ (events/schema.py): it must be the event the
# constructor makes from the same decision and fields.
DECISIONS = st.one_of(
    st.none(),
    st.builds(
        lambda allowed, reason, detail: (allow if allowed else deny)(reason, detail=detail),
        st.booleans(),
        st.sampled_from(list(Reason)),
        st.text(max_size=6),
    ),
)
EXTRA = st.fixed_dictionaries(
    {},
    optional={n: _value(n) for n in ("session", "guest", "src", "dst", "name", "uid", "count")}
    | {"details": VALUES["details"], "ts": VALUES["ts"]},
)


@given(
    st.sampled_from(list(Kind)),
    DECISIONS,
    st.sampled_from((None, "udp", "tcp", "icmp")),
    NUMBER,
    st.one_of(st.none(), st.sampled_from(("dns", "web"))),
    EXTRA,
)
def test_attempt_is_what_the_constructor_makes(
    kind: Kind,
    decision: Decision | None,
    protocol: str | None,
    port: int | None,
    category: str | None,
    extra: dict[str, Any],
) -> None:
    made = Event.attempt(kind, decision, protocol=protocol, port=port, category=category, **extra)
    want = Event(
        kind=kind,
        verdict=decision.verdict.value if decision is not None else None,
        reason=decision.key if decision is not None else None,
        rule=decision.rule_ref if decision is not None else None,
        protocol=protocol,
        port=port,
        category=category or category_of(protocol, port).value,
        **{"ts": made.ts, **extra},
    )
    assert made == want and type(made) is Event
    assert made.row() == want.row()
    assert list(made.__dict__) == list(want.__dict__)  # the same fields, in the same order
    assert made.details is not Event.attempt(kind, decision).details  # a dict of its own
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.uid = 1  # type: ignore[misc]


def test_attempt_refuses_a_field_it_does_not_take() -> None:
    with pytest.raises(TypeError, match="nope"):
        Event.attempt(Kind.DNS, None, nope=1)
    with pytest.raises(TypeError, match="verdict"):
        Event.attempt(Kind.DNS, None, verdict="allow")
