"""Every command's --help renders (help texts hold brackets that are not markup)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from sandgate.cli import app

COMMANDS = [
    ["run"], ["explain"], ["log"], ["report"], ["suite"], ["watch"], ["prove"],
    ["cleanup"], ["demo"], ["up"], ["down"], ["policy", "check"],
    ["export", "cilium"], ["export", "k8s-networkpolicy"],
]  # fmt: skip


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_renders(command: list[str]) -> None:
    result = CliRunner().invoke(app, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output


def test_run_help_shows_rule_syntax_and_session_options() -> None:
    out = CliRunner().invoke(app, ["run", "--help"], terminal_width=200).output
    for text in ("TARGET[:PORTS][/PROTO]", "--fixtures", "--home-template", "--keep-writes"):
        assert text in out
