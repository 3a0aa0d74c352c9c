"""``sandgate suite --parallel N``: the same rows as a sequential run, in the same order, with
sessions overlapping on the one gateway."""

from __future__ import annotations

import time
from pathlib import Path

from sandgate.agents.registry import resolve
from sandgate.session.stack import Stack
from sandgate.session.suite import Row, SuiteOptions, SuiteResult, run_suite_in
from sandgate.session.tasks import load_tasks

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "examples" / "tasks" / "report-000.toml"


def _run(stack: Stack, store: Path, parallel: int, seen: list[Row]) -> tuple[SuiteResult, float]:
    suite = load_tasks(TASKS)
    opts = SuiteOptions(
        tasks=TASKS,
        agent=resolve("scripted"),
        modes=("locked", "open"),
        only=("C00", "H01"),
        store=str(store),
        parallel=parallel,
        on_row=seen.append,
    )
    selected = [t for t in suite.tasks if t.id in opts.only]
    started = time.monotonic()
    result = run_suite_in(stack, suite, selected, opts)
    return result, time.monotonic() - started


def _outcomes(rows: list[Row]) -> list[tuple[str, str, str, int | None, list[str]]]:
    return [(r.task, r.mode, r.outcome, r.exit_code, r.names_denied) for r in rows]


def test_parallel_matches_sequential_and_overlaps(stack: Stack, store_path: Path) -> None:
    seq_seen: list[Row] = []
    par_seen: list[Row] = []
    sequential, seq_s = _run(stack, store_path, 1, seq_seen)
    parallel, par_s = _run(stack, store_path, 4, par_seen)
    order = [("C00", "locked"), ("C00", "open"), ("H01", "locked"), ("H01", "open")]
    assert [(r.task, r.mode) for r in sequential.rows] == order
    assert [(r.task, r.mode) for r in parallel.rows] == order  # job order, not finishing order
    assert _outcomes(parallel.rows) == _outcomes(sequential.rows)
    assert all(r.exit_code == 0 and r.session for r in parallel.rows), parallel.rows
    assert len({r.session for r in parallel.rows}) == 4  # four sessions of their own
    assert sorted((r.task, r.mode) for r in par_seen) == order  # on_row once per session
    # Sessions overlapped: the sum of their own times exceeds the wall time they took together
    # (not "faster than sequential": on a loaded 2-core machine that is a timing, not a fact).
    assert sum(r.seconds for r in parallel.rows) > par_s
    print(f"sequential {seq_s:.2f} s, parallel {par_s:.2f} s")
