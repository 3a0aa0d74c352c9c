"""``sandgate log verify`` end to end: a real session through the test world, the store the
gateway wrote verifies; one verdict changed with the sqlite3 binary is named; put back, it
verifies again."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from sandgate.session.stack import Stack

from .test_cli import sg

pytestmark = pytest.mark.kernel


def sqlite(store: Path, statement: str) -> str:
    return subprocess.run(
        ["sqlite3", str(store), statement], capture_output=True, text=True, check=True, timeout=30
    ).stdout.strip()


def test_log_verify_names_a_verdict_changed_with_sqlite3(stack: Stack, store_path: Path) -> None:
    home = store_path.parent
    curl = ["curl", "--noproxy", "*", "-sS", "-m", "2", "https://example.com/"]
    r = sg("run", "--world", "test", "--instance", stack.instance, "--mode", "locked", "--json",
           "--", *curl, home=home)  # fmt: skip
    sid = json.loads(r.stdout.strip().splitlines()[-1])["session"]
    ok = sg("log", "verify", home=home)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("ok: ") and "signed checkpoints check out" in ok.stdout
    assert sg("log", "verify", "--session", sid, home=home).returncode == 0

    row = sqlite(store_path, f"SELECT id FROM events WHERE session = '{sid}' AND kind = 'dns'"
                             " AND name = 'example.com' AND verdict = 'deny' LIMIT 1")  # fmt: skip
    assert row, "the session's denied question is in the store"
    sqlite(store_path, f"UPDATE events SET verdict = 'allow' WHERE id = {row}")
    bad = sg("log", "verify", home=home)
    assert bad.returncode == 1
    assert bad.stderr.startswith(f"event {row} (session {sid}): changed"), bad.stderr
    assert sg("log", "verify", "--session", sid, home=home).returncode == 1
    assert sg("log", "--session", sid, home=home).returncode == 0  # still readable

    sqlite(store_path, f"UPDATE events SET verdict = 'deny' WHERE id = {row}")
    again = sg("log", "verify", home=home)
    assert again.returncode == 0, again.stderr


def test_the_gateway_stores_from_a_process_of_its_own(stack: Stack, store_path: Path) -> None:
    """events/writer.py: the daemon's batches go to a child it started, which holds the store."""
    with stack.gateway.client() as ctl:
        pid = ctl.call("metrics")["store_writer_pid"]
    assert pid and pid != stack.gateway.pid
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    assert stat[0] != "Z" and int(stat[1]) == stack.gateway.pid
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert b"sandgate.events.writer" in argv and str(store_path).encode() in argv
    held = {os.readlink(f) for f in Path(f"/proc/{pid}/fd").iterdir()}
    assert str(store_path) in held
