"""What the commit monitor says another process changed (net/nft.py ``touched``)."""

from __future__ import annotations

from sandgate.net.nft import touched

NFT = 10 << 8  # NFNL_SUBSYS_NFTABLES


def test_each_change_is_named_by_its_table_and_object() -> None:
    t = {1: b"sandgate\0"}
    assert touched(NFT | 6, 1, {**t, 2: b"forward\0"}) == (
        "rule in chain inet sandgate forward: added"
    )
    assert touched(NFT | 8, 1, {**t, 2: b"forward\0"}) == (
        "rule in chain inet sandgate forward: deleted"
    )
    assert touched(NFT | 3, 1, {**t, 3: b"g7_fwd\0"}) == "chain inet sandgate g7_fwd: added"
    assert touched(NFT | 12, 1, {**t, 2: b"g7_pin\0"}) == (
        "elements of set inet sandgate g7_pin: added"
    )
    assert touched(NFT | 2, 5, {1: b"sandgate\0"}) == "table netdev sandgate: deleted"
    assert touched(NFT | 0, 2, {1: b"filter\0"}) == "table ip filter: added"


def test_what_changes_nothing_is_not_named() -> None:
    assert touched(NFT | 15, 0, {}) is None  # NEWGEN: the commit itself
    assert touched(NFT | 1, 1, {}) is None  # a GET's answer
    assert touched((11 << 8) | 6, 1, {}) is None  # another subsystem
    assert touched(NFT | 6, 99, {}) == "rule in chain 99 ? ?: added"  # unknown parts say so
