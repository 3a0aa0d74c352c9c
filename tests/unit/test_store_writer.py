"""The store's writer process (events/writer.py): what the gateway's sink stores through it is
what the in-process writer stores, in order, chained and signed; a batch it refuses or a child
that dies loses nothing; closing it leaves no process."""

from __future__ import annotations

import io
import os
import signal
import time
from pathlib import Path

import pytest

from sandgate.events import writer
from sandgate.events.schema import Event, FrozenDetails, Kind, encode_row
from sandgate.events.store import Store
from sandgate.gateway.logs.procparse import ProcInfo, Role
from sandgate.gateway.sink import EventSink


def _sink(path: Path, own_process: bool) -> EventSink:
    return EventSink(
        Store(path), lambda guest: "s1", lambda guest: False, lambda k, u, t: None,
        own_process=own_process,
    )  # fmt: skip


def _details(i: int) -> dict[str, object]:
    """Details of every shape the child encodes, or (the enum, in the second batch only) the
    daemon encodes for it: the stored rows must not tell which."""
    shapes: list[dict[str, object]] = [
        {"qtype": "A", "answers": [f"192.0.2.{i % 250}"]},
        {},
        FrozenDetails.of({"qtype": "A", "hit": True}),
        {"nested": {"b": [1, 2.5, True, None]}, "pair": (1, "x"), "z": -3},
        {"kind": Kind.DNS} if 700 <= i < 1400 else {"note": "é ünïcode"},
    ]
    return shapes[i % len(shapes)]


def _event(i: int) -> Event:
    return Event(
        kind=Kind.DNS, ts=1_800_000_000.0 + i, guest="sg-g1", verdict="allow",
        reason="allow.domain", src="10.200.0.2", dst="10.200.0.1", port=53, protocol="udp",
        name=f"q{i}.example.test", uid=1000 + i % 3, details=_details(i),
    )  # fmt: skip


def _stored(path: Path) -> list[tuple[object, ...]]:
    store = Store(path)
    try:
        rows = store._db.execute("SELECT * FROM events ORDER BY id").fetchall()
        return [tuple(r)[:-1] for r in rows]  # the hash apart: each chain has its own genesis
    finally:
        store.close()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_process_stores_what_the_thread_stores(tmp_path: Path) -> None:
    results = []
    for own in (True, False):
        path = tmp_path / f"events-{own}.db"
        sink = _sink(path, own)
        assert (sink.writer_pid is not None) is own
        for start, end in ((0, 700), (700, 1400), (1400, 1850)):  # the first two not waited for
            for i in range(start, end):
                sink.emit(_event(i))
            sink.flush(wait=end == 1850)
        assert len(_stored(path)) == 1850  # stored by the time flush() returns
        sink.close()
        verification = Store(path).verify()
        assert verification.ok, verification.summary()
        assert verification.events == 1850 and verification.checkpoints == 3
        results.append(_stored(path))
    assert results[0] == results[1]
    assert [r[13] for r in results[0][:2]] == ["q0.example.test", "q1.example.test"]


def test_close_ends_the_child(tmp_path: Path) -> None:
    sink = _sink(tmp_path / "events.db", True)
    pid = sink.writer_pid
    assert pid is not None and _alive(pid)
    sink.emit(_event(1))
    sink.close()
    assert not _alive(pid)
    assert len(_stored(tmp_path / "events.db")) == 1


def test_a_child_that_dies_loses_nothing(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "events.db"
    sink = _sink(path, True)
    sink.emit(_event(0))
    sink.flush()
    pid = sink.writer_pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)  # ours: started by this sink
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    for i in range(1, 50):
        sink.emit(_event(i))
    sink.flush()
    sink.emit(_event(50))
    sink.flush()
    assert sink.writer_pid is None
    assert "writer process ended" in capfd.readouterr().err
    sink.close()
    assert [r[13] for r in _stored(path)] == [f"q{i}.example.test" for i in range(51)]
    assert Store(path).verify().ok


def test_a_refused_batch_is_reported_and_the_next_one_stored(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "events.db"
    child = writer.Child(path, lambda rows: pytest.fail("the child is alive"))
    child.add([("not", "a", "row")])  # too few values: the chain refuses it
    child.add([_event(7).row()])
    child.close()
    assert "refused a batch" in capfd.readouterr().err
    assert [r[13] for r in _stored(path)] == ["q7.example.test"]


def test_frames_round_trip_and_a_cut_one_is_the_end() -> None:
    rows = [_event(i).row() for i in range(3)] + [(None, 1, 2.5, "x")]
    data = writer.frame(rows) + writer.frame([])
    f = io.BytesIO(data)
    assert writer.read_frame(f) == rows
    assert writer.read_frame(f) == []
    assert writer.read_frame(f) is None
    assert writer.read_frame(io.BytesIO(writer.frame(rows)[:-1])) is None


def test_the_child_encodes_details_as_the_daemon_would(tmp_path: Path) -> None:
    """Plain details cross as data and are encoded by the child (``serve``); a detail marshal
    cannot carry is refused by ``frame``, so the daemon encodes that batch itself."""
    plain = [_event(i) for i in range(700)]
    raw = [e.raw_row() for e in plain]
    assert any(isinstance(r[-1], dict) for r in raw)  # sent as data, not as JSON
    out = io.BytesIO()
    writer.serve(tmp_path / "child.db", io.BytesIO(writer.frame(raw)), out)
    assert out.getvalue() == b"ok\n"
    Store(tmp_path / "daemon.db").add(plain)
    assert _stored(tmp_path / "child.db") == _stored(tmp_path / "daemon.db")
    with pytest.raises(ValueError):
        writer.frame([_event(704).raw_row()])  # {"kind": Kind.DNS}: a str subclass


def test_a_process_in_the_details_crosses_as_data() -> None:
    """What attribution adds to an event (a process's ``details()``) is plain data: were its
    role the enum, every attributed batch would be encoded on the daemon's loop instead."""
    info = ProcInfo(
        pid=41, exe="/usr/bin/pip", cmdline=["pip", "install", "x"], chain=[(41, "pip")],
        role=Role.TOOL, parents=("/usr/bin/bash",),
    )  # fmt: skip
    event = _event(0).but(details={"qtype": "A", "process": info.details()})
    writer.frame([event.raw_row()])  # marshal refuses any enum, any object
    assert encode_row(event.raw_row()) == event.row()


def test_only_the_row_marshal_cannot_carry_is_encoded_by_the_daemon() -> None:
    events = [_event(i) for i in range(700, 710)]  # 704: {"kind": Kind.DNS}
    _, rows = writer.Child.pack(events)
    assert [isinstance(r[-1], str) for r in rows] == [False, False, True, False, True] * 2
    assert [encode_row(r) for r in rows] == [e.row() for e in events]
