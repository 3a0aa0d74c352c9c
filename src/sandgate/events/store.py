"""The event store: one SQLite file, written by the gateway daemon and the session runner.

WAL mode lets ``sandgate log`` read while the daemon writes. The daemon batches inserts (one
transaction per flush) so logging keeps up with the resolver and NFLOG rates. Every batch is
hash-chained and ends with a signed checkpoint (events/chain.py); ``verify`` checks them
(events/verify.py).
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from sandgate import TYPE_CHECKING
from sandgate.errors import SandgateError
from sandgate.events import chain
from sandgate.events.schema import Event, Kind

if TYPE_CHECKING:
    from typing import Any

    from sandgate.events.verify import Verification

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY,
    ts REAL NOT NULL,
    session TEXT, guest TEXT, kind TEXT NOT NULL, verdict TEXT, rule TEXT, reason TEXT,
    category TEXT, src TEXT, dst TEXT, port INTEGER, protocol TEXT, name TEXT,
    uid INTEGER, pid INTEGER, count INTEGER NOT NULL DEFAULT 1, details TEXT, hash TEXT
);
CREATE INDEX IF NOT EXISTS events_session ON events(session, kind, ts);
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    started REAL NOT NULL, ended REAL,
    mode TEXT, profile TEXT, policy TEXT, world TEXT, guest TEXT, uid INTEGER,
    command TEXT, exit_code INTEGER, details TEXT
);
"""


def default_home() -> Path:
    return Path(os.environ.get("SANDGATE_HOME", "/var/lib/sandgate"))


def home_of(store: str | Path | None) -> Path:
    """The folder a store lives in (sessions' and suites' files go beside it)."""
    return Path(store).parent if store else default_home()


def default_path() -> Path:
    return default_home() / "events.db"


@dataclass(frozen=True)
class SessionRow:
    """A session as the store's ``sessions`` table holds it."""

    id: str
    started: float
    ended: float | None
    mode: str | None
    profile: str | None
    policy: str | None
    world: str | None
    guest: str | None
    uid: int | None
    command: list[str]
    exit_code: int | None
    details: dict[str, Any]


class Store:
    def __init__(self, path: Path | str | None = None) -> None:
        self.path = Path(path) if path is not None else default_path()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, timeout=30, check_same_thread=False)
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
            chain.migrate(self._db)
        except (sqlite3.Error, OSError) as exc:
            raise SandgateError(
                f"cannot open the event store {self.path}: {exc}",
                "check that the directory is writable, or set SANDGATE_HOME",
            ) from exc
        os.chmod(self.path, 0o600)
        self._lock = threading.Lock()
        self._chain = chain.Writer(self.path)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def add(self, events: Iterable[Event]) -> int:
        return self.add_rows([e.row() for e in events])

    def add_rows(self, rows: list[tuple[Any, ...]]) -> int:
        """Rows as ``Event.row()`` gives them (the writer process's input, events/writer.py)."""
        if not rows:
            return 0
        with self._lock, self._db:
            self._chain.append(self._db, rows)
        return len(rows)

    def verify(self, session: str | None = None) -> Verification:
        """Recompute the hash chain and check the signed checkpoints (events/verify.py)."""
        from sandgate.events.verify import verify

        with self._lock:
            return verify(self._db, self.path, session)

    def events(
        self,
        session: str | None = None,
        kinds: Iterable[Kind | str] = (),
        since_id: int = 0,
        limit: int | None = None,
    ) -> list[Event]:
        return [e for _, e in self.events_with_ids(session, kinds, since_id, limit)]

    def events_with_ids(
        self,
        session: str | None = None,
        kinds: Iterable[Kind | str] = (),
        since_id: int = 0,
        limit: int | None = None,
    ) -> list[tuple[int, Event]]:
        where, args = ["id > ?"], [since_id]
        if session is not None:
            where.append("session = ?")
            args.append(session)  # type: ignore[arg-type]
        kinds = [str(k) for k in kinds]
        if kinds:
            where.append(f"kind IN ({','.join('?' * len(kinds))})")
            args += kinds  # type: ignore[arg-type]
        sql = f"SELECT * FROM events WHERE {' AND '.join(where)} ORDER BY id"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        with self._lock:
            rows = self._db.execute(sql, args).fetchall()
        return [(r["id"], Event.from_row(dict(r))) for r in rows]

    # -- sessions ---------------------------------------------------------------------------

    def session_start(self, sid: str, **fields: Any) -> None:
        fields = {k: v for k, v in fields.items() if v is not None}
        if "command" in fields:
            fields["command"] = json.dumps(fields["command"])
        if "details" in fields:
            fields["details"] = json.dumps(fields["details"])
        cols = ["id", "started", *fields]
        with self._lock, self._db:
            self._db.execute(
                f"INSERT INTO sessions ({','.join(cols)}) VALUES ({','.join('?' * len(cols))})",
                [sid, time.time(), *fields.values()],
            )

    def session_end(
        self, sid: str, exit_code: int | None, details: dict[str, Any] | None = None
    ) -> None:
        with self._lock, self._db:
            self._db.execute(
                "UPDATE sessions SET ended = ?, exit_code = ?, details = COALESCE(?, details)"
                " WHERE id = ?",
                [time.time(), exit_code, json.dumps(details) if details else None, sid],
            )

    def session(self, sid: str) -> SessionRow | None:
        if sid == "last":
            with self._lock:
                row = self._db.execute(
                    "SELECT * FROM sessions ORDER BY started DESC LIMIT 1"
                ).fetchone()
        else:
            with self._lock:
                row = self._db.execute("SELECT * FROM sessions WHERE id = ?", [sid]).fetchone()
        return _session_row(row) if row else None

    def sessions(self, limit: int = 50) -> list[SessionRow]:
        with self._lock:
            rows = self._db.execute(
                "SELECT * FROM sessions ORDER BY started DESC LIMIT ?", [limit]
            ).fetchall()
        return [_session_row(r) for r in rows]

    def iter_all(self) -> Iterator[Event]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM events ORDER BY id").fetchall()
        for r in rows:
            yield Event.from_row(dict(r))


def _session_row(row: sqlite3.Row) -> SessionRow:
    return SessionRow(
        id=row["id"],
        started=row["started"],
        ended=row["ended"],
        mode=row["mode"],
        profile=row["profile"],
        policy=row["policy"],
        world=row["world"],
        guest=row["guest"],
        uid=row["uid"],
        command=json.loads(row["command"]) if row["command"] else [],
        exit_code=row["exit_code"],
        details=json.loads(row["details"]) if row["details"] else {},
    )
