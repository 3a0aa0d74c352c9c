"""A real model in the test world (issue 15): llama.cpp serving SmolLM2-135M behind the relay,
reached from a sandbox through the gateway's TLS front, streaming SSE; a real framework on it.

Few and bounded: one world, one sandboxed client, one Hermes session. Skipped unless the model
is installed (python -m sandgate.world.llm install smollm2; ./setup.sh test does it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandgate.agents import frameworks
from sandgate.agents.registry import resolve
from sandgate.events.schema import Kind
from sandgate.events.store import Store
from sandgate.session.runner import RunOptions, run_in
from sandgate.session.stack import Stack, bring_up
from sandgate.session.suite import SuiteOptions, run_suite_in
from sandgate.session.tasks import load_tasks
from sandgate.world import llm

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "examples" / "tasks" / "report-000.toml"

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root"),
    pytest.mark.skipif(not llm.installed("smollm2"), reason=llm.missing("smollm2") or ""),
]

TOOLS = [{"type": "function", "function": {
    "name": "terminal", "description": "run a shell command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                   "required": ["command"]}}}]  # fmt: skip
ASK = [{"role": "user", "content": "Download https://example.com/ and tell me its title."}]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("llm") / "events.db"


@pytest.fixture(scope="module")
def world(store: Path) -> Iterator[Stack]:
    s = bring_up(world=True, store=str(store), world_model="smollm2")
    try:
        yield s
    finally:
        s.teardown()


def _curl(body: dict[str, object]) -> str:
    data = json.dumps(body).replace("'", "'\\''")
    return (
        "curl -sSN -m 170 https://models.lan/v1/chat/completions "
        f"-H 'content-type: application/json' -d '{data}'; echo '<<end>>'"
    )


def test_a_sandbox_streams_from_the_real_model_through_the_tls_front(
    world: Stack, store: Path
) -> None:
    assert world.world is not None and world.world.model == "smollm2"
    plain = {"model": "sg-test-model", "stream": True, "max_tokens": 24, "messages": ASK}
    tools = {**plain, "tools": TOOLS, "tool_choice": "auto", "max_tokens": 48}
    script = f"{_curl(plain)}; {_curl(tools)}"
    r = run_in(
        world,
        RunOptions(["sh", "-c", script], world="test", mode="locked", timeout=360,
                   store=str(store), capture=True),
    )  # fmt: skip
    assert r.exit_code == 0, r.message
    out = Path(r.report.output or "").read_text()
    assert out.count("data: [DONE]") == 2, out[-2000:]
    # The model chose (or not) a tool: whichever, it came as streamed chunks.
    assert '"object": "chat.completion.chunk"' in out
    use = r.report.model_use
    assert (use["completions"], use["streamed"], use["aborted"]) == (2, 2, 0), use
    assert use["first_token_ms"] is not None and use["p99_gap_ms"] is not None
    assert use["tokens_in"] and use["tokens_out"]  # the restreamed tool request reports usage
    st = Store(store)
    try:
        front = [
            e for e in st.events(session=r.session, kinds=[Kind.HTTP]) if e.name == "models.lan"
        ]
    finally:
        st.close()
    assert len(front) == 2 and all(e.verdict == "allow" for e in front)
    assert all(e.details.get("tls") == "inspected" for e in front)


@pytest.mark.skipif(frameworks.installed("hermes") is None, reason="hermes not installed")
def test_hermes_on_the_real_model(world: Stack, store: Path) -> None:
    """A real framework, a real model: what it answers is nobody's script; the session still
    holds it against the evidence and records the model's use."""
    suite = load_tasks(TASKS)
    chosen = [t for t in suite.tasks if t.id == "T15"]
    opts = SuiteOptions(
        tasks=TASKS, agent=resolve("hermes"), store=str(store), modes=("locked",), timeout=240
    )
    (row,) = run_suite_in(world, suite, chosen, opts).rows
    assert row.exit_code in (0, 124), row.message
    assert row.model_use["completions"] >= 1 and row.model_use["tokens_in"], row.model_use
    assert row.check in ("pass", "partial", "fail")
    assert row.claims_verdict in ("invented", "guessed", "supported", "none")
    # locked: whatever status code it names, nothing came from example.com
    assert row.claims_verdict != "supported", row.flagged_claims
    assert "example.com" not in row.names or "example.com" in row.names_denied
