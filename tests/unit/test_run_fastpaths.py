"""The fast paths of a run (issue 13) agree with the slow paths they skip."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


def test_add_guest_answers_what_the_runner_read_from_the_file(tmp_path: Path) -> None:
    """noexec and [limits] come in add_guest's answer (so a run loads no policy): the values
    the runner took from the file's profile itself before, defaults for a flags-only one."""
    from sandgate.gateway.lifecycle import _session_settings
    from sandgate.policy.limits import Limits
    from sandgate.policy.load import load_policy

    f = tmp_path / "p.toml"
    f.write_text(
        '[profiles.coder]\ninternet = "locked"\nnoexec = false\n'
        '[profiles.coder.limits]\npids = 512\nmemory = "2G"\n'
        '[profiles.plain]\ninternet = "open"\n'
    )
    policy = load_policy(str(f))
    for name in ("coder", "plain", "nosuch"):
        spec = policy.file.profiles.get(name)  # what runner._noexec / _cgroup read
        got = _session_settings(policy, name)
        assert got["noexec"] == (spec is None or spec.noexec)
        assert Limits(**got["limits"]) == (spec.limits.limits() if spec else Limits())
    assert _session_settings(policy, "coder")["limits"] == {
        "pids": 512, "memory": 2 << 30, "cpus": None
    }  # fmt: skip
