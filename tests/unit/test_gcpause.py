"""The GC pause (sandgate/gcpause.py) nests, survives an exception, and leaves a collector that
was off before as it found it."""

from __future__ import annotations

import gc

import pytest

from sandgate.gcpause import paused_gc


def test_pauses_nest_and_the_last_one_out_restarts_the_collector() -> None:
    assert gc.isenabled()
    with paused_gc():
        assert not gc.isenabled()
        with paused_gc():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer pause still holds
    assert gc.isenabled()


def test_an_exception_inside_still_restarts_it() -> None:
    with pytest.raises(ValueError), paused_gc():
        raise ValueError("bad policy")
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off() -> None:
    gc.disable()
    try:
        with paused_gc():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
