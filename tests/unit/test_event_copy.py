"""``Event.but`` is ``dataclasses.replace`` without its cost (issue 13: every DNS answer's event
is copied when it is joined with its sender). Differential: for generated events and changes,
the copy equals replace's, leaves the original as it was, and stores the same row."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandgate.events.schema import FIELDS, Event, Kind

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
