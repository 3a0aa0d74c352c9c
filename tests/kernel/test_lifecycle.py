"""Lifecycle from the outside: a dead gateway closes everything; signals tear everything down."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from sandgate.session.runner import RunOptions, run_in
from sandgate.session.stack import Stack, bring_up

from .conftest import Runner, dns, http, leftovers

pytestmark = pytest.mark.kernel

SANDGATE = "/opt/sandgate/venv/bin/sandgate"


def test_killed_gateway_leaves_guests_no_way_out(tmp_path: Path) -> None:
    """SIGKILL the daemon mid-session: the guest's link vanishes with the gateway's namespace."""
    stack = bring_up(world=True, store=str(tmp_path / "events.db"))
    try:
        work = Path(tempfile.mkdtemp(prefix="sg-test-"))
        work.chmod(0o777)
        script = (
            "for i in $(seq 1 40); do "
            "if curl -s -m 1 -o /dev/null http://198.51.100.10/; then echo ok; else echo fail; fi; "
            "sleep 0.1; done > /work/log.txt; ip -o link > /work/links.txt"
        )
        result = {}

        def session() -> None:
            result["r"] = run_in(
                stack,
                RunOptions(
                    command=["sh", "-c", script],
                    world="test",
                    mode="open",
                    workdir=work,
                    timeout=60,
                    store=str(tmp_path / "events.db"),
                ),
            )

        t = threading.Thread(target=session)
        t.start()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            log = work / "log.txt"
            if log.exists() and log.read_text().count("ok") >= 3:
                break
            time.sleep(0.05)
        os.kill(stack.gateway.pid, signal.SIGKILL)
        killed_at = len((work / "log.txt").read_text().split())
        t.join(90)
        lines = (work / "log.txt").read_text().split()
        assert "ok" in lines[:killed_at]
        # At most the request in flight at the moment of the kill may have finished.
        assert "ok" not in lines[killed_at + 1 :], lines
        assert "eth0" not in (work / "links.txt").read_text()  # its only link is gone
        assert "gateway died" in (result["r"].message or "")
    finally:
        stack.teardown()
        subprocess.run(["rm", "-rf", str(work)], check=False)


def test_sigterm_to_run_tears_everything_down(stack: Stack, store_path: Path) -> None:
    # Only this run's objects and process are counted: other work may come and go beside it.
    before = set(leftovers())
    nap = f"{60 + os.getpid() % 1000 / 1000:.3f}"  # `sleep 60.NNN`: a command line of our own
    proc = subprocess.Popen(
        [SANDGATE, "run", "--world", "test", "--instance", stack.instance, "--", "sleep", nap],
        env={**os.environ, "SANDGATE_HOME": str(store_path.parent)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not set(leftovers()) - before:
        time.sleep(0.1)
    assert set(leftovers()) - before, "the sandbox never came up"
    time.sleep(0.5)
    # This stack's objects and session cgroups: other engineers' stacks come and go meanwhile.
    ours = {x for x in set(leftovers()) - before if stack.instance in x or "sandgate-2" in x}
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, err
    assert "stopped by signal SIGTERM" in err
    with stack.gateway.client() as ctl:  # the gateway's warm pool refilled meanwhile: its own
        warm = {f"netns {n}" for n in ctl.call("status")["warm"]["ready"]}
    assert not (ours & set(leftovers())) - warm
    pgrep = subprocess.run(["pgrep", "-f", f"sleep {nap}"], capture_output=True, check=False)
    assert not pgrep.stdout


def test_adhoc_allow_and_deny_rules(sandbox: Runner) -> None:
    r = sandbox.sh(
        "curl --noproxy '*' -sS -m 3 -o /dev/null https://example.com/ && echo fetched; "
        "curl --noproxy '*' -sS -m 3 -o /dev/null https://www.example.com/ || echo refused",
        mode="allowlist",
        allow=["example.com", "*.example.com"],
        deny=["www.example.com"],
    )
    events = sandbox.events(r)
    asked = [e for e in dns(events, "example.com") if e.details.get("qtype") == "A"]
    assert asked[0].rule == "--allow[0] (example.com)"
    assert http(events, "203.0.113.10", 443)[0].verdict == "allow"
    denied = [e for e in dns(events, "www.example.com") if e.details.get("qtype") == "A"]
    assert denied and denied[0].reason == "deny.rule"
    assert denied[0].rule == "--deny[0] (www.example.com)"


def test_the_daemon_runs_with_two_malloc_arenas(stack: Stack) -> None:
    """Its many threads would each take an arena and spread freed memory over them (RSS grew
    twice as fast in the soak); a user's own MALLOC_ARENA_MAX would win."""
    environ = Path(f"/proc/{stack.gateway.pid}/environ").read_bytes().split(b"\0")
    expected = os.environ.get("MALLOC_ARENA_MAX", "2").encode()
    assert b"MALLOC_ARENA_MAX=" + expected in environ
