"""The fast paths of a run (issue 13) agree with the slow paths they skip."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sandgate.session import evidence
from sandgate.session.claims import Evidence, check_claims


@pytest.mark.parametrize("answer", ["", " ", "\n\t \n"])
def test_an_empty_answer_has_no_claims_on_either_path(answer: str) -> None:
    slow = check_claims(answer, Evidence(events=(), files=None, model_hosts=()))
    assert slow == [] and evidence.findings(answer, [], None, []) == []


def test_the_run_path_imports_neither_the_claim_reader_nor_asyncio() -> None:
    """What `sandgate run` imports before it runs: the claim reader (its vocabulary compiles
    patterns) and asyncio (the daemon's side of the control socket) wait for first use."""
    code = (
        "import sys, sandgate.cli, sandgate.session.runner, sandgate.session.evidence\n"
        "print(sorted(m for m in sys.modules if m.startswith(('asyncio', 'sandgate.session."
        "claims.vocabulary', 'sandgate.session.claims.checking'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
