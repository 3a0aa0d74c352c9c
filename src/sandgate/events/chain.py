"""The store's hash chain and its signed checkpoints: the format, defined once, and the writer.

Every event row is hashed over its canonical form and the hash of the chained event before it::

    hash(n) = sha256(prev + canonical(n))      prev of the first chained event: the store's genesis
    canonical(n) = JSON, sorted keys, no spaces, of {"seq": n, <every column of the row that is
                   not NULL>} (details as the stored JSON text; seq is the row id)

NULLs are left out so that a column added later (NULL in old rows) does not change old hashes.

Each write batch (one gateway flush, one ``Store.add``) ends with a checkpoint in the same
transaction, signed with Ed25519: genesis, checkpoint number, the batch's first and last id, the
hash before it, its head and the digest of the batch's hashes. The hashes themselves are stored
with the checkpoint, so the verifier (events/verify.py) names the one changed event even when the
row's hash column was rewritten along with it; signing every batch leaves no unsigned tail.

Keys: ``<home>/keys/store.ed25519`` (PKCS8 PEM, 0600, in a 0700 dir), made on first write by the
store's owner (root); the public key beside it. The sandbox never sees the home (bwrap hides
/var/lib/sandgate; a SANDGATE_HOME under /tmp is the sandbox's own tmpfs there).

The head record ``<home>/keys/<store>.head`` holds the latest signed checkpoint outside the
database. A store cut back to an earlier checkpoint (its tail deleted together with its
checkpoints, or an old copy put back) verifies internally; only this record, which whoever can
write the database but not the keys dir cannot roll back, shows the cut. The writer also numbers
on from it, so a cut stays visible as a gap after new events arrive.

Measured 2026-12-01 (test_the_cost_per_event in tests/unit/test_chain.py, batches of 100, 2
shared cores): ~7 us per event for the canonical JSON and its hash, ~50 us per batch for the
signature; chained and signed ~20 us per event against ~10 us for a plain insert.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sandgate import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: ~15 ms that a run without events does not pay
    from typing import Any

    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

from sandgate.errors import SandgateError
from sandgate.events.schema import FIELDS

HASH_SIZE = 32
KEY_NAME = "store.ed25519"
_CHECKPOINT_TAG = b"sandgate-store-checkpoint-v1\n"

SCHEMA = """
CREATE TABLE IF NOT EXISTS chain (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS checkpoints (
    n INTEGER PRIMARY KEY, ts REAL NOT NULL, first INTEGER NOT NULL, last INTEGER NOT NULL,
    prev TEXT NOT NULL, head TEXT NOT NULL, hashes BLOB NOT NULL, key TEXT NOT NULL,
    sig TEXT NOT NULL
);
"""

# The Python type each column's value has when SQLite hands it back (its affinity). A row whose
# values all have these types hashes the same before and after the round trip; any other row is
# hashed from what SQLite stored (read back), never from what we meant to store.
_REAL, _INTEGER = {"ts"}, {"port", "uid", "pid", "count"}
_TYPES = tuple(float if f in _REAL else int if f in _INTEGER else str for f in FIELDS)


# The canonical form is json.dumps(d, sort_keys=True, separators=(",", ":")). That builds an
# encoder per call and sorts every dict; here the keys are put in sorted order as the dict is
# made (the columns and "seq": their order is fixed) and one encoder, made once, writes them as
# they come. The same bytes (tests/unit/test_chain_fast.py) at ~85% of the cost (issue 13).
_KEYS = (*FIELDS, "seq")
_ORDER = tuple(sorted(range(len(_KEYS)), key=_KEYS.__getitem__))
_SORTED = tuple((_KEYS[i], i) for i in _ORDER)
_CANONICAL = json.JSONEncoder(separators=(",", ":"))


def canonical(seq: int, values: Sequence[Any]) -> bytes:
    """The canonical form of the event with row id ``seq``; ``values`` in ``FIELDS`` order."""
    if len(values) != len(FIELDS):
        raise ValueError(f"a row has {len(FIELDS)} values, not {len(values)}")
    both = (*values, seq)
    d = {k: v for k, i in _SORTED if (v := both[i]) is not None}
    return _CANONICAL.encode(d).encode()


def link(prev: bytes, seq: int, values: Sequence[Any]) -> bytes:
    return hashlib.sha256(prev + canonical(seq, values)).digest()


# The rows' type signatures (each value's type, in FIELDS order) found well typed: a gateway
# writes rows of a few dozen signatures, so each is checked once (~2.3 -> ~0.8 us a row).
_WELL_TYPED: set[tuple[type, ...]] = set()
_SIGNATURES_MAX = 4096


def well_typed(row: Sequence[Any]) -> bool:
    signature = tuple(map(type, row))
    if signature in _WELL_TYPED:
        return True
    ok = all(v is None or type(v) is t for v, t in zip(row, _TYPES, strict=True))
    if ok and len(_WELL_TYPED) < _SIGNATURES_MAX:
        _WELL_TYPED.add(signature)
    return ok


def keys_dir(store: Path) -> Path:
    return store.parent / "keys"


def head_path(store: Path) -> Path:
    return keys_dir(store) / f"{store.name}.head"


def fingerprint(public: Ed25519PublicKey) -> str:
    from cryptography.hazmat.primitives import serialization

    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


# -- keys -----------------------------------------------------------------------------------------


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """Write ``path`` whole or not at all, never over an existing file (two writers racing to
    make the key: the second gets FileExistsError and reads the first one's)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)
    finally:
        tmp.unlink()


def _check_private(path: Path) -> None:
    st = path.stat()
    if st.st_mode & 0o077 or st.st_uid != os.geteuid():
        raise SandgateError(
            f"the store's signing key {path} is readable by others or owned by someone else",
            f"chmod 600 {path} (owner: the user the gateway runs as), or remove it and its .pub",
        )


def load_signer(store: Path) -> Ed25519PrivateKey:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    """The store's signing key, made on first use."""
    d = keys_dir(store)
    path = d / KEY_NAME
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(d, 0o700)
        if not path.exists():
            key = Ed25519PrivateKey.generate()
            pem = key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
            pub = key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
            with contextlib.suppress(FileExistsError):
                _write_new(path, pem, 0o600)
                _write_new(d / f"{KEY_NAME}.pub", pub, 0o644)
        _check_private(path)
        loaded = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError) as exc:
        raise SandgateError(
            f"cannot load or create the store's signing key {path}: {exc}",
            f"run as the store's owner; {d} must be a directory only it can read",
        ) from exc
    if not isinstance(loaded, Ed25519PrivateKey):
        raise SandgateError(f"{path} is not an Ed25519 key", "remove it and its .pub")
    return loaded


def load_public(store: Path) -> Ed25519PublicKey:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    path = keys_dir(store) / f"{KEY_NAME}.pub"
    try:
        loaded = serialization.load_pem_public_key(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise SandgateError(
            f"cannot read the store's public key {path}: {exc}",
            "run as the store's owner (root), with the keys the store was written with",
        ) from exc
    if not isinstance(loaded, Ed25519PublicKey):
        raise SandgateError(f"{path} is not an Ed25519 public key")
    return loaded


# -- checkpoints ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Checkpoint:
    """A signed point in the event chain: a batch of event ids, its hashes and the head."""

    n: int
    ts: float
    first: int
    last: int
    prev: bytes
    head: bytes
    hashes: bytes  # the batch's event hashes, HASH_SIZE bytes each, ids first..last
    key: str  # fingerprint of the public key that signs it
    sig: bytes

    def signed_fields(self, genesis: bytes) -> dict[str, Any]:
        return {
            "genesis": genesis.hex(),
            "n": self.n,
            "ts": self.ts,
            "first": self.first,
            "last": self.last,
            "prev": self.prev.hex(),
            "head": self.head.hex(),
            "hashes": hashlib.sha256(self.hashes).hexdigest(),
        }

    def message(self, genesis: bytes) -> bytes:
        return _message(self.signed_fields(genesis))

    def signed_by(self, public: Ed25519PublicKey, genesis: bytes) -> bool:
        from cryptography.exceptions import InvalidSignature

        try:
            public.verify(self.sig, self.message(genesis))
        except InvalidSignature:
            return False
        return True

    def hash_of(self, seq: int) -> bytes:
        at = (seq - self.first) * HASH_SIZE
        return self.hashes[at : at + HASH_SIZE]

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> Checkpoint:
        n, ts, first, last, prev, head, hashes, key, sig = row
        return cls(
            n, ts, first, last, bytes.fromhex(prev), bytes.fromhex(head), bytes(hashes), key,
            bytes.fromhex(sig),
        )  # fmt: skip

    def as_head(self, genesis: bytes, store: str) -> dict[str, Any]:
        """The head record: enough to check its signature without the database."""
        return self.signed_fields(genesis) | {
            "key": self.key,
            "sig": self.sig.hex(),
            "store": store,
        }


_SIGNED = ("genesis", "n", "ts", "first", "last", "prev", "head", "hashes")


def _message(fields: dict[str, Any]) -> bytes:
    return _CHECKPOINT_TAG + json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Head:
    """The head record as read back (``signed``: its signature checked out)."""

    n: int
    last: int
    head: bytes
    genesis: bytes
    signed: bool


# The head record is rewritten in place, in two fixed-size slots taken in turn (checkpoint n in
# slot n % 2): a rename per batch cost 3.6 ms on ext4 (it flushes the replaced file), a pwrite
# costs microseconds, and a write torn by a crash spoils one slot, never both.
_SLOT = 1024


def read_head(store: Path, public: Ed25519PublicKey | None) -> Head | None:
    from cryptography.exceptions import InvalidSignature

    """The newest readable slot of the head record (None: there is no record)."""
    path = head_path(store)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SandgateError(f"the head record {path} is unreadable: {exc}") from exc
    slots = []
    for at in range(0, len(data), _SLOT):
        try:
            raw = json.loads(data[at : at + _SLOT].rstrip(b" \0\n"))
            slots.append((int(raw["n"]), raw))
        except (ValueError, KeyError, TypeError):
            continue
    if not slots:
        raise SandgateError(f"the head record {path} is unreadable", "it was damaged or altered")
    raw = max(slots, key=lambda s: s[0])[1]
    try:
        signed = False
        if public is not None:
            try:
                public.verify(bytes.fromhex(raw["sig"]), _message({k: raw[k] for k in _SIGNED}))
                signed = True
            except InvalidSignature:
                pass
        return Head(
            int(raw["n"]),
            int(raw["last"]),
            bytes.fromhex(raw["head"]),
            bytes.fromhex(raw["genesis"]),
            signed,
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise SandgateError(f"the head record {path} is unreadable: {exc}") from exc


def _write_head(store: Path, cp: Checkpoint, genesis: bytes) -> None:
    data = json.dumps(cp.as_head(genesis, store.name)).encode().ljust(_SLOT - 1) + b"\n"
    fd = os.open(head_path(store), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, data, (cp.n % 2) * _SLOT)
    finally:
        os.close(fd)


# -- the writer -----------------------------------------------------------------------------------


def migrate(db: sqlite3.Connection) -> None:
    """A store from before the chain gets the hash column; its old rows stay unchained and the
    verifier says where the chain starts."""
    db.executescript(SCHEMA)
    columns = {r[1] for r in db.execute("PRAGMA table_info(events)")}
    if "hash" not in columns:
        db.execute("ALTER TABLE events ADD COLUMN hash TEXT")
        db.commit()


def genesis_of(db: sqlite3.Connection) -> tuple[bytes, int] | None:
    """The chain's genesis and the id of its first event, or None for a store with no chain."""
    meta = dict(db.execute("SELECT key, value FROM chain").fetchall())
    if "genesis" not in meta:
        return None
    return bytes.fromhex(meta["genesis"]), int(meta["start"])


INSERT_CHUNK = 256  # rows per INSERT statement


def _insert(db: sqlite3.Connection, head: str, width: int, rows: list[tuple[Any, ...]]) -> None:
    """``rows`` inserted with one statement per INSERT_CHUNK of them, not one per row as
    ``executemany`` does: SQLite's module lets go of the GIL around every statement it runs, and
    in the gateway the event loop takes it each time, so a batch of rows cost two thread
    switches a row (issue 13: most of the store's CPU in the resolver's process)."""
    one = "(" + ",".join("?" * width) + ")"
    for start in range(0, len(rows), INSERT_CHUNK):
        chunk = rows[start : start + INSERT_CHUNK]
        db.execute(head + ",".join([one] * len(chunk)), [v for row in chunk for v in row])


class Writer:
    """Appends batches of rows to the chain. One per Store; safe across processes (every batch
    reads the head inside its own BEGIN IMMEDIATE transaction)."""

    def __init__(self, store: Path) -> None:
        self.store = store
        self._key: Ed25519PrivateKey | None = None
        self._key_error: str | None = None

    def _signer(self) -> Ed25519PrivateKey | None:
        if self._key is None and self._key_error is None:
            try:
                self._key = load_signer(self.store)
            except SandgateError as exc:
                # Events are never lost for want of a key: they are chained, left unsigned,
                # and `sandgate log verify` reports them as such.
                self._key_error = str(exc)
                print(f"sandgate: events are not signed: {exc}", file=sys.stderr)
        return self._key

    def append(self, db: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
        """Insert ``rows`` (``FIELDS`` order) chained and signed. The caller holds the
        connection and commits (or rolls back) the transaction this begins."""
        key = self._signer()
        db.execute("BEGIN IMMEDIATE")
        chain = genesis_of(db)
        top = db.execute("SELECT max(id) FROM events").fetchone()[0] or 0
        last_n = db.execute("SELECT max(n) FROM checkpoints").fetchone()[0] or 0
        try:
            head_rec = read_head(self.store, None)
        except SandgateError as exc:
            print(f"sandgate: {exc}", file=sys.stderr)
            head_rec = None
        if chain is None:
            chain = (os.urandom(HASH_SIZE), top + 1)
            if head_rec is not None:  # a new chain in a home that had one: keep the evidence
                old = head_path(self.store)
                with contextlib.suppress(OSError):
                    old.rename(old.with_name(f"{old.name}.old-{head_rec.genesis.hex()[:8]}"))
                head_rec = None
            db.executemany(
                "INSERT INTO chain (key, value) VALUES (?, ?)",
                [("genesis", chain[0].hex()), ("start", str(chain[1]))],
            )
        genesis = chain[0]
        if head_rec is not None and head_rec.genesis == genesis:
            # The tail was cut (events and checkpoints after the record's): number on from the
            # record, so the cut stays a visible gap once new events arrive.
            top, last_n = max(top, head_rec.last), max(last_n, head_rec.n)
        last = db.execute(
            "SELECT hash FROM events WHERE hash IS NOT NULL ORDER BY id DESC LIMIT 1"
        ).fetchone()
        prev = bytes.fromhex(last[0]) if last else genesis
        first = top + 1
        cols = ",".join(("id", *FIELDS, "hash"))
        marks = ",".join("?" * (len(FIELDS) + 2))
        hashes = bytearray()
        h = prev
        if all(well_typed(r) for r in rows):
            out = []
            for seq, row in enumerate(rows, first):
                h = link(h, seq, row)
                hashes += h
                out.append((seq, *row, h.hex()))
            _insert(db, f"INSERT INTO events ({cols}) VALUES ", len(FIELDS) + 2, out)
        else:  # hash what SQLite stored (its type affinity may have changed a value)
            db.executemany(
                f"INSERT INTO events ({cols}) VALUES ({marks})",
                [(seq, *row, None) for seq, row in enumerate(rows, first)],
            )
            stored = db.execute(
                f"SELECT id, {','.join(FIELDS)} FROM events WHERE id >= ? ORDER BY id", [first]
            ).fetchall()
            updates = []
            for r in stored:
                h = link(h, r[0], r[1:])
                hashes += h
                updates.append((h.hex(), r[0]))
            db.executemany("UPDATE events SET hash = ? WHERE id = ?", updates)
        if key is None:
            return
        cp = Checkpoint(
            n=last_n + 1,
            ts=time.time(),
            first=first,
            last=first + len(rows) - 1,
            prev=prev,
            head=h,
            hashes=bytes(hashes),
            key=fingerprint(key.public_key()),
            sig=b"",
        )
        cp = Checkpoint(**{**cp.__dict__, "sig": key.sign(cp.message(genesis))})
        db.execute(
            "INSERT INTO checkpoints (n, ts, first, last, prev, head, hashes, key, sig)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [cp.n, cp.ts, cp.first, cp.last, cp.prev.hex(), cp.head.hex(), cp.hashes, cp.key,
             cp.sig.hex()],
        )  # fmt: skip
        try:  # inside the transaction: writers take turns, so the record only moves forward
            _write_head(self.store, cp, genesis)
        except OSError as exc:
            print(f"sandgate: cannot write the head record: {exc}", file=sys.stderr)


__all__ = [
    "Checkpoint",
    "Head",
    "Writer",
    "canonical",
    "genesis_of",
    "head_path",
    "keys_dir",
    "link",
    "load_public",
    "load_signer",
    "migrate",
    "read_head",
]
