"""The event sink: where every event of the gateway goes, the one route to the store.

Enforcers build their records with ``Event.attempt(kind, decision, ...)`` (events/schema.py: the
one place verdict, reason and rule are read from a ``Decision``) and hand them here, with the
flow they belong to when there is one. The sink joins a flow's record with its sender (uid and
process, logs/attribution.py), fills in the guest's session, keeps the canary's own traffic out
of the log, and flushes to the store. It is handed to the resolver, the proxy and the log
readers; none of them sees the daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

from sandgate.events.schema import Event, FlowKey, Kind, category_of
from sandgate.events.store import Store
from sandgate.events.writer import Child
from sandgate.gateway.logs.attribution import Attributor

Infer = Callable[[FlowKey, int | None, float], Event | None]


class EventSink:
    def __init__(
        self,
        store: Store,
        session_of: Callable[[str | None], str | None],
        quiet: Callable[[str | None], bool],
        infer: Infer,
        *,
        own_process: bool = False,
    ) -> None:
        self.store = store
        self._session_of = session_of
        self._quiet = quiet  # a guest whose events are not the log's (the watchdog's canary)
        self.pending: list[Event] = []
        self.watchers: list[asyncio.Queue[Event]] = []
        # Exact event totals per (kind, verdict, reason, category), counted as they are flushed
        # (not in emit, the hot path); the control socket's ``metrics`` op reports them.
        self.tally: dict[tuple[str, str | None, str | None, str | None], int] = {}
        self.attributor = Attributor(self.emit, infer)
        self._loop: asyncio.AbstractEventLoop | None = None
        # One writer, so batches are stored (and hash-chained) in the order they were handed.
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sandgate-store")
        self._stored: Future[None] | None = None  # the last batch handed to the writer
        # The gateway stores from a process of its own (events/writer.py: a writer thread
        # costs the event loop the GIL); the thread then only hands batches over.
        self._child = Child(store.path, store.add_rows) if own_process else None

    @property
    def writer_pid(self) -> int | None:
        return self._child.pid if self._child is not None else None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop that events from other threads (the proxy's) are handed to."""
        self._loop = loop

    def emit(self, event: Event) -> None:
        """An event as it is: no flow to join it with."""
        if self._quiet(event.guest):
            return
        if event.session is None and event.guest is not None:
            session = self._session_of(event.guest)
            if session is not None:
                event = dataclasses.replace(event, session=session)
        if event.category is None and event.kind is Kind.CONN:
            event = dataclasses.replace(
                event, category=category_of(event.protocol, event.port).value
            )
        self.pending.append(event)
        for q in self.watchers:
            q.put_nowait(event)

    def flow(self, key: FlowKey | None, event: Event) -> None:
        """The record of one flow: joined with its sender before it is emitted."""
        if key is None:
            self.emit(event)
        else:
            self.attributor.submit(key, event, time.monotonic())

    def from_thread(self, key: FlowKey | None, event: Event) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self.flow, key, event)

    def notice(self, **details: object) -> None:
        self.emit(Event(kind=Kind.NOTICE, details=dict(details)))

    def flush(self, *, wait: bool = True) -> None:
        """Store what is pending, in order, on the store's one writer thread. ``wait=False``
        (the ticker's) returns at once, so the event loop (the resolver's answers) does not
        wait out SQLite's commit, a WAL checkpoint's fsync or a large batch's hashing; the
        default returns once everything handed over before is stored."""
        events, self.pending = self.pending, []
        tally = self.tally
        for e in events:
            key = (e.kind.value, e.verdict, e.reason, e.category)
            tally[key] = tally.get(key, 0) + e.count
        if events:
            if self._child is not None:
                # The batch's rows and bytes are made here, on the caller's thread (the loop),
                # in one go: made on the writer thread, its ~1 µs of Python an event was cut
                # into hundreds of slices by the loop's GIL (~500 futex calls a batch, half a
                # core at 9k questions a second); the thread now only waits on the pipe.
                try:
                    batch = self._child.pack(events)
                except Exception:  # the store must never take the gateway down
                    traceback.print_exc(file=sys.stderr)
                else:
                    self._stored = self._writer.submit(self._send, *batch)
            else:
                self._stored = self._writer.submit(self._add, events)
        if wait and self._stored is not None:
            self._stored.result()

    def _send(self, body: bytes, rows: list[tuple[object, ...]]) -> None:
        assert self._child is not None
        try:
            self._child.send(body, rows)
        except Exception:  # the store must never take the gateway down
            traceback.print_exc(file=sys.stderr)

    def _add(self, events: list[Event]) -> None:
        try:
            self.store.add_rows([e.row() for e in events])
        except Exception:  # the store must never take the gateway down
            traceback.print_exc(file=sys.stderr)

    def close(self) -> None:
        """Store what is pending, end the writer process, close the store."""
        self.flush()
        if self._child is not None:
            self._child.close()
        self._writer.shutdown()
        self.store.close()

    @contextlib.contextmanager
    def watching(self) -> Iterator[asyncio.Queue[Event]]:
        q: asyncio.Queue[Event] = asyncio.Queue()
        self.watchers.append(q)
        try:
            yield q
        finally:
            self.watchers.remove(q)


__all__ = ["EventSink", "Infer"]
