"""``sandgate run --timings``: each phase of a run, wall and CPU, as the CLI's process sees it.

A phase is timed from outside the part it times: wall by ``time.perf_counter``, CPU by
``getrusage`` (this process and the children it has waited for, so the sandboxed command's CPU
lands in the phase that ran it). The gateway's own steps of ``add_guest`` and ``remove_guest``
(its ``timing_ms``) are kept as the sub-steps of those phases. Python's start, the CLI's imports
and option parsing are one phase, measured from the process's start time in /proc.

Stdlib only: it is imported before anything else a run needs.
"""

from __future__ import annotations

import contextlib
import os
import resource
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from sandgate import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

__all__ = ["Phase", "Running", "Timings", "cpu_now", "since_process_start"]


def cpu_now() -> float:
    """CPU seconds of this process and its waited-for children, user and system."""
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def since_process_start() -> float | None:
    """Wall seconds since this process started (the kernel's start time, 1/CLK_TCK steps)."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        # Field 22 (starttime), counted after the command name's closing parenthesis.
        start_ticks = int(stat[stat.rindex(b")") + 2 :].split()[19])
        return time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class Phase:
    """One timed phase of a run."""

    name: str
    wall_ms: float
    cpu_ms: float
    steps: dict[str, float] = field(default_factory=dict)  # the gateway's timing_ms, if any

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"phase": self.name, "wall_ms": self.wall_ms, "cpu_ms": self.cpu_ms}
        if self.steps:
            out["gateway_ms"] = self.steps
        return out


@dataclass
class Running:
    """A phase being timed that a later call ends (``Timings.begin``)."""

    timings: Timings
    name: str
    wall: float
    cpu: float

    def end(self) -> None:
        self.timings.add(self.name, time.perf_counter() - self.wall, cpu_now() - self.cpu)


@dataclass
class Timings:
    """Phases in the order they ran. Cheap enough to be always on (two clock reads a phase)."""

    phases: list[Phase] = field(default_factory=list)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[Phase]:
        wall, cpu = time.perf_counter(), cpu_now()
        ph = Phase(name, 0.0, 0.0)
        try:
            yield ph  # the caller may fill ``steps``
        finally:
            ph.wall_ms = round((time.perf_counter() - wall) * 1000, 2)
            ph.cpu_ms = round((cpu_now() - cpu) * 1000, 2)
            self.phases.append(ph)

    def begin(self, name: str) -> Running:
        """A phase whose end is not the end of a block: call ``end()`` on what this returns."""
        return Running(self, name, time.perf_counter(), cpu_now())

    def add(self, name: str, wall_s: float, cpu_s: float) -> None:
        self.phases.append(Phase(name, round(wall_s * 1000, 2), round(cpu_s * 1000, 2)))

    def total(self) -> tuple[float, float]:
        return (
            round(sum(p.wall_ms for p in self.phases), 2),
            round(sum(p.cpu_ms for p in self.phases), 2),
        )

    def as_json(self) -> dict[str, Any]:
        wall, cpu = self.total()
        return {
            "phases": [p.as_json() for p in self.phases],
            "total_wall_ms": wall,
            "total_cpu_ms": cpu,
        }

    def lines(self) -> list[str]:
        """A plain table: phase, wall ms, CPU ms; the gateway's steps indented below."""
        width = max([len(p.name) for p in self.phases] + [len("total")]) + 2
        out = [f"{'phase':<{width}}{'wall ms':>9}{'cpu ms':>9}"]
        for p in self.phases:
            out.append(f"{p.name:<{width}}{p.wall_ms:>9.1f}{p.cpu_ms:>9.1f}")
            out.extend(
                f"  {'gateway ' + step:<{width - 2}}{ms:>9.1f}" for step, ms in p.steps.items()
            )
        wall, cpu = self.total()
        out.append(f"{'total':<{width}}{wall:>9.1f}{cpu:>9.1f}")
        return out
