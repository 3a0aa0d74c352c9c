"""The cyclic garbage collector's passes in the daemon, counted and timed by generation.

A pass stops the event loop for as long as it walks (every answer waits behind it), so the
``metrics`` op reports them: totals since start, and the last ``RECENT`` passes of generation 1
and 2 and of generation 0 that took a millisecond or more (an uncached question's allocations
make thousands of short gen-0 passes a second), each with its wall clock start, so a bench can
take those inside its window (bench/dnsperf.py). Costs two calls of ``on_pass`` per pass,
nothing between passes. ``census()`` (asked for, never polled: it walks every tracked object)
says what the next passes will walk, by type.
"""

from __future__ import annotations

import gc
import time
from collections import Counter, deque
from typing import Any

__all__ = ["Passes", "census"]

RECENT = 1024
SHORT = 0.001  # a gen-0 pass under this is counted, not kept in ``recent``


class Passes:
    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self.longest = [0.0, 0.0, 0.0]
        # (generation, wall clock at its start, seconds it took): floats and ints only
        self.recent: deque[tuple[int, float, float]] = deque(maxlen=RECENT)
        self._started = 0.0

    def on_pass(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        took = time.perf_counter() - self._started
        generation = info["generation"]
        self.count[generation] += 1
        self.seconds[generation] += took
        self.longest[generation] = max(self.longest[generation], took)
        if generation or took >= SHORT:
            self.recent.append((generation, time.time() - took, took))

    def install(self) -> None:
        if self.on_pass not in gc.callbacks:
            gc.callbacks.append(self.on_pass)

    def remove(self) -> None:
        if self.on_pass in gc.callbacks:
            gc.callbacks.remove(self.on_pass)

    def report(self) -> dict[str, Any]:
        return {
            "passes": list(self.count),
            "ms": [s * 1e3 for s in self.seconds],
            "longest_ms": [s * 1e3 for s in self.longest],
            "recent": [[g, t, s * 1e3] for g, t, s in self.recent],
            "frozen": gc.get_freeze_count(),
            "counts": list(gc.get_count()),
            "thresholds": list(gc.get_threshold()),
        }


def census(top: int = 25) -> dict[str, Any]:
    """What the collector tracks outside the frozen heap, by generation and by type (the
    ``top`` commonest): what a full pass walks."""
    sizes, types = [], Counter[str]()
    for generation in range(3):
        objects = gc.get_objects(generation)
        sizes.append(len(objects))
        types.update(type(o).__qualname__ for o in objects)
        del objects
    return {"tracked": sizes, "top": [[name, n] for name, n in types.most_common(top)]}
