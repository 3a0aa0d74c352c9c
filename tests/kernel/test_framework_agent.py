"""A real agent framework (Hermes Agent from PyPI) on one task, locked and open, in the test world.

The framework runs from its own venv under /opt/sandgate/agents (read-only to the sandbox);
the world's model servers replay scripted turns (src/sandgate/agents/scripts/hermes.json), so
Hermes's own code calls its terminal tool, which runs curl and grep in the sandbox. Checked:
its start-up traffic (update check, tool download, model metadata) is in the log before the
first tool command, with the sandbox's uid; the tool commands' traffic is there after it; the
gateway injected the hosted API's key; the run ends well inside its timeout.

Install the framework first (20 s, needs PyPI):
    /opt/sandgate/venv/bin/python -m sandgate.agents.frameworks install hermes
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandgate.agents import frameworks
from sandgate.events.schema import Event, Kind
from sandgate.events.store import Store
from sandgate.session.runner import RunOptions, RunResult, run_in
from sandgate.session.stack import Stack, bring_up
from sandgate.world import topology
from sandgate.world.servers.chatwire import Script
from sandgate.world.servers.launch import read_log

pytestmark = pytest.mark.kernel

NAME = "hermes"
TASK = "T13"
TIMEOUT = 120.0
UID = 61000
MARKER = frameworks.marker(NAME, TASK)
INSTALL = f"/opt/sandgate/venv/bin/python -m sandgate.agents.frameworks install {NAME}"

needs_framework = pytest.mark.skipif(
    os.geteuid() != 0 or frameworks.installed(NAME) is None,
    reason=f"needs root and {NAME} installed from its lock (install: {INSTALL})",
)


# -- what needs no kernel -------------------------------------------------------------------------


def test_scripts_load_and_cover_every_task() -> None:
    merged = Script.model_validate(frameworks.world_script())
    matches = [c.match for c in merged.conversations]
    assert len(matches) == len(set(matches)), "two conversations share a marker"
    for task in frameworks.TASKS:  # Hermes: every task; the others at least C00 and T13
        assert frameworks.marker("hermes", task) in matches
    for name in frameworks.FRAMEWORKS:
        for task in ("C00", "T13"):
            assert frameworks.marker(name, task) in matches
    # Hermes's tool names and argument names, as its schemas define them
    tools = {
        tc.name: set(tc.arguments) if isinstance(tc.arguments, dict) else set()
        for c in merged.conversations
        if c.match.startswith("[hermes]")
        for t in c.turns
        for tc in t.tool_calls
    }
    assert tools == {"terminal": {"command"}, "read_file": {"path"}}


def test_suite_agent_and_command_template() -> None:
    argv = frameworks.agent_command(NAME, "openai")
    assert argv[:2] == ["/bin/sh", "-c"]
    assert not re.search(r"\{[a-z_]+\}", argv[2]) and frameworks.PROMPT_FILE in argv[2]
    assert "/opt/sandgate/agents/hermes/home/openai/." in argv[2]
    env = frameworks.agent_env(NAME, "lan", explicit_proxy=False)
    assert env["HERMES_HOME"] == "/home/agent/.hermes" and env["https_proxy"] == ""
    with pytest.raises(KeyError):
        frameworks.agent_command("no-such-agent")
    # the prompt file carries the task marker, the command the framework's tag: together the
    # text the script matches
    assert (
        frameworks.prompt(TASK)
        == "[task T13] Download https://example.com/ and tell me its title.\n"
    )
    assert '-q "[hermes] $(cat /run/sandgate/prompt.txt)"' in argv[2]
    assert MARKER == "[hermes] [task T13]"
    if frameworks.installed(NAME) is not None:
        spec = frameworks.agent_spec(NAME)
        assert spec.home == Path("/opt/sandgate/agents/hermes/home/lan")
        assert spec.env["HERMES_HOME"] == "/home/agent/.hermes"


# -- the real framework in the test world ---------------------------------------------------------


@pytest.fixture(scope="module")
def agent_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, str]]:
    """A test world of our own whose model servers replay the frameworks' scripts (and log
    request bodies, so the tool results Hermes sent back can be read)."""
    if os.geteuid() != 0 or frameworks.installed(NAME) is None:
        pytest.skip(f"needs root and {NAME} installed (install: {INSTALL})")
    original = topology.TestWorld._start

    def with_script(
        self: topology.TestWorld,
        server: str,
        config: dict[str, Any],
        log: Path,
        netns: str,
        label: str | None = None,
    ) -> Any:
        if server == "model":
            config = {"script": frameworks.world_script(), "log_bodies": True, **config}
        return original(self, server, config, log, netns, label)

    store = str(tmp_path_factory.mktemp("agent-store") / "events.db")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(topology.TestWorld, "_start", with_script)
        stack = bring_up(world=True, store=store)
    try:
        yield stack, store
    finally:
        stack.teardown()


@pytest.fixture
def work() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="sg-agenttest-") as d:
        path = Path(d)
        path.chmod(0o777)
        yield path


class Ran:
    def __init__(
        self,
        result: RunResult,
        events: list[Event],
        model: list[dict[str, Any]],
        started: float,
        elapsed: float,
    ) -> None:
        self.result, self.events, self.model = result, events, model
        self.started, self.elapsed = started, elapsed

    def turn(self, n: int) -> dict[str, Any]:
        return next(r for r in self.model if r.get("turn") == n)

    def first_tool_command(self) -> float:
        """When the model's first tool call had been delivered: no tool ran before."""
        return float(self.turn(0)["ts"])

    def tool_results(self) -> list[str]:
        """The tool results Hermes sent back, in order (the request of the last turn)."""
        messages = self.turn(2)["body"]["messages"]
        return [str(m["content"]) for m in messages if m.get("role") == "tool"]


def _start(e: Event) -> float:
    return e.ts - float((e.details or {}).get("duration_ms", 0)) / 1000


def _run(
    agent_stack: tuple[Stack, str], work: Path, *, mode: str, endpoint: str, explicit_proxy: bool
) -> Ran:
    stack, store = agent_stack
    opts = RunOptions(**frameworks.run_fields(
        NAME, TASK, endpoint=endpoint, mode=mode, explicit_proxy=explicit_proxy,
        timeout=TIMEOUT, store=store, workdir=work,
    ))  # fmt: skip
    server = "openai" if endpoint == "openai" else "model"
    assert stack.world is not None
    t0 = time.time()
    try:
        result = run_in(stack, opts)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(opts.files[frameworks.PROMPT_FILE])
    elapsed = time.time() - t0
    s = Store(store)
    try:
        events = s.events(session=result.session)
    finally:
        s.close()
    model = [
        r
        for r in read_log(stack.world.logs[server])
        if r.get("event") == "request" and r.get("match") == MARKER and r["ts"] >= t0
    ]
    return Ran(result, events, model, t0, elapsed)


def _names(events: list[Event], kind: Kind, before: float | None = None) -> set[str]:
    return {
        e.name
        for e in events
        if e.kind is kind and e.name and (before is None or _start(e) < before)
    }


def _common(ran: Ran) -> None:
    """Every run: it finished on its own, well inside its timeout, after the scripted turns;
    and every attempt was made by the sandbox's uid."""
    assert ran.result.exit_code == 0, ran.result.message
    assert ran.elapsed < TIMEOUT / 2, f"took {ran.elapsed:.1f} s"
    assert [r["turn"] for r in ran.model] == [0, 1, 2], ran.model
    attempts = [e for e in ran.events if e.kind in (Kind.DNS, Kind.CONN, Kind.HTTP)]
    assert attempts and {e.uid for e in attempts} == {UID}


@needs_framework
def test_hermes_locked_lan(agent_stack: tuple[Stack, str], work: Path) -> None:
    """Locked, model via models.lan, no explicit proxy: Hermes's start-up lookups are
    answered (pypi.org and github.com are allowed names) but their connections refused, and
    openrouter.ai is not even answered; then its terminal tool's curl finds no example.com."""
    ran = _run(agent_stack, work, mode="locked", endpoint="lan", explicit_proxy=False)
    _common(ran)
    first_tool = ran.first_tool_command()
    asked_early = _names(ran.events, Kind.DNS, before=first_tool)
    assert {"pypi.org", "github.com", "openrouter.ai", "models.lan"} <= asked_early
    refused_early = {
        (e.dst, e.port, e.reason)
        for e in ran.events
        if e.kind is Kind.CONN and _start(e) < first_tool
    }
    assert ("203.0.113.20", 443, "deny.locked") in refused_early  # PyPI: the update check
    assert ("203.0.113.30", 443, "deny.locked") in refused_early  # GitHub: tirith download
    # the tool commands' traffic: after the first tool call, and refused
    example = [e for e in ran.events if e.kind is Kind.DNS and e.name == "example.com"]
    assert example and all(_start(e) >= first_tool for e in example)
    assert {e.reason for e in example} == {"deny.locked"}
    curl, grep = ran.tool_results()
    assert '"exit_code": 0' not in curl and "Example Domain" not in curl + grep
    assert not (work / "example.html").exists()
    # the model, reached through the gateway's TLS front, with the key from the config
    models = [e for e in ran.events if e.kind is Kind.HTTP and e.name == "models.lan"]
    assert models and {e.reason for e in models} == {"allow.exempt"}
    assert {r["authorization"] for r in ran.model} == {"Bearer sk-none"}


@needs_framework
def test_hermes_open_hosted_api_with_injected_key(
    agent_stack: tuple[Stack, str], work: Path
) -> None:
    """Open, model via the api.openai.com look-alike: the sandbox holds a placeholder, the
    world's server sees the real key; start-up connections succeed; the page is fetched."""
    stack, _ = agent_stack
    ran = _run(agent_stack, work, mode="open", endpoint="openai", explicit_proxy=False)
    _common(ran)
    first_tool = ran.first_tool_command()
    assert {"pypi.org", "github.com", "openrouter.ai", "models.dev"} <= _names(
        ran.events, Kind.DNS, before=first_tool
    )
    early = {(e.dst, e.port, e.verdict) for e in ran.events if e.kind is Kind.CONN
             and _start(e) < first_tool}  # fmt: skip
    assert {("203.0.113.20", 443, "allow"), ("203.0.113.30", 443, "allow")} <= early
    # the key: injected by the gateway on every model request, never seen in the sandbox
    api = [e for e in ran.events if e.kind is Kind.HTTP and e.name == "api.openai.com"]
    assert api and all((e.details or {}).get("credentials") == ["injected:openai"] for e in api)
    real = stack.world.gateway_env["OPENAI_API_KEY"] if stack.world else ""
    assert real and {r["authorization"] for r in ran.model} == {f"Bearer {real}"}
    # the tool commands: curl reached example.com after the first tool call; grep read it
    example = [e for e in ran.events if e.kind is Kind.CONN and e.dst == "203.0.113.10"]
    assert example and all(_start(e) >= first_tool and e.verdict == "allow" for e in example)
    curl, grep = ran.tool_results()
    assert json.loads(curl)["exit_code"] == 0
    assert "<title>Example Domain</title>" in grep
    assert "<title>Example Domain</title>" in (work / "example.html").read_text()


@needs_framework
def test_hermes_open_through_the_explicit_proxy(agent_stack: tuple[Stack, str], work: Path) -> None:
    """Open, models.lan, sandgate's default environment (https_proxy set): Hermes's start-up
    traffic shows as CONNECT requests the gateway resolved, before the first tool command."""
    ran = _run(agent_stack, work, mode="open", endpoint="lan", explicit_proxy=True)
    _common(ran)
    first_tool = ran.first_tool_command()
    connects = {
        e.name: e
        for e in ran.events
        if e.kind is Kind.HTTP and (e.details or {}).get("method") == "CONNECT"
    }
    for name in ("pypi.org", "github.com", "openrouter.ai"):
        assert name in connects and _start(connects[name]) < first_tool, name
    assert connects["openrouter.ai"].reason == "deny.unresolvable"  # not in the world's DNS
    assert connects["example.com"].verdict == "allow"
    assert _start(connects["example.com"]) >= first_tool
    assert "<title>Example Domain</title>" in ran.tool_results()[1]
