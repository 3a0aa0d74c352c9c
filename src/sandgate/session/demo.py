"""``sandgate demo``: report 000's experiment in one command.

Builds the test world, runs the scripted agent once locked and once open, and returns both
reports so the CLI can print them side by side.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from sandgate.sandbox.launch import preflight
from sandgate.session.runner import RunOptions, RunResult, run_in, signals_raise
from sandgate.session.stack import stack_for

AGENT_TARGET = "/run/sandgate/agent.py"


@dataclass
class DemoResult:
    runs: list[tuple[str, RunResult]]


def agent_path() -> Path:
    return Path(str(resources.files("sandgate.agents").joinpath("demo_agent.py")))


def demo(modes: tuple[str, ...] = ("locked", "open"), store: str | None = None) -> DemoResult:
    preflight()
    runs: list[tuple[str, RunResult]] = []
    with signals_raise(), stack_for("test", store=store) as stack:
        for mode in modes:
            opts = RunOptions(
                command=["/usr/bin/python3", AGENT_TARGET],
                world="test",
                mode=mode,
                files={AGENT_TARGET: agent_path()},
                timeout=120,
                store=store,
                label=f"demo {mode}",
            )
            runs.append((mode, run_in(stack, opts)))
    return DemoResult(runs)
