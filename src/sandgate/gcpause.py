"""The cyclic garbage collector paused while a large policy is read and compiled.

Reading 100,000 rules makes about a million objects that all live on (TOML tables, rule
models, nftables JSON), none of them garbage; CPython 3.11's collector still walks them again
and again as they are made: 40% of a 100,000-rule file-to-ruleset (3.5 s of CPU with it,
2.1 s without, 2026-12-01, issue 11 part 4). Nested and concurrent pauses are counted; the
collector runs again when the last one ends, if it was running when the first began.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["paused_gc"]


class _Pauses:
    lock = threading.Lock()
    depth = 0
    was_enabled = False


@contextmanager
def paused_gc() -> Iterator[None]:
    with _Pauses.lock:
        if _Pauses.depth == 0:
            _Pauses.was_enabled = gc.isenabled()
            gc.disable()
        _Pauses.depth += 1
    try:
        yield
    finally:
        with _Pauses.lock:
            _Pauses.depth -= 1
            if _Pauses.depth == 0 and _Pauses.was_enabled:
                gc.enable()
