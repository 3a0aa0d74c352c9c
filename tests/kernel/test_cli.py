"""The ``sandgate`` command as a user runs it: exit statuses, JSON output, errors, cleanup."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from sandgate.session.stack import Stack

from .conftest import leftovers

pytestmark = pytest.mark.kernel

SANDGATE = ["/opt/sandgate/venv/bin/sandgate"]


def sg(
    *args: str, home: Path, timeout: float = 120, **kw: object
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SANDGATE_HOME": str(home), "COLUMNS": "200"}
    return subprocess.run(
        [*SANDGATE, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
        **kw,
    )  # type: ignore[call-overload]


@pytest.fixture
def home(store_path: Path) -> Path:
    return store_path.parent


def test_exit_status_passes_through(stack: Stack, home: Path) -> None:
    r = sg(
        "run",
        "--world",
        "test",
        "--instance",
        stack.instance,
        "-q",
        "--",
        "sh",
        "-c",
        "echo hi; exit 7",
        home=home,
    )
    assert r.returncode == 7
    assert r.stdout == "hi\n"


def test_command_not_found_is_127_with_a_message(stack: Stack, home: Path) -> None:
    r = sg(
        "run",
        "--world",
        "test",
        "--instance",
        stack.instance,
        "-q",
        "--",
        "no-such-tool",
        home=home,
    )
    assert r.returncode == 127
    assert "command not found inside the sandbox: 'no-such-tool'" in r.stderr
    assert not [x for x in leftovers() if "-s" in x and stack.instance in x]


def test_timeout_kills_the_sandbox(stack: Stack, home: Path) -> None:
    start = time.monotonic()
    r = sg(
        "run",
        "--world",
        "test",
        "--instance",
        stack.instance,
        "-q",
        "--timeout",
        "1",
        "--",
        "sleep",
        "30",
        home=home,
    )
    assert r.returncode == 124
    assert time.monotonic() - start < 15
    assert "timed out after 1 s" in r.stderr


def test_json_report_and_log(stack: Stack, home: Path) -> None:
    r = sg(
        "run",
        "--world",
        "test",
        "--instance",
        stack.instance,
        "--mode",
        "locked",
        "--json",
        "--",
        "curl",
        "--noproxy",
        "*",
        "-sS",
        "-m",
        "2",
        "https://example.com/",
        home=home,
    )
    assert r.returncode != 0  # locked: the name does not resolve
    report = json.loads(r.stdout.strip().splitlines()[-1])
    assert report["mode"] == "locked"
    assert "example.com" in report["names_denied"]
    log = sg("log", "--session", report["session"], "--json", home=home)
    events = [json.loads(line) for line in log.stdout.splitlines()]
    assert any(
        e["kind"] == "dns"
        and e["name"] == "example.com"
        and e["verdict"] == "deny"
        and e["uid"] == 61000
        for e in events
    )
    last = sg("log", "--session", "last", "--json", "--kind", "dns", home=home)
    assert last.stdout == "".join(
        line + "\n" for line in log.stdout.splitlines() if json.loads(line)["kind"] == "dns"
    )


def test_explain_json(home: Path) -> None:
    r = sg(
        "explain",
        "--mode",
        "open",
        "--json",
        "10.0.0.1",
        "[::ffff:169.254.169.254]",
        "0x7f000001",
        "198.51.100.7:443",
        "http://[64:ff9b::a00:1]/",
        "localhost",
        "garbage!!",
        home=home,
    )
    assert r.returncode == 0, r.stderr
    rows = {row["target"]: row for row in map(json.loads, r.stdout.splitlines())}
    assert rows["10.0.0.1"]["verdict"] == "deny" and rows["10.0.0.1"]["reason"] == "deny.private"
    assert rows["[::ffff:169.254.169.254]"]["reason"] == "deny.metadata"
    assert rows["0x7f000001"]["reason"] == "deny.loopback"
    assert rows["198.51.100.7:443"]["reason"] == "deny.documentation"
    assert rows["http://[64:ff9b::a00:1]/"]["reason"] == "deny.private"
    assert rows["localhost"]["verdict"] == "deny"
    assert rows["garbage!!"]["reason"] == "deny.unparseable"
    for row in rows.values():
        assert {"target", "verdict", "rule", "reason"} <= row.keys()


def test_policy_check_names_lines(tmp_path: Path, home: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[profiles.coder]\ninternet = "open"\nallow = [\n  { host = "10.0.0.1", prot = 3 },\n'
        '  { cidr = "10.0.0.0/33" },\n]\n'
    )
    r = sg("policy", "check", str(bad), home=home)
    assert r.returncode == 1
    assert f"{bad}:4" in r.stderr and "did you mean" in r.stderr
    assert f"{bad}:5" in r.stderr
    good = tmp_path / "good.toml"
    good.write_text(
        '[profiles.coder]\ninternet = "locked"\nallow = [{ host = "10.77.0.10", port = 8000 }]\n'
    )
    assert sg("policy", "check", str(good), home=home).returncode == 0


def test_without_root_capabilities_a_one_line_reason(home: Path) -> None:
    # uid 0 but no capabilities: what an unprivileged user would see.
    r = subprocess.run(
        ["setpriv", "--inh-caps=-all", "--bounding-set=-all", "--", *SANDGATE, "run", "--", "true"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env={**os.environ, "SANDGATE_HOME": str(home)},
    )
    assert r.returncode == 2
    assert "needs root" in r.stderr and "CAP_NET_ADMIN" in r.stderr


def test_cleanup_after_a_crash(tmp_path: Path) -> None:
    # A run killed with SIGKILL leaves its world, gateway and sandbox behind; cleanup removes all.
    home = tmp_path
    before = leftovers()
    proc = subprocess.Popen(
        [*SANDGATE, "run", "--world", "test", "-q", "--", "sleep", "60"],
        env={**os.environ, "SANDGATE_HOME": str(home)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(leftovers()) <= len(before) + 4:
        time.sleep(0.2)
    time.sleep(1)
    crashed = [x for x in leftovers() if x not in before]
    assert len(crashed) >= 5, crashed  # four world namespaces and the sandbox's
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    r = sg("cleanup", home=home)
    assert r.returncode == 0, r.stderr
    assert "removed" in r.stdout
    assert not [x for x in leftovers() if x not in before]
    daemons = subprocess.run(
        ["pgrep", "-f", "sandgate.gateway.daemon"], capture_output=True, text=True, check=False
    ).stdout.split()
    servers = subprocess.run(
        ["pgrep", "-f", "sandgate.world.servers"], capture_output=True, text=True, check=False
    ).stdout.split()
    assert not (set(daemons) | set(servers)) - _pids_of_other_stacks()


def _pids_of_other_stacks() -> set[str]:
    # Processes of the shared test stack of this session are not leftovers.
    out = set()
    for path in Path("/run/sandgate/pids").glob("*.json"):
        try:
            out |= {str(p) for p in json.loads(path.read_text())["pids"]}
        except (OSError, ValueError, KeyError):
            continue
    for path in Path("/run/sandgate").glob("*/daemon.pid"):
        out.add(path.read_text().strip())
    return out
