"""An agent framework's or the world model's first use installs it, saying so; an install that
fails says how to retry, and nothing half-built is left to look installed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandgate.errors import SandgateError
from sandgate.session.stack import check_world_model
from sandgate.world import llm

SCRIPT = """
from sandgate.agents import registry
from sandgate.errors import SandgateError
try:
    registry.resolve("hermes")
except SandgateError as exc:
    print("ERROR", exc.message, "|", exc.fix)
"""


def _unwritable(tmp_path: Path) -> Path:
    """A folder that cannot be made (its parent is a file): an install there fails at once,
    as a full or read-only disk would, with no package registry needed."""
    (tmp_path / "file").write_text("")
    return tmp_path / "file" / "root"


def test_first_use_of_a_framework_installs_it_and_a_failure_says_how(tmp_path: Path) -> None:
    root = _unwritable(tmp_path)
    env = {**os.environ, "SANDGATE_AGENTS": str(root)}
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], check=False, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "sandgate: first use of --agent hermes: installing hermes-agent" in out.stderr
    assert out.stdout.startswith("ERROR the hermes agent framework could not be installed")
    assert "sandgate.agents.frameworks install hermes" in out.stdout


def test_first_use_of_the_world_model_builds_it_and_a_failure_says_how(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    root = _unwritable(tmp_path)
    monkeypatch.setattr(llm, "ROOT", root)
    monkeypatch.setattr(llm, "VENV", root / "llama")
    with pytest.raises(SandgateError) as info:
        check_world_model("smollm2")
    text = f"{info.value} {info.value.fix}"
    assert "llama.cpp's server" in text and "-m sandgate.world.llm install smollm2" in text
    assert "installing it failed" in text
    assert not (root / "llama").exists()
