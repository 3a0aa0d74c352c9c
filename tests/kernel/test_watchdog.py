"""The gateway watching itself: broken on purpose from outside, it must notice within two
intervals, cut every guest off (not just log), raise an alarm, and recover. And a gateway
weakened behind the policy's back must make `prove` fail."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandgate.events.schema import Kind
from sandgate.events.store import Store
from sandgate.prove.runner import ProveOptions, prove_on
from sandgate.session.runner import RunOptions, RunResult, run_in
from sandgate.session.stack import Stack, bring_up

pytestmark = pytest.mark.kernel

INTERVAL = 0.5


@pytest.fixture(scope="module")
def alarms() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="sg-alarms-"))
    yield folder / "alarms.jsonl"
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory, alarms: Path) -> Iterator[Stack]:
    store = tmp_path_factory.mktemp("wd") / "events.db"
    notify = f'printf "%s\\n" "$SANDGATE_ALARM" >> {alarms}'
    stack = bring_up(
        world=True,
        store=str(store),
        watchdog=INTERVAL,
        notify=notify,
        extra_env={"SANDGATE_FAULTS": "1"},
    )
    try:
        yield stack
    finally:
        stack.teardown()


def _status(stack: Stack) -> dict[str, Any]:
    with stack.gateway.client() as ctl:
        return ctl.call("status")["integrity"]


def _wait(stack: Stack, cut: bool, within: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < within:
        if _status(stack)["cut"] == cut:
            return time.monotonic() - start
        time.sleep(0.05)
    raise AssertionError(
        f"the gateway did not become cut={cut} within {within} s: {_status(stack)}"
    )


class Session:
    """A sandbox that keeps trying the model server and DNS, writing what it sees."""

    def __init__(
        self, stack: Stack, work: Path, policy: str | None = None, probe: str | None = None
    ) -> None:
        self.work = work
        probe = probe or "curl --noproxy '*' -s -m 1 -o /dev/null http://10.77.0.10:8000/v1/models"
        script = (
            f"while true; do if {probe}; "
            "then echo ok; else echo fail; fi >> /work/log; sleep 0.2; done"
        )
        self.stop = threading.Event()
        opts = RunOptions(
            command=["sh", "-c", script],
            world="test",
            workdir=work,
            timeout=120,
            stop=self.stop,
            store=str(stack.config.store) if stack.config else None,
            policy=policy,
        )
        self.result: RunResult | None = None
        self.thread = threading.Thread(target=self._run, args=(stack, opts), daemon=True)
        self.thread.start()
        self.wait_for("ok")

    def _run(self, stack: Stack, opts: RunOptions) -> None:
        self.result = run_in(stack, opts)

    def lines(self) -> list[str]:
        path = self.work / "log"
        return path.read_text().split() if path.exists() else []

    def wait_for(self, word: str, after: int = 0, within: float = 15) -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if word in self.lines()[after:]:
                return
            time.sleep(0.05)
        raise AssertionError(f"no {word!r} after line {after}: {self.lines()[after:]}")

    def end(self) -> None:
        self.stop.set()
        self.thread.join(30)


@pytest.fixture
def session(watched: Stack) -> Iterator[Session]:
    work = Path(tempfile.mkdtemp(prefix="sg-wd-"))
    work.chmod(0o777)
    s = Session(watched, work)
    try:
        yield s
    finally:
        s.end()
        shutil.rmtree(work, ignore_errors=True)


def _cut_and_recover(stack: Stack, session: Session, alarms: Path, what: str) -> None:
    took = _wait(stack, True, within=2 * INTERVAL + 1.5)
    assert took <= 2 * INTERVAL + 1.5
    mark = len(session.lines())
    session.wait_for("fail", after=mark)  # cut off: not just logged
    _wait(stack, False, within=10)  # repaired, checked, let back on
    session.wait_for("ok", after=len(session.lines()))
    store = Store(stack.config.store) if stack.config else Store()
    try:
        events = store.events(kinds=[Kind.INTEGRITY])
    finally:
        store.close()
    assert any(what in " ".join(e.details.get("problems", [])) for e in events)
    assert any(e.details.get("integrity") == "recovered" for e in events)
    assert any(what in line for line in alarms.read_text().splitlines())


def test_a_rule_deleted_from_outside(watched: Stack, session: Session, alarms: Path) -> None:
    ns = f"--net=/proc/{watched.gateway.pid}/ns/net"
    listing = subprocess.run(
        ["nsenter", ns, "nft", "-a", "list", "chain", "inet", "sandgate", "forward"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    handle = next(
        line.rsplit("# handle ", 1)[1]
        for line in listing.splitlines()
        if "ct state invalid" in line
    )
    subprocess.run(
        ["nsenter", ns, "nft", "delete", "rule", "inet", "sandgate", "forward", "handle", handle],
        check=True,
    )
    _cut_and_recover(watched, session, alarms, "ruleset")


def test_an_accept_rule_added_from_outside(watched: Stack, session: Session, alarms: Path) -> None:
    ns = f"--net=/proc/{watched.gateway.pid}/ns/net"
    subprocess.run(
        [
            "nsenter",
            ns,
            "nft",
            "insert",
            "rule",
            "inet",
            "sandgate",
            "forward",
            "ip",
            "daddr",
            "169.254.0.0/16",
            "accept",
        ],
        check=True,
    )
    _cut_and_recover(watched, session, alarms, "ruleset")


def test_questions_while_cut_off_are_events(watched: Stack, alarms: Path) -> None:
    """Refused while cut off, each DNS question is still stored: ``deny.cut``, with its name."""
    work = Path(tempfile.mkdtemp(prefix="sg-wd-"))
    work.chmod(0o777)
    asking = Session(watched, work, probe="getent ahostsv4 example.com >/dev/null")
    try:
        ns = f"--net=/proc/{watched.gateway.pid}/ns/net"
        rule = ["inet", "sandgate", "forward", "ip", "daddr", "169.254.0.0/16", "accept"]
        subprocess.run(["nsenter", ns, "nft", "insert", "rule", *rule], check=True)
        _cut_and_recover(watched, asking, alarms, "ruleset")
    finally:
        asking.end()
        shutil.rmtree(work, ignore_errors=True)
    store = Store(watched.config.store) if watched.config else Store()
    try:
        events = store.events(kinds=[Kind.DNS])
    finally:
        store.close()
    cut = [e for e in events if e.reason == "deny.cut"]
    assert cut and all(e.name == "example.com" and e.verdict == "deny" for e in cut), cut[:3]


@pytest.mark.parametrize("part", ["resolver", "proxy"])
def test_a_killed_part(watched: Stack, session: Session, alarms: Path, part: str) -> None:
    with watched.gateway.client() as ctl:
        ctl.call("fault", what=part)
    _cut_and_recover(watched, session, alarms, part)


def test_a_corrupted_policy_file_keeps_the_last_good_policy(watched: Stack, alarms: Path) -> None:
    assert watched.world is not None
    folder = Path(tempfile.mkdtemp(prefix="sg-wdpol-"))
    folder.chmod(0o755)
    policy = folder / "p.toml"
    shutil.copy(watched.world.policy, policy)
    work = Path(tempfile.mkdtemp(prefix="sg-wd-"))
    work.chmod(0o777)
    s = Session(watched, work, policy=str(policy))
    try:
        time.sleep(2 * INTERVAL)
        policy.write_text('[profiles.agent]\ninternet = "open"\nallow = [ { hots = 1 } ]\n')
        deadline = time.monotonic() + 4 * INTERVAL + 2
        while time.monotonic() < deadline:
            if "is invalid" in alarms.read_text():
                break
            time.sleep(0.1)
        assert "the last good policy stays in force" in alarms.read_text()
        assert not _status(watched)["cut"]
        mark = len(s.lines())
        s.wait_for("ok", after=mark)  # still working, under the last good policy
        policy.unlink()  # unreadable now
        time.sleep(3 * INTERVAL)
        assert "No such file" in alarms.read_text()
        s.wait_for("ok", after=len(s.lines()))
    finally:
        s.end()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(folder, ignore_errors=True)


def test_a_killed_daemon_leaves_no_way_out_and_a_restart_brings_guests_back(watched: Stack) -> None:
    work = Path(tempfile.mkdtemp(prefix="sg-wd-"))
    work.chmod(0o777)
    s = Session(watched, work)
    try:
        old = watched.gateway.pid
        os.kill(old, signal.SIGKILL)
        watched.gateway.proc.wait() if watched.gateway.proc else None
        mark = len(s.lines())
        s.wait_for("fail", after=mark)
        time.sleep(1)
        while_down = s.lines()[mark:]
        assert "ok" not in while_down[1:], while_down  # nothing got out while it was down
        watched.restart_gateway()
        assert watched.gateway.pid != old
        s.wait_for("ok", after=len(s.lines()), within=20)  # the same sandbox, online again
        assert s.thread.is_alive()
    finally:
        s.end()
        shutil.rmtree(work, ignore_errors=True)


def test_a_rogue_resolver_makes_prove_fail(watched: Stack) -> None:
    with watched.gateway.client() as ctl:
        ctl.call("fault", what="resolver-open")
    store = str(watched.config.store) if watched.config else None
    result = prove_on(watched, ProveOptions(world="test", mode="locked", store=store))
    failed = {r.probe for r in result.failed}
    # The names it should have refused now resolve: the exfiltration name reached upstream.
    # (A rebinding answer is still refused by the answer filter behind the name policy, unless
    # the watchdog's cut happens to land during that probe: not asserted either way.)
    assert "long-label DNS exfiltration" in failed
