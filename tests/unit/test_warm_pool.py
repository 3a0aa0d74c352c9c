"""The warm pool's bookkeeping (gateway/pool.py) with make/drop recorded instead of done: no
index is given twice, a failure leaves nothing and stops refills, a namespace is claimed once."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sandgate.gateway import pool as poolmod
from sandgate.gateway.guests import GuestTable
from sandgate.gateway.pool import WARM_DIR, WarmPool
from sandgate.net.compile import GuestLink
from sandgate.net.links import guest_mac

POOL = ipaddress.ip_network("10.201.0.0/28")  # four slots, the last the canary's


def _pool(
    tmp_path: Path, fail: bool = False, activity: Callable[[], int] = lambda: 0
) -> tuple[WarmPool, list[tuple[str, int, str]]]:
    calls: list[tuple[str, int, str]] = []
    table = GuestTable(POOL)

    def make(link: GuestLink, netns: str) -> None:
        assert (tmp_path / WARM_DIR / netns).exists()  # written down before it is made
        calls.append(("make", link.index, netns))
        if fail:
            raise OSError("no more namespaces")

    def drop(link: GuestLink, netns: str) -> None:
        calls.append(("drop", link.index, netns))

    async def nl(fn: Any, *args: Any) -> Any:
        await asyncio.sleep(0)
        return fn(*args)

    pool = WarmPool(
        "ut",
        tmp_path,
        2,
        table.free_index,
        make,
        drop,
        lambda i: GuestLink.from_pool(POOL, i, guest_mac(i)),
        nl,
        activity=activity,
    )
    return pool, calls


async def _settle(pool: WarmPool) -> None:
    for _ in range(20):
        await asyncio.sleep(0)
    await asyncio.gather(*pool._tasks)


def test_entries_are_made_on_free_slots_claimed_once_and_forgotten_when_gone(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        pool, calls = _pool(tmp_path)
        pool.refill()
        assert pool.reserved() == {0, 1}  # reserved while being made: no join takes them
        await _settle(pool)
        assert [w.index for w in pool.ready] == [0, 1]
        name = pool.take()
        assert name is not None and name.startswith("sg-ut-w")
        assert not (tmp_path / WARM_DIR / name).exists()  # the runner's now
        assert pool.reserved() == {0, 1}
        warm = pool.claim(name)
        assert warm is not None and warm.index == 0 and pool.claim(name) is None
        # Taken and removed by its taker without a join (no such namespace here): forgotten,
        # its link dropped, its slot free again.
        other = pool.take()
        assert other is not None
        pool.refill()
        await _settle(pool)
        assert ("drop", 1, other) in calls
        assert other not in pool.taken
        assert len(pool.ready) == 2 and 1 not in pool.reserved()  # free once its link went
        await pool.close()
        assert not pool.ready and not list((tmp_path / WARM_DIR).iterdir())

    asyncio.run(go())


def test_a_failed_make_leaves_nothing_and_stops_refilling(tmp_path: Path) -> None:
    async def go() -> None:
        pool, calls = _pool(tmp_path, fail=True)
        pool.refill()
        await _settle(pool)
        assert not pool.ready and pool.reserved() == set()
        assert pool.failed == "no more namespaces"
        assert {c[0] for c in calls} == {"make"}  # make undoes its own part
        assert not list((tmp_path / WARM_DIR).iterdir())
        made = len(calls)
        pool.refill()
        await _settle(pool)
        assert len(calls) == made  # until a take says to try again
        assert pool.take() is None

    asyncio.run(go())


class _Questions:
    """The resolver's question count, going up by ``step`` every time it is read."""

    def __init__(self) -> None:
        self.count, self.step = 0, 10**6

    def __call__(self) -> int:
        self.count += self.step
        return self.count


async def _until(pool: WarmPool, rounds: int = 400) -> None:
    """Up to ``rounds`` short sleeps, until the pool is full (the timers are patched short)."""
    for _ in range(rounds):
        if len(pool.ready) == pool.size:
            return
        await asyncio.sleep(0.002)


def test_a_refill_waits_while_questions_come_fast_and_then_happens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(poolmod, "REFILL_AFTER", 0.001)
    monkeypatch.setattr(poolmod, "QUIET_CHECK", 0.001)
    monkeypatch.setattr(poolmod, "REFILL_LATEST", 3600.0)

    async def go() -> None:
        questions = _Questions()
        pool, calls = _pool(tmp_path, activity=questions)
        pool.refill()
        await _settle(pool)
        name = pool.take()  # arms the refill
        assert name is not None and len(pool.ready) == 1
        assert pool.claim(name) is not None  # its join
        pool.refill_soon(later=True)  # which moves the refill after itself; still one pending
        checks = questions.count
        await _until(pool, rounds=50)
        assert questions.count > checks + questions.step  # it looked, more than once
        assert len(pool.ready) == 1 and len(calls) == 2  # and made nothing while it was busy
        questions.step = 0  # the resolver is quiet: the pending refill goes ahead
        await _until(pool)
        await _settle(pool)
        assert len(pool.ready) == 2 and [c[0] for c in calls] == ["make"] * 3
        assert pool._due is None
        # The next runner takes the entry made so, and its join finds it.
        pool.ready.pop(0)  # (the first entry's: its namespace is not real here)
        again = pool.take()
        assert again is not None and pool.claim(again) is not None
        await pool.close()

    asyncio.run(go())


def test_a_busy_resolver_delays_a_refill_no_longer_than_refill_latest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(poolmod, "REFILL_AFTER", 0.001)
    monkeypatch.setattr(poolmod, "QUIET_CHECK", 0.001)
    monkeypatch.setattr(poolmod, "REFILL_LATEST", 0.02)

    async def go() -> None:
        pool, calls = _pool(tmp_path, activity=_Questions())  # never quiet
        pool.refill()
        await _settle(pool)
        name = pool.take()
        assert name is not None and len(pool.ready) == 1 and pool.claim(name) is not None
        await _until(pool)
        await _settle(pool)
        assert len(pool.ready) == 2 and [c[0] for c in calls] == ["make"] * 3
        await pool.close()
        assert pool._due is None

    asyncio.run(go())


def test_an_empty_take_makes_nothing_ahead_of_its_join_and_a_leave_refills_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A take that finds the pool empty must not queue makes on the netlink thread, where the
    runner's own join then waits behind them for its link (55-111 ms, every fourth of
    back-to-back sessions, 2026-12-07); a guest's leaving refills at once, busy resolver or
    not (its command is over)."""
    monkeypatch.setattr(poolmod, "REFILL_LATEST", 3600.0)

    async def go() -> None:
        pool, calls = _pool(tmp_path, activity=_Questions())  # never quiet
        pool.refill()
        await _settle(pool)
        for _ in range(pool.size):
            taken = pool.take()
            assert taken is not None and pool.claim(taken) is not None
        made = len(calls)
        assert pool.take() is None  # empty: the runner makes its own namespace
        await _settle(pool)
        assert len(calls) == made and not pool.making  # and nothing is made ahead of it
        pool.refill_soon(later=True)  # its join
        await _settle(pool)
        assert len(calls) == made
        pool.left()  # a guest went: refilled now, the pending refill with it
        assert pool._due is None
        await _settle(pool)
        assert len(pool.ready) == pool.size and len(calls) == made + pool.size
        pool.ready.pop(0)
        pool.stop()  # the daemon stops: its guests' leaving makes nothing more
        pool.left()
        await _settle(pool)
        assert len(calls) == made + pool.size
        await pool.close()

    asyncio.run(go())
