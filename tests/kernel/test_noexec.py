"""noexec on every place the agent writes (issue 14, part 3), and a profile's opt-out.

A program written to /work, /tmp or the home does not run, a library there does not load
(``LD_PRELOAD``), a script still runs through its interpreter; ``noexec = false`` opts out.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import Runner

pytestmark = pytest.mark.kernel

SCRIPT = r"""
printf '#!/bin/sh\necho RAN\n' > /work/x.sh; chmod +x /work/x.sh
/work/x.sh; echo "work $?"
sh /work/x.sh
for d in /tmp /var/tmp /dev/shm /home/agent; do cp /usr/bin/true $d/t; $d/t; echo "$d $?"; done
lib=$(ldd /usr/bin/true | awk '/libc.so/ {print $3}'); cp "$lib" /tmp/l.so
LD_PRELOAD=/tmp/l.so /usr/bin/true 2>&1 | grep -c 'cannot be preloaded'
"""


@pytest.fixture
def work() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="sg-noexec-") as d:
        path = Path(d)
        (path / "open.toml").write_text('[profiles.free]\ninternet = "locked"\nnoexec = false\n')
        yield path


def _lines(sandbox: Runner, **kw: object) -> list[str]:
    # The session's own /work (no workdir given: a given one keeps its own mount's flags).
    r = sandbox.sh(SCRIPT + " 2>&1", **kw)
    text = Path(r.report.output or "").read_text()
    return [ln for ln in text.splitlines() if "Permission denied" not in ln]


def test_nothing_written_runs(sandbox: Runner) -> None:
    lines = _lines(sandbox, mode="locked")
    assert lines[:2] == ["work 126", "RAN"], lines  # refused; through sh it runs
    assert lines[2:6] == ["/tmp 126", "/var/tmp 126", "/dev/shm 126", "/home/agent 126"], lines
    assert lines[6] == "1", lines  # the preloaded library was refused by the loader


def test_a_profile_can_opt_out(sandbox: Runner, work: Path) -> None:
    lines = _lines(sandbox, policy=str(work / "open.toml"))
    assert lines[:3] == ["RAN", "work 0", "RAN"], lines
    assert lines[3:7] == ["/tmp 0", "/var/tmp 0", "/dev/shm 0", "/home/agent 0"], lines
