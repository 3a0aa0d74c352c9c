"""The store's hash chain and signed checkpoints, against a real SQLite file: a clean store
verifies; each way of tampering (the real ``sqlite3`` binary changing a verdict, a row deleted,
rows swapped, the tail cut, a checkpoint forged, rows inserted outside the chain) is named; a
store from before the chain opens, and says it cannot be verified."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import stat
import subprocess
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from typer.testing import CliRunner

from sandgate.cli import app
from sandgate.errors import SandgateError
from sandgate.events.chain import head_path, keys_dir, link
from sandgate.events.schema import FIELDS, Event, Kind
from sandgate.events.store import Store
from sandgate.events.verify import Break, Verification


def batch(session: str, n: int, start: int = 0) -> list[Event]:
    return [
        Event(
            kind=Kind.DNS,
            session=session,
            guest="g1",
            verdict="deny",
            reason="deny.not_allowed",
            name=f"host{start + i}.example",
            port=53,
            protocol="udp",
            details={"qtype": "A", "answers": [f"203.0.113.{i}"]},
        )
        for i in range(n)
    ]


@pytest.fixture
def store(tmp_path: Path) -> Store:
    """Events 1..30 in three batches (checkpoints #1..#3): sessions a (1..20) and b (21..30)."""
    s = Store(tmp_path / "events.db")
    s.add(batch("a", 10))
    s.add(batch("a", 10, 10))
    s.add(batch("b", 10, 20))
    return s


def sql(store: Store, statement: str) -> None:
    """Tamper from outside, with the real sqlite3 binary, as an attacker with the file would."""
    subprocess.run(["sqlite3", str(store.path), statement], check=True, timeout=30)


def broken(result: Verification) -> tuple[Break, int | None]:
    assert not result.ok, result.summary()
    p = result.problems[0]
    return p.why, p.event


def test_a_clean_chain_verifies(store: Store) -> None:
    result = store.verify()
    assert result.ok, result.summary()
    assert (result.events, result.checkpoints, result.start) == (30, 3, 1)
    assert result.summary().startswith("ok: 30 events in 3 signed checkpoints")
    assert store.verify("b").ok


def test_the_key_is_the_owners_alone(store: Store) -> None:
    d = keys_dir(store.path)
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert stat.S_IMODE((d / "store.ed25519").stat().st_mode) == 0o600
    os.chmod(d / "store.ed25519", 0o644)
    s = Store(store.path)
    s.add(batch("c", 1))  # not lost for want of a key, but not signed either
    assert broken(s.verify()) == (Break.UNSIGNED, 31)


def test_a_verdict_changed_with_sqlite3_names_the_row(store: Store) -> None:
    sql(store, "UPDATE events SET verdict='allow' WHERE id = 14")
    result = store.verify()
    assert broken(result) == (Break.CHANGED, 14)
    assert result.problems[0].session == "a"
    assert result.summary().startswith("event 14 (session a): changed")


def test_a_change_with_its_hashes_rewritten_still_names_the_row(store: Store) -> None:
    """The attacker knows the format and rewrites the chain from the row on: the hashes the
    checkpoint signed still name the row."""
    db = sqlite3.connect(store.path)
    db.execute("UPDATE events SET reason='allow.rule' WHERE id = 5")
    prev = bytes.fromhex(db.execute("SELECT hash FROM events WHERE id = 4").fetchone()[0])
    for row in db.execute(f"SELECT id, {','.join(FIELDS)} FROM events WHERE id >= 5").fetchall():
        prev = link(prev, row[0], row[1:])
        db.execute("UPDATE events SET hash = ? WHERE id = ?", [prev.hex(), row[0]])
    db.commit()
    assert broken(store.verify()) == (Break.CHANGED, 5)


def test_only_the_hash_column_altered(store: Store) -> None:
    sql(store, "UPDATE events SET hash = substr(hash, 2) || '0' WHERE id = 3")
    assert broken(store.verify()) == (Break.CHANGED, 3)


def test_a_deleted_row(store: Store) -> None:
    sql(store, "DELETE FROM events WHERE id = 12")
    result = store.verify()
    assert broken(result) == (Break.REMOVED, 12)
    assert "after event 11 (session a)" in result.summary()


def test_two_rows_swapped(store: Store) -> None:
    """Every column but the id exchanged (the order is the id): the row holds another's hash."""
    cols = ", ".join(f"{c} = (SELECT {c} FROM events WHERE id = 16 + 17 - e.id)"
                     for c in (*FIELDS, "hash"))  # fmt: skip
    sql(store, f"UPDATE events AS e SET {cols} WHERE id IN (16, 17)")
    result = store.verify()
    assert broken(result) == (Break.REORDERED, 16)
    assert "hash of event 17" in result.summary()


def test_a_cut_inside_the_last_batch(store: Store) -> None:
    sql(store, "DELETE FROM events WHERE id > 27")
    assert broken(store.verify()) == (Break.REMOVED, 28)


def test_a_cut_after_a_checkpoint_needs_the_head_record(store: Store) -> None:
    """Deleting the last batch with its checkpoint leaves a consistent database: only the head
    record kept outside it shows the cut. New events afterwards keep the gap."""
    sql(store, "DELETE FROM events WHERE id > 20; DELETE FROM checkpoints WHERE n = 3")
    result = store.verify()
    assert broken(result) == (Break.TRUNCATED, 21)
    assert "head record names checkpoint #3 (event 30)" in result.summary()
    store.add(batch("c", 2))
    assert broken(store.verify()) == (Break.REMOVED, 21)  # checkpoints #4.. follow #2


def test_what_a_cut_with_the_head_record_looks_like(store: Store, tmp_path: Path) -> None:
    """The limit, stated as a test: someone who can also write the keys dir (and so could read
    the key) can put back an old copy of both; the database alone proves nothing more. Without
    the record, verify refuses to pass."""
    store.close()
    old_db = (tmp_path / "events.db").read_bytes()
    old_head = head_path(tmp_path / "events.db").read_bytes()
    s = Store(tmp_path / "events.db")
    s.add(batch("later", 5))
    s.close()
    (tmp_path / "events.db").write_bytes(old_db)
    for wal in tmp_path.glob("events.db-*"):
        wal.unlink()
    head_path(tmp_path / "events.db").write_bytes(old_head)
    s = Store(tmp_path / "events.db")
    assert s.verify().ok  # rolled back together: not detectable
    head_path(tmp_path / "events.db").unlink()
    assert broken(s.verify()) == (Break.TRUNCATED, None)


def test_a_store_deleted_and_begun_again(store: Store, tmp_path: Path) -> None:
    store.close()
    for f in tmp_path.glob("events.db*"):
        f.unlink()
    s = Store(tmp_path / "events.db")
    assert broken(s.verify()) == (Break.TRUNCATED, None)
    assert "replaced or emptied" in s.verify().summary()
    s.add(batch("fresh", 2))  # a new chain: the old record is kept aside, the new one verifies
    assert s.verify().ok
    assert list(keys_dir(tmp_path / "events.db").glob("events.db.head.old-*"))


def test_a_forged_checkpoint_signature(store: Store) -> None:
    sig = store._db.execute("SELECT sig FROM checkpoints WHERE n = 2").fetchone()[0]
    forged = ("0" if sig[0] != "0" else "1") + sig[1:]
    sql(store, f"UPDATE checkpoints SET sig = '{forged}' WHERE n = 2")
    result = store.verify()
    assert broken(result) == (Break.BAD_SIGNATURE, 11)
    assert "checkpoint #2 (events 11..20)" in result.summary()


def test_a_checkpoint_re_signed_with_another_key(store: Store) -> None:
    """An attacker who rewrites a batch and signs it with a key of their own: the public key is
    read from the keys dir, not from the database."""
    from sandgate.events.chain import Checkpoint, genesis_of

    db = store._db
    chain = genesis_of(db)
    assert chain is not None
    db.execute("UPDATE events SET verdict = 'allow' WHERE id = 25")
    prev = bytes.fromhex(db.execute("SELECT hash FROM events WHERE id = 20").fetchone()[0])
    hashes = b""
    for row in db.execute(f"SELECT id, {','.join(FIELDS)} FROM events WHERE id > 20").fetchall():
        prev = link(prev, row[0], row[1:])
        hashes += prev
        db.execute("UPDATE events SET hash = ? WHERE id = ?", [prev.hex(), row[0]])
    cp = Checkpoint.from_row(db.execute("SELECT * FROM checkpoints WHERE n = 3").fetchone())
    mine = Ed25519PrivateKey.generate()
    fake = Checkpoint(**{**cp.__dict__, "hashes": hashes, "head": prev})
    sig = mine.sign(fake.message(chain[0]))
    db.execute("UPDATE checkpoints SET hashes = ?, head = ?, sig = ? WHERE n = 3",
               [hashes, prev.hex(), sig.hex()])  # fmt: skip
    db.commit()
    assert broken(store.verify()) == (Break.BAD_SIGNATURE, 21)


def test_a_row_inserted_outside_the_chain(store: Store) -> None:
    sql(store, "INSERT INTO events (ts, session, kind, verdict) VALUES (1, 'x', 'dns', 'allow')")
    assert broken(store.verify()) == (Break.UNCHAINED, 31)


OLD_SCHEMA = """
CREATE TABLE events (
    id INTEGER PRIMARY KEY,
    ts REAL NOT NULL,
    session TEXT, guest TEXT, kind TEXT NOT NULL, verdict TEXT, rule TEXT, reason TEXT,
    category TEXT, src TEXT, dst TEXT, port INTEGER, protocol TEXT, name TEXT,
    uid INTEGER, pid INTEGER, count INTEGER NOT NULL DEFAULT 1, details TEXT
);
CREATE TABLE sessions (
    id TEXT PRIMARY KEY, started REAL NOT NULL, ended REAL, mode TEXT, profile TEXT,
    policy TEXT, world TEXT, guest TEXT, uid INTEGER, command TEXT, exit_code INTEGER,
    details TEXT
);
"""


def test_a_store_from_before_the_chain(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    db = sqlite3.connect(path)
    db.executescript(OLD_SCHEMA)
    db.executemany(
        f"INSERT INTO events ({','.join(FIELDS)}) VALUES ({','.join('?' * len(FIELDS))})",
        [e.row() for e in batch("old", 3)],
    )
    db.commit()
    db.close()
    s = Store(path)
    assert [e.name for e in s.events(session="old")] == [f"host{i}.example" for i in range(3)]
    result = s.verify()
    assert broken(result) == (Break.NO_CHAIN, None)
    assert "this store has no chain: events before" in result.summary()
    s.add(batch("new", 4))
    result = s.verify()
    assert broken(result) == (Break.NO_CHAIN, None)
    assert "3 events before" in result.summary() and "chain starts at event 4" in result.summary()
    assert result.events == 4  # the chained part was checked all the same
    assert s.verify("new").ok
    assert not s.verify("old").ok


def test_rows_whose_types_sqlite_changes_still_verify(tmp_path: Path) -> None:
    s = Store(tmp_path / "events.db")
    s.add([Event(kind=Kind.CONN, ts=7, port="443", name=5, count=True)])  # type: ignore[arg-type]
    assert s.verify().ok


def test_two_writers_on_one_file_make_one_chain(tmp_path: Path) -> None:
    one, two = Store(tmp_path / "events.db"), Store(tmp_path / "events.db")
    for i in range(5):
        (one if i % 2 else two).add(batch(f"s{i}", 3))
    assert one.verify().ok and two.verify().checkpoints == 5


def test_a_corrupt_store_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "events.db").write_bytes(b"not a database" * 100)
    with pytest.raises(SandgateError, match="cannot open the event store"):
        Store(tmp_path / "events.db")


def test_log_verify_on_the_command_line(store: Store, tmp_path: Path) -> None:
    store.session_start("a", mode="locked")
    env = {"SANDGATE_HOME": str(tmp_path)}
    r = CliRunner().invoke(app, ["log", "verify"], env=env)
    assert r.exit_code == 0 and r.output.startswith("ok: 30 events"), r.output
    r = CliRunner().invoke(app, ["log", "verify", "--session", "last", "--json"], env=env)
    assert json.loads(r.output)["ok"] is True
    sql(store, "UPDATE events SET verdict='allow' WHERE id = 2")
    r = CliRunner().invoke(app, ["log", "verify"], env=env)
    assert r.exit_code == 1
    assert "event 2 (session a): changed" in r.output
    r = CliRunner().invoke(app, ["log", "--session", "last", "--json"], env=env)
    assert r.exit_code == 0 and len(r.output.splitlines()) == 20
    r = CliRunner().invoke(app, ["log", "verfy"], env=env)
    assert r.exit_code == 2 and "the only action is 'verify'" in r.output


def test_the_cost_per_event(tmp_path: Path) -> None:
    """Chained and signed vs a plain insert, in batches of 100 (the gateway flushes every
    0.1 s). Prints the cost; fails only if it is absurd (2 shared cores)."""
    events = batch("bench", 100)
    plain = sqlite3.connect(tmp_path / "plain.db")
    plain.execute("PRAGMA journal_mode=WAL")
    plain.execute("PRAGMA synchronous=NORMAL")  # as the store: the same durability
    plain.executescript(OLD_SCHEMA)
    marks = ",".join("?" * len(FIELDS))
    s = Store(tmp_path / "events.db")
    rounds = 50
    t0 = time.perf_counter()
    for _ in range(rounds):
        rows = [e.row() for e in events]
        with plain:
            plain.executemany(f"INSERT INTO events ({','.join(FIELDS)}) VALUES ({marks})", rows)
    t1 = time.perf_counter()
    for _ in range(rounds):
        s.add(events)
    t2 = time.perf_counter()
    n = rounds * len(events)
    base, chained = (t1 - t0) / n * 1e6, (t2 - t1) / n * 1e6
    print(f"\nper event: plain insert {base:.1f} us, chained+signed {chained:.1f} us")
    assert s.verify().ok
    assert chained < 200


def test_the_digest_is_sha256_over_prev_and_canonical_json() -> None:
    """The format, pinned: a verifier in another language can rebuild it from the docstring."""
    row = Event(kind=Kind.DNS, ts=1.5, session="s", name="a.example", details={"b": 1}).row()
    want = hashlib.sha256(
        b"\0" * 32
        + b'{"count":1,"details":"{\\"b\\": 1}","kind":"dns","name":"a.example",'
        + b'"seq":7,"session":"s","ts":1.5}'
    ).digest()
    assert link(b"\0" * 32, 7, row) == want
