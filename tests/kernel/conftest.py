"""Fixtures for tests against the real kernel: one test world and gateway for the session.

Each test runs real clients (curl, dig, python, git) inside real sandboxes and reads the event
store the gateway wrote. At the end, nothing named sg-*/sandgate* may be left on the machine.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandgate.events.schema import Event, Kind
from sandgate.events.store import Store
from sandgate.session.runner import RunOptions, RunResult, run_in
from sandgate.session.stack import Stack, bring_up
from tests.conftest import sandgate_objects

pytestmark = pytest.mark.kernel

ROOT = os.geteuid() == 0


def leftovers() -> list[str]:
    """Every sg-*/sandgate* object: namespaces, and links and tables in the root namespace."""
    return sorted(sandgate_objects())


@pytest.fixture(scope="session")
def store_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("store") / "events.db"


@pytest.fixture(scope="session")
def stack(store_path: Path) -> Iterator[Stack]:
    if not ROOT:
        pytest.skip("needs root")
    before = leftovers()
    s = bring_up(world=True, store=str(store_path))
    try:
        yield s
    finally:
        s.teardown()
        after = [x for x in leftovers() if x not in before]
        assert not after, f"left behind: {after}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A test that failed because the shared gateway stopped answering shows the end of that
    gateway's log: why it died (a CI run once lost 43 tests to a "double free" said only there,
    in a log gone with the machine)."""
    outcome = yield
    report = outcome.get_result()
    if not report.failed or "GatewayError" not in str(report.longrepr):
        return
    funcargs = getattr(item, "funcargs", {})
    stack = funcargs.get("stack") or getattr(funcargs.get("sandbox"), "stack", None)
    if not isinstance(stack, Stack):
        return
    from sandgate.gateway.manage import log_dir

    log = log_dir() / f"gateway-{stack.instance}.log"
    with contextlib.suppress(OSError):
        tail = log.read_text(errors="replace").splitlines()[-40:]
        report.sections.append((f"the gateway's log ({log}), its end", "\n".join(tail)))


class Runner:
    """Run commands in fresh sandboxes on the shared stack, and read their events."""

    def __init__(self, stack: Stack, store_path: Path) -> None:
        self.stack = stack
        self.store_path = store_path

    def __call__(self, *command: str, **kw: Any) -> RunResult:
        kw.setdefault("world", "test")
        kw.setdefault("timeout", 60)
        opts = RunOptions(command=list(command), store=str(self.store_path), **kw)
        return run_in(self.stack, opts)

    def sh(self, script: str, **kw: Any) -> RunResult:
        return self("sh", "-c", script, **kw)

    def events(self, result: RunResult, kind: Kind | None = None) -> list[Event]:
        store = Store(self.store_path)
        try:
            return store.events(session=result.session, kinds=[kind] if kind else [])
        finally:
            store.close()

    def world_log(self, server: str) -> list[dict[str, Any]]:
        from sandgate.world.servers.launch import read_log

        assert self.stack.world is not None
        return read_log(self.stack.world.logs[server])


@pytest.fixture(scope="session")
def sandbox(stack: Stack, store_path: Path) -> Runner:
    return Runner(stack, store_path)


def conns(events: list[Event], dst: str, port: int | None = None) -> list[Event]:
    return [
        e
        for e in events
        if e.kind is Kind.CONN and e.dst == dst and (port is None or e.port == port)
    ]


def http(events: list[Event], dst: str, port: int | None = None) -> list[Event]:
    return [
        e
        for e in events
        if e.kind is Kind.HTTP and e.dst == dst and (port is None or e.port == port)
    ]


def dns(events: list[Event], name: str) -> list[Event]:
    return [e for e in events if e.kind is Kind.DNS and e.name == name]
