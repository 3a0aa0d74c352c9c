"""The store inserts a batch with one statement per INSERT_CHUNK rows (events/chain.py
``_insert``: a thread switch per statement, not per row; issue 13). Differential: a batch
across chunk boundaries is stored exactly as one statement per row stores it, and the chain
verifies."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandgate.events import chain
from sandgate.events.schema import FIELDS, Event, Kind
from sandgate.events.store import Store


def _events(n: int) -> list[Event]:
    return [
        Event(
            kind=Kind.DNS,
            ts=1000.0 + i,
            session="s",
            guest="sg-l1",
            verdict="allow",
            name=f"q{i}.example",
            port=53,
            uid=61000 if i % 3 else None,
            count=1 + i % 5,
            details={"qtype": "A", "answers": [f"203.0.113.{i % 250}"]} if i % 2 else {},
        )
        for i in range(n)
    ]


def _stored(path: Path, batches: list[list[Event]]) -> list[tuple[object, ...]]:
    store = Store(path)
    for batch in batches:
        store.add(batch)
    assert store.verify().ok
    rows = store._db.execute(f"SELECT id, {','.join(FIELDS)} FROM events ORDER BY id").fetchall()
    store.close()
    return [tuple(r) for r in rows]


@pytest.mark.parametrize("sizes", [[1], [255, 256, 257], [600, 3, 513]])
def test_chunked_inserts_store_what_one_row_per_statement_stores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sizes: list[int]
) -> None:
    events = _events(sum(sizes))
    batches, at = [], 0
    for size in sizes:
        batches.append(events[at : at + size])
        at += size
    chunked = _stored(tmp_path / "chunked.db", batches)
    monkeypatch.setattr(chain, "INSERT_CHUNK", 1)  # the slow path: a statement per row
    one_by_one = _stored(tmp_path / "rows.db", batches)
    assert chunked == one_by_one
    assert [r[0] for r in chunked] == list(range(1, len(events) + 1))
