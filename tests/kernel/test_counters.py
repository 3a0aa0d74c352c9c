"""remove_guest reads a guest's counters by name over netlink (net/nft.py ``CounterReader``):
what it reads must be what libnftables lists, in both families, with names the kernel does
not have left out (issue 13). Pure wire format: tests/unit/test_counter_reader.py."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import pytest

from sandgate.net import ns
from sandgate.net.compile import TABLE
from sandgate.net.nft import CounterReader, Nft, batch

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")


@pytest.fixture
def worker() -> Iterator[ns.NsThread]:
    name = f"sg-ctr-{secrets.token_hex(3)}"
    ns.create(name)
    thread = ns.NsThread(name)
    try:
        yield thread
    finally:
        thread.close()
        ns.remove(name)


def test_counters_by_name_agree_with_the_listing(worker: ns.NsThread) -> None:
    values = {
        ("inet", f"c_{i}"): (secrets.randbelow(2**40), secrets.randbelow(2**50)) for i in range(40)
    }
    values[("netdev", "c_ing_g0_0")] = (7, 420)
    values[("inet", "c_big")] = (2**62 + 5, 2**62 + 7)  # jansson reads up to 2**63 - 1
    cmds = [{"add": {"table": {"family": f, "name": TABLE}}} for f in ("inet", "netdev")]
    cmds += [
        {"add": {"counter": {"family": f, "table": TABLE, "name": n, "packets": p, "bytes": b}}}
        for (f, n), (p, b) in values.items()
    ]
    listed: dict[tuple[str, str], int] = {}

    def inside() -> dict[tuple[str, str], int]:
        nft = Nft()
        try:
            nft.run(batch(*cmds))
            for item in (nft.run({"nftables": [{"list": {"counters": {}}}]}) or {})["nftables"]:
                if c := item.get("counter"):
                    listed[(c["family"], c["name"])] = int(c["packets"])
        finally:
            nft.close()
        reader = CounterReader()
        try:
            asked = [*values, ("inet", "c_ing_g0_0"), ("netdev", "c_0"), ("inet", "c_none")]
            first = reader.packets(TABLE, asked)
            again = reader.packets(TABLE, asked[:3])  # the next call's answers are its own
            assert again == {k: first[k] for k in asked[:3]}
            return first
        finally:
            reader.close()

    got = worker.call(inside)
    assert listed == {k: p for k, (p, _) in values.items()}
    assert got == listed  # the missing ones (wrong family, no such name) are left out
    assert got[("inet", "c_big")] == 2**62 + 5


def test_a_table_that_is_not_there_answers_nothing(worker: ns.NsThread) -> None:
    def inside() -> dict[tuple[str, str], int]:
        reader = CounterReader()
        try:
            return reader.packets(TABLE, [("inet", "c_gw_0"), ("netdev", "c_ing_g0_0")])
        finally:
            reader.close()

    assert worker.call(inside) == {}
