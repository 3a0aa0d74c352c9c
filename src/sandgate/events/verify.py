"""``sandgate log verify``: recompute the store's hash chain and check its signed checkpoints.

Walks the checkpoints in order and, inside each, the events it signed, and stops at the first
break, naming it. What can be seen, and why (the format is in events/chain.py):

- an event changed (any column, its hash column rewritten or not): its recomputed hash differs
  from the one its checkpoint signed; the event is named exactly;
- rows reordered (moved with their hash): the row at id N carries the hash signed for id M;
- an event removed: its id is missing from a signed range; a whole batch removed (events with
  their checkpoint): the checkpoint numbers have a gap;
- a checkpoint forged or altered: its signature fails (the public key is read from the keys dir,
  never from the database, so a re-signed store does not pass);
- the tail cut after an earlier checkpoint (events and checkpoints deleted together, or an old
  copy of the file put back): consistent inside the database, caught only by the head record
  kept in the keys dir. Someone who can write the keys dir can also read the key: then nothing
  in this scheme holds;
- events inserted outside the chain, or chained but unsigned (no key): named, never passed;
- a store that predates the chain: said so, never passed.
"""

from __future__ import annotations

import enum
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from sandgate.errors import SandgateError
from sandgate.events.chain import (
    Checkpoint,
    genesis_of,
    head_path,
    link,
    load_public,
    read_head,
)
from sandgate.events.schema import FIELDS


class Break(enum.Enum):
    """What broke: a stable key and a human label (like policy's Reason)."""

    CHANGED = ("chain.changed", "changed: its contents no longer match the hash signed for it")
    REORDERED = ("chain.reordered", "reordered: it holds the row signed for another position")
    REMOVED = ("chain.removed", "removed: missing from the signed chain")
    MISSING_LINK = ("chain.missing_link", "missing link: the chain does not continue here")
    BAD_SIGNATURE = ("chain.bad_signature", "bad signature: the checkpoint was forged or altered")
    UNSIGNED = ("chain.unsigned", "not covered by any signed checkpoint")
    UNCHAINED = ("chain.unchained", "carries no hash: written outside the chain")
    TRUNCATED = ("chain.truncated", "truncated: the store ends before its last signed checkpoint")
    NO_CHAIN = ("chain.none", "predates the chain: cannot be verified")

    def __init__(self, key: str, label: str) -> None:
        self.key = key
        self.label = label


@dataclass(frozen=True)
class Problem:
    why: Break
    event: int | None  # the event's id (its sequence number), when one is named
    session: str | None
    text: str

    def line(self) -> str:
        where = f"event {self.event}" if self.event is not None else "the store"
        if self.session:
            where += f" (session {self.session})"
        return f"{where}: {self.why.label}: {self.text}"


@dataclass(frozen=True)
class Verification:
    events: int  # chained events whose hashes were checked
    checkpoints: int  # checkpoints whose signatures were checked
    start: int | None  # id of the chain's first event
    head: str | None  # hex hash of the last event checked
    problems: tuple[Problem, ...]
    session: str | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        scope = f"session {self.session}: " if self.session else ""
        if self.problems:
            return scope + self.problems[0].line()
        if self.start is None:
            return scope + "the store is empty: nothing to verify"
        return (
            f"{scope}ok: {self.events} events in {self.checkpoints} signed checkpoints check out"
            f" (chain from event {self.start}, head {(self.head or '')[:16]})"
        )


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "?"


_COLS = f"id, hash, {', '.join(FIELDS)}"
_SESSION_AT = 2 + FIELDS.index("session")


def verify(db: sqlite3.Connection, store: Path, session: str | None = None) -> Verification:
    try:
        return _verify(db, store, session)
    except sqlite3.DatabaseError as exc:
        raise SandgateError(
            f"the event store {store} is corrupt: {exc}", "restore it from a copy"
        ) from exc


def _verify(db: sqlite3.Connection, store: Path, session: str | None) -> Verification:
    chain = genesis_of(db)
    count, last_ts = db.execute("SELECT count(*), max(ts) FROM events").fetchone()
    if session is not None:
        lo, hi, n_session = db.execute(
            "SELECT min(id), max(id), count(*) FROM events WHERE session = ?", [session]
        ).fetchone()
        if not n_session:
            raise SandgateError(
                f"no events of session {session!r} in {store}",
                "list sessions with `sandgate log --sessions`",
            )
    else:
        lo, hi = None, None
    if chain is None:
        record = read_head(store, None)
        if record is not None:  # the record outlives a store deleted or emptied with its chain
            text = (
                f"this store has no chain, but the head record {head_path(store)} names"
                f" checkpoint #{record.n} (event {record.last}): it was replaced or emptied"
            )
            gone = Problem(Break.TRUNCATED, None, None, text)
            return Verification(0, 0, None, None, (gone,), session)
        if not count:
            return Verification(0, 0, None, None, (), session)
        text = f"this store has no chain: events before {_when(last_ts)} cannot be verified"
        return Verification(0, 0, None, None, (Problem(Break.NO_CHAIN, None, None, text),), session)
    genesis, start = chain
    public = load_public(store)
    problems: list[Problem] = []
    pre, pre_ts = db.execute(
        "SELECT count(*), max(ts) FROM events WHERE id < ?"
        + (" AND session = ?" if session else ""),
        [start, session] if session else [start],
    ).fetchone()
    if pre:
        problems.append(
            Problem(
                Break.NO_CHAIN,
                None,
                None,
                f"{pre} events before {_when(pre_ts)} (ids below {start}) predate the chain and"
                f" cannot be verified; the chain starts at event {start}",
            )
        )
    cps = [Checkpoint.from_row(r) for r in db.execute("SELECT * FROM checkpoints ORDER BY n")]
    if lo is not None and hi is not None:
        cps = [c for c in cps if c.last >= lo and c.first <= hi]
    walk = _Walk(db, genesis, public)
    problem = walk.run(cps, max(start, lo or start), hi, whole=session is None)
    if problem is None and session is None:
        problem = _check_head(store, public, genesis, cps)
    if problem is not None:
        problems.append(problem)
    return Verification(walk.events, walk.checked, start, walk.head, tuple(problems), session)


Row = tuple[Any, ...]  # id, hash, then FIELDS


class _Walk:
    """One pass over the checkpoints in order and the events each signed; ``run`` returns the
    first break."""

    def __init__(self, db: sqlite3.Connection, genesis: bytes, public: Ed25519PublicKey) -> None:
        self.db, self.genesis, self.public = db, genesis, public
        self.events = self.checked = 0
        self.head: str | None = None
        self.last_row: tuple[int, str | None] | None = None  # id and session of the last row seen

    def run(
        self, cps: list[Checkpoint], begin: int, end: int | None, whole: bool
    ) -> Problem | None:
        first_id = min([begin, *(c.first for c in cps[:1])])
        rows = self.db.execute(f"SELECT {_COLS} FROM events WHERE id >= ? ORDER BY id", [first_id])
        row: Row | None = rows.fetchone()
        before: Checkpoint | None = None
        for cp in cps:
            if row is not None and row[0] < cp.first:
                return self._stray(row)
            problem = self._checkpoint(cp, before, whole)
            if problem is not None:
                return problem
            positions = {cp.hash_of(s): s for s in range(cp.first, cp.last + 1)}
            prev = cp.prev
            for seq in range(cp.first, cp.last + 1):
                if row is None or row[0] > seq:
                    return self._removed(seq, cp)
                want = cp.hash_of(seq)
                problem = self._event(row, prev, want, cp, positions)
                if problem is not None:
                    return problem
                prev = want
                row = rows.fetchone()
            before = cp
        if row is not None and (end is None or row[0] <= end):
            return self._stray(row)
        return None

    def _checkpoint(self, cp: Checkpoint, before: Checkpoint | None, whole: bool) -> Problem | None:
        if before is not None and cp.n != before.n + 1:
            return Problem(
                Break.REMOVED,
                before.last + 1,
                None,
                f"checkpoints #{before.n + 1}..#{cp.n - 1} are gone, with events"
                f" {before.last + 1}..{cp.first - 1}",
            )
        if before is None and whole and cp.n != 1:
            return Problem(
                Break.REMOVED,
                None,
                None,
                f"checkpoints #1..#{cp.n - 1} are gone, with the events before {cp.first}",
            )
        if not cp.signed_by(self.public, self.genesis):
            return Problem(
                Break.BAD_SIGNATURE,
                cp.first,
                None,
                f"checkpoint #{cp.n} (events {cp.first}..{cp.last}) does not verify with the"
                " store's public key",
            )
        self.checked += 1
        expected = before.head if before is not None else self.genesis if cp.n == 1 else cp.prev
        if cp.prev != expected:
            after = f"event {before.last}" if before else "the start"
            return Problem(
                Break.MISSING_LINK,
                cp.first,
                None,
                f"checkpoint #{cp.n} does not continue from the one before it: events between"
                f" {after} and event {cp.first} were removed",
            )
        return None

    def _event(
        self, row: Row, prev: bytes, want: bytes, cp: Checkpoint, positions: dict[bytes, int]
    ) -> Problem | None:
        seq, session = int(row[0]), row[_SESSION_AT]
        stored = bytes.fromhex(row[1]) if isinstance(row[1], str) else None
        if link(prev, seq, row[2:]) != want:
            if stored is not None and stored != want and stored in positions:
                moved = f"it carries the hash of event {positions[stored]}"
                return Problem(Break.REORDERED, seq, session, moved)
            signed = f"checkpoint #{cp.n} signed events {cp.first}..{cp.last}"
            return Problem(Break.CHANGED, seq, session, signed)
        if stored != want:
            return Problem(
                Break.CHANGED, seq, session, f"its hash column was altered (checkpoint #{cp.n})"
            )
        self.head = want.hex()
        self.events += 1
        self.last_row = (seq, session)
        return None

    def _removed(self, seq: int, cp: Checkpoint) -> Problem:
        last = self.last_row
        after = f"after event {last[0]}" if last else "at the start of the chain"
        near = f" (session {last[1]})" if last and last[1] else ""
        return Problem(
            Break.REMOVED,
            seq,
            None,
            f"the row is gone {after}{near}; checkpoint #{cp.n} signed events"
            f" {cp.first}..{cp.last}",
        )

    @staticmethod
    def _stray(row: Row) -> Problem:
        if row[1] is None:
            return Problem(Break.UNCHAINED, row[0], row[_SESSION_AT], "inserted without a hash")
        return Problem(
            Break.UNSIGNED, row[0], row[_SESSION_AT], "chained, but no checkpoint signs it"
        )


def _check_head(
    store: Path, public: Ed25519PublicKey, genesis: bytes, cps: list[Checkpoint]
) -> Problem | None:
    record = read_head(store, public)
    path = head_path(store)
    last = cps[-1] if cps else None
    if record is None:
        if last is None:
            return None
        return Problem(
            Break.TRUNCATED,
            None,
            None,
            f"the head record {path} is missing, so a cut after the last checkpoint"
            f" (#{last.n}) cannot be ruled out",
        )
    if not record.signed:
        return Problem(Break.BAD_SIGNATURE, None, None, f"the head record {path} is not signed")
    if record.genesis != genesis:
        return Problem(
            Break.TRUNCATED,
            None,
            None,
            f"the head record {path} belongs to another chain: this store was replaced",
        )
    if last is None or record.n > last.n:
        ends = f"checkpoint #{last.n} (event {last.last})" if last else "no checkpoint"
        return Problem(
            Break.TRUNCATED,
            (last.last + 1) if last else None,
            None,
            f"the store ends at {ends} but the head record names checkpoint #{record.n}"
            f" (event {record.last}): the events after it were removed",
        )
    match = next((c for c in cps if c.n == record.n), None)
    if match is not None and match.head != record.head:
        return Problem(
            Break.MISSING_LINK,
            match.last,
            None,
            f"checkpoint #{record.n} differs from the head record {path}",
        )
    return None


__all__ = ["Break", "Problem", "Verification", "verify"]
