"""Live approvals (issue 14, part 4): a session run with ``ask`` waits for answers.

The sandbox asks for three names the allowlist refuses: pypi.org through the explicit proxy
(approved: the request passes), github.com by DNS (denied), example.com by DNS (approved
"always": its rule lands in an overlay of the policy, which ``policy check`` takes). Each
answer is an event; an answer for a name that no longer waits is a clear error.
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandgate.errors import GatewayError
from sandgate.events.schema import Kind
from sandgate.policy.load import load_policy
from sandgate.session.runner import RunResult

from .conftest import Runner

pytestmark = pytest.mark.kernel

SCRIPT = (
    "curl -sS -m 30 -o /dev/null -w 'pypi %{http_code}\\n' https://pypi.org/simple/; "
    "getent hosts github.com >/dev/null && echo 'github resolved' || echo 'github refused'; "
    "getent hosts example.com >/dev/null && echo 'example resolved' || echo 'example refused'"
)


@pytest.fixture
def work() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="sg-ask-") as d:
        path = Path(d)
        (path / "ask.toml").write_text('[profiles.dev]\ninternet = "ask"\n')
        yield path


def _answer_when_asked(sandbox: Runner, name: str, verdict: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with sandbox.stack.gateway.client() as c:
            if any(p["name"] == name for p in c.call("approvals")["pending"]):
                return c.call("approve", name=name, verdict=verdict)
        time.sleep(0.1)
    raise AssertionError(f"{name} never waited")


def test_names_wait_for_an_answer(sandbox: Runner, work: Path) -> None:
    done: list[RunResult] = []
    run = threading.Thread(
        target=lambda: done.append(
            sandbox.sh(f"({SCRIPT}) 2>&1", policy=str(work / "ask.toml"), timeout=120)
        )
    )
    run.start()
    try:
        allowed = _answer_when_asked(sandbox, "pypi.org", "allow")
        denied = _answer_when_asked(sandbox, "github.com", "deny")
        always = _answer_when_asked(sandbox, "example.com", "always")
    finally:
        run.join(150)
    assert allowed["verdict"] == "allow" and denied["verdict"] == "deny"
    r = done[0]
    out = Path(r.report.output or "").read_text()
    assert "pypi 200" in out and "github refused" in out and "example resolved" in out, out
    overlay = Path(always["overlay"])
    assert '{ domain = "example.com", port = [80, 443] }' in overlay.read_text()
    assert any(r.spec.domain == "example.com" for r in load_policy(overlay).profile().allow)
    notes = [e for e in sandbox.events(r, Kind.NOTICE) if e.details.get("approval")]
    seen = {(e.name, e.details["approval"], e.reason) for e in notes}
    assert ("pypi.org", "allow", "allow.approved") in seen, seen
    assert ("github.com", "deny", "deny.not_approved") in seen, seen
    assert ("example.com", "always", "allow.approved") in seen, seen
    assert {n for n, what, _ in seen if what == "asked"} >= {"pypi.org", "github.com"}
    with (
        pytest.raises(GatewayError, match=r"no attempt waits for 'pypi\.org'"),
        sandbox.stack.gateway.client() as c,
    ):
        c.call("approve", name="pypi.org", verdict="allow")
