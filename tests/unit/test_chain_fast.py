"""The store writer's fast paths against the plain code they replaced (issue 13): the canonical
form every event is hashed over, the well-typed check, and a row's details text. A fast path
that disagrees with the slow one is a bug: here it would break every old store's chain."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandgate.events import chain
from sandgate.events.chain import _TYPES, canonical, link, well_typed
from sandgate.events.schema import FIELDS, Event, Kind


def canonical_plain(seq: int, values: tuple[Any, ...]) -> bytes:
    """The definition (events/chain.py's docstring), as it was written before."""
    d = {k: v for k, v in zip(FIELDS, values, strict=True) if v is not None}
    d["seq"] = seq
    return json.dumps(d, sort_keys=True, separators=(",", ":")).encode()


def well_typed_plain(row: tuple[Any, ...]) -> bool:
    return all(v is None or type(v) is t for v, t in zip(row, _TYPES, strict=True))


scalars = st.one_of(
    st.none(),
    st.text(max_size=12),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
    st.booleans(),
)
rows = st.tuples(*[scalars for _ in FIELDS])
typed_rows = st.tuples(
    *[
        st.one_of(
            st.none(),
            st.floats(allow_nan=False, allow_infinity=False)
            if t is float
            else st.integers(0, 2**31)
            if t is int
            else st.text(max_size=12),
        )
        for t in _TYPES
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0, max_value=2**40), rows)
def test_canonical_is_the_plain_definition(seq: int, row: tuple[Any, ...]) -> None:
    assert canonical(seq, row) == canonical_plain(seq, row)
    assert link(b"p" * 32, seq, row) == link(b"p" * 32, seq, row)  # and it is deterministic


def test_canonical_of_a_full_row_keeps_the_sorted_keys() -> None:
    row = tuple(f"v{i}" for i in range(len(FIELDS)))
    text = canonical(7, row).decode()
    keys = list(json.loads(text))
    assert keys == sorted([*FIELDS, "seq"]) and '"seq":7' in text
    with pytest.raises(ValueError):
        canonical(1, row[:-1])


@settings(max_examples=300, deadline=None)
@given(st.one_of(rows, typed_rows))
def test_well_typed_is_the_plain_check(row: tuple[Any, ...]) -> None:
    chain._WELL_TYPED.clear()
    for _ in range(2):  # checked, then remembered
        assert well_typed(row) == well_typed_plain(row)


def test_a_bool_or_an_int_where_a_float_belongs_is_not_well_typed_even_after_a_good_row() -> None:
    good = Event(kind=Kind.DNS, ts=1.5, port=53, uid=0, name="a.test").row()
    assert well_typed(good)
    at = FIELDS.index("port")
    assert not well_typed((*good[:at], True, *good[at + 1 :]))
    at = FIELDS.index("ts")
    assert not well_typed((*good[:at], 1, *good[at + 1 :]))
    with pytest.raises(ValueError):
        well_typed(good[:-1])


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.text(max_size=6),
        st.recursive(
            scalars,
            lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
            max_leaves=6,
        ),
        max_size=5,
    )
)
def test_a_rows_details_text_is_json_dumps_with_sorted_keys(details: dict[str, Any]) -> None:
    text = Event(kind=Kind.DNS, details=details).row()[FIELDS.index("details")]
    assert text == (json.dumps(details, sort_keys=True) if details else None)
