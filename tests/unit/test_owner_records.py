"""Owner records (``cleanup.own``/``disown``), written with os calls since issue 13's teardown
work: what they leave is what pathlib's ``write_text`` left, and ``owned`` reads them back."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from sandgate import cleanup


@pytest.fixture
def owners(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "run" / "owners"  # absent: the first record makes it
    monkeypatch.setattr(cleanup, "OWNERS", folder)
    return folder


def test_a_record_is_what_pathlib_wrote(owners: Path, tmp_path: Path) -> None:
    cleanup.own("sg-a")  # the folder is made on the first record
    assert (owners / "sg-a").read_text() == str(os.getpid())
    assert cleanup.owned("sg-a")
    reference = tmp_path / "reference"
    reference.write_text(str(os.getpid()))  # the slow path, under the same umask
    assert stat.S_IMODE((owners / "sg-a").stat().st_mode) == stat.S_IMODE(
        reference.stat().st_mode
    )


def test_a_record_is_rewritten_whole_and_removed(owners: Path) -> None:
    cleanup.own("sg-b", pid=123456789)
    cleanup.own("sg-b", pid=7)  # a shorter pid over a longer one: truncated, not overlaid
    assert (owners / "sg-b").read_text() == "7"
    cleanup.disown("sg-b")
    assert not (owners / "sg-b").exists()
    cleanup.disown("sg-b")  # gone already: not an error
    cleanup.disown("sg-never")  # and with no record at all


def test_a_dead_owner_does_not_own(owners: Path) -> None:
    cleanup.own("sg-c", pid=2**22 + 1)  # above pid_max's default: no such process
    assert not cleanup.owned("sg-c")
