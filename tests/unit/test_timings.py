"""``run --timings``' phase table (session/timings.py): phases in order, CPU of waited-for
children counted, the gateway's steps kept, sums right. Nothing here is asserted on speed."""

from __future__ import annotations

import subprocess
import sys

from sandgate.session.timings import Timings, since_process_start


def test_phases_in_order_with_children_cpu_and_gateway_steps() -> None:
    t = Timings()
    with t.phase("first") as ph:
        ph.steps = {"link": 1.5}
    run = t.begin("child")
    # A child that burns CPU: its time must land in the phase that waited for it.
    subprocess.run([sys.executable, "-c", "sum(i * i for i in range(3_000_000))"], check=True)
    run.end()
    t.add("given", 0.25, 0.125)
    assert [p.name for p in t.phases] == ["first", "child", "given"]
    assert t.phases[1].cpu_ms > 10  # the child's user time, not just ours
    assert t.phases[2].wall_ms == 250.0 and t.phases[2].cpu_ms == 125.0
    out = t.as_json()
    assert out["phases"][0]["gateway_ms"] == {"link": 1.5}
    assert out["total_wall_ms"] == round(sum(p.wall_ms for p in t.phases), 2)
    lines = t.lines()
    assert lines[0].split() == ["phase", "wall", "ms", "cpu", "ms"]
    assert lines[2].split()[:3] == ["gateway", "link", "1.5"]
    assert lines[-1].split()[0] == "total"


def test_a_phase_that_raises_is_still_recorded() -> None:
    t = Timings()
    try:
        with t.phase("broken"):
            raise ValueError("x")
    except ValueError:
        pass
    assert [p.name for p in t.phases] == ["broken"]


def test_process_start_is_in_the_past() -> None:
    since = since_process_start()
    assert since is not None and 0 <= since < 24 * 3600
