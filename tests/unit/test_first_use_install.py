"""An agent framework's first use installs it, saying so; a failed install says how to retry
and leaves no half-built venv (a stamped venv is what "installed" means)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """
from sandgate.agents import registry
from sandgate.errors import SandgateError
try:
    registry.resolve("hermes")
except SandgateError as exc:
    print("ERROR", exc.message, "|", exc.fix)
"""


def test_first_use_of_a_framework_installs_it_and_a_failure_says_how(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "SANDGATE_AGENTS": str(tmp_path / "agents"),
        # no package registry: pip fails at once, as it would offline
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_INDEX": "1",
    }
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "sandgate: first use of --agent hermes: installing hermes-agent" in out.stderr
    assert out.stdout.startswith("ERROR the hermes agent framework could not be installed")
    assert "sandgate.agents.frameworks install hermes" in out.stdout
    assert not (tmp_path / "agents" / "hermes").exists()  # nothing half-built stays
