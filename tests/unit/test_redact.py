"""Secrets never reach a log: targets and command lines, one rule (events/redact.py)."""

from __future__ import annotations

import pytest

from sandgate.events.redact import redact_arg, redact_target
from sandgate.gateway.logs.procparse import ProcInfo


@pytest.mark.parametrize(
    ("word", "shown"),
    [
        ("https://u:p@pypi.org/simple/?token=sk-1#x", "https://…@pypi.org/simple/?…"),
        ("--url=https://pypi.org/?key=sk-1", "--url=https://pypi.org/?…"),
        ("Authorization: Bearer sk-live-1", "Authorization: …"),
        ("x-api-key:sk-1", "x-api-key: …"),
        ("--password=hunter2", "--password=…"),
        ("--api-key=sk-1", "--api-key=…"),
        ("-sS", "-sS"),
        ("/usr/bin/curl", "/usr/bin/curl"),
        ("https://pypi.org/simple/", "https://pypi.org/simple/"),
    ],
)
def test_command_line_words(word: str, shown: str) -> None:
    assert redact_arg(word) == shown


def test_targets() -> None:
    assert redact_target("user:pass@example.com:443") == "…@example.com:443"
    assert redact_target("/search?q=secret") == "/search?…"


def test_a_process_record_carries_no_secret() -> None:
    info = ProcInfo(
        7,
        "/usr/bin/curl",
        ["curl", "-H", "Authorization: Bearer sk-live-9", "https://u:p@h.example/?t=sk-9"],
        [(7, "curl")],
        "tool",
    )
    text = str(info.details())
    assert "sk-live-9" not in text and "sk-9" not in text and "u:p@" not in text
    assert info.details()["cmdline"][0] == "curl"
