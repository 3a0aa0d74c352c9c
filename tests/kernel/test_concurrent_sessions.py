"""Sessions joining and leaving one gateway at the same time: every one gets its DNS answers and
every attempt is stored (issue 11: the soak lost some)."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

from sandgate.events.schema import Kind
from sandgate.events.store import Store
from sandgate.session.runner import RunOptions, run_in
from sandgate.session.stack import Stack
from sandgate.world import loadgen

NAMES = 3
DROPPED = ("10.77.0.20", 22)  # the NAS's ssh tripwire: the test world's policy drops it


def test_concurrent_sessions_get_answers_and_lose_no_event(stack: Stack, store_path: Path) -> None:
    """24 sessions, six at a time: each one's snapshot and drift check ran while others joined
    and left (the race: a digest comparison seeing another guest half joined)."""

    def one(i: int) -> tuple[str | None, int, str | None]:
        opts = RunOptions(
            command=loadgen.command(NAMES, DROPPED, "c", "conc.example.com"),
            world="test",
            store=str(store_path),
            timeout=60,
            echo=False,
            label=f"concurrent {i}",
        )
        r = run_in(stack, opts)
        return r.session, r.exit_code, r.message

    with stack.gateway.client() as ctl:
        drifts = ctl.call("status")["integrity"]["drifts"]
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        results = list(pool.map(one, range(24)))
    with stack.gateway.client() as ctl:
        # Others' guests joining and leaving are the gateway's own changes, never drift.
        assert ctl.call("status")["integrity"]["drifts"] == drifts
    store = Store(str(store_path))
    try:
        # A session with no answer: what the gateway said of its flows (before the fix, a
        # ``deny.unknown_link`` drop: a watchdog repair had re-made the tables without it).
        bad = {
            sid: (code, [(e.kind.value, e.reason) for e in store.events(session=sid)])
            for sid, code, _ in results
            if code != 0
        }
        assert not bad, bad
        short = []
        for sid, _, _ in results:
            events = store.events(session=sid)
            dns = sum(1 for e in events if e.kind == Kind.DNS)
            conn = sum(1 for e in events if e.kind == Kind.CONN and e.dst == DROPPED[0])
            if (dns, conn) != (NAMES, 1):
                short.append((sid, dns, conn))
    finally:
        store.close()
    assert not short, short
