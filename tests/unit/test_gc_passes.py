"""The daemon's record of the garbage collector's passes (gateway/collector.py), as ``metrics``
reports them: every pass counted by generation, the long ones and every older-generation pass
kept with their start."""

from __future__ import annotations

import gc
import time

from sandgate.gateway.collector import Passes


def test_a_full_pass_is_counted_timed_and_kept_with_its_start() -> None:
    passes = Passes()
    before = time.time()
    passes.install()
    try:
        gc.collect(2)
        gc.collect(1)
    finally:
        passes.remove()
    report = passes.report()
    assert report["passes"][2] == 1 and report["passes"][1] == 1
    assert report["ms"][2] > 0 and report["longest_ms"][2] == report["ms"][2]
    generations = [g for g, _, _ in report["recent"]]
    assert generations == [2, 1]
    assert all(before <= began <= time.time() for _, began, _ in report["recent"])
    gc.collect(2)  # removed: no longer counted
    assert passes.report()["passes"][2] == 1


def test_short_young_passes_are_counted_but_not_kept() -> None:
    passes = Passes()
    passes.on_pass("start", {"generation": 0})
    passes.on_pass("stop", {"generation": 0, "collected": 0, "uncollectable": 0})
    passes._started = time.perf_counter() - 0.002  # a 2 ms young pass
    passes.on_pass("stop", {"generation": 0, "collected": 0, "uncollectable": 0})
    report = passes.report()
    assert report["passes"] == [2, 0, 0]
    assert [g for g, _, ms in report["recent"]] == [0] and report["recent"][0][2] >= 2
