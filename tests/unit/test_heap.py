"""The daemon's heap trim (gateway/heap.py) gives freed pages back."""

from __future__ import annotations

from pathlib import Path

from sandgate.gateway import heap


def _rss_kb() -> int:
    status = Path("/proc/self/status").read_text()
    return int(next(x for x in status.splitlines() if x.startswith("VmRSS:")).split()[1])


def test_a_trim_gives_freed_pages_back() -> None:
    """Small blocks freed below a live one stay in the arena (the heap's top cannot shrink)
    until trimmed: then RSS drops by about their size."""
    blocks = [bytearray(4000) for _ in range(20000)]  # ~80 MB of small blocks, not mmap'd
    keep = bytearray(4000)
    del blocks
    after_free = _rss_kb()
    assert heap.trim()  # glibc here
    assert _rss_kb() < after_free - 40_000, after_free
    del keep
