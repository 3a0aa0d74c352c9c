"""Approvals (issue 14, part 4) without a gateway: the pending table on a real event loop,
its answers, its timeout, and the overlay "always" writes; ``internet = "ask"`` in a policy."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from sandgate.errors import SandgateError
from sandgate.events.schema import Event
from sandgate.gateway.approvals import Approvals, append_overlay
from sandgate.policy.load import load_policy, parse_policy
from sandgate.policy.model import Mode


def make(loop: asyncio.AbstractEventLoop, tmp: Path, timeout: float = 30) -> tuple[Any, ...]:
    granted: list[tuple[str, str, str]] = []
    events: list[Event] = []
    base = tmp / "p.toml"
    base.write_text('[profiles.dev]\ninternet = "ask"\n')
    approvals = Approvals(
        loop,
        lambda g, rule, name: granted.append((g, rule, name)),
        events.append,
        lambda g: (tmp / "approved" / "p.toml", str(base), "dev"),
        timeout=timeout,
    )
    return approvals, granted, events


def test_ask_answer_and_events(tmp_path: Path) -> None:
    async def go() -> None:
        approvals, granted, events = make(asyncio.get_running_loop(), tmp_path)
        called: list[str] = []
        assert approvals.ask("g3", "s1", "pypi.org", lambda: called.append("a"))
        assert approvals.ask("g3", "s1", "pypi.org", lambda: called.append("b"))  # a retry
        assert [p["name"] for p in approvals.list()] == ["pypi.org"]
        answer = approvals.answer("pypi.org", "allow")
        assert answer["guests"] == 1 and called == ["a", "b"]
        assert granted == [("g3", "pypi.org:80,443", "pypi.org")]
        assert [(e.details["approval"], e.reason) for e in events] == [
            ("asked", "deny.asked"),
            ("allow", "allow.approved"),
        ]
        with pytest.raises(SandgateError) as caught:
            approvals.answer("pypi.org", "allow")
        assert "no attempt waits" in caught.value.message and "--list" in (caught.value.fix or "")

    asyncio.run(go())


def test_deny_and_timeout_refuse_for_the_session(tmp_path: Path) -> None:
    async def go() -> None:
        approvals, granted, events = make(asyncio.get_running_loop(), tmp_path, timeout=0.05)
        woke: list[str] = []
        approvals.ask("g3", "s1", "a.example", lambda: woke.append("a"))
        approvals.answer("a.example", "deny")
        assert not approvals.ask("g3", "s1", "a.example", lambda: None)  # refused at once now
        approvals.ask("g3", "s1", "b.example", lambda: woke.append("b"))
        await asyncio.sleep(0.2)
        assert woke == ["a", "b"] and not approvals.list() and not granted
        assert not approvals.ask("g3", "s1", "b.example", lambda: None)
        assert events[-1].reason == "deny.approval_timeout" and events[-1].verdict == "deny"
        approvals.forget_guest("g3")
        assert approvals.ask("g3", "s2", "b.example", lambda: None)  # a new guest asks anew

    asyncio.run(go())


def test_always_writes_a_reviewable_overlay(tmp_path: Path) -> None:
    async def go() -> None:
        approvals, granted, _ = make(asyncio.get_running_loop(), tmp_path)
        approvals.ask("g3", "s1", "pypi.org", lambda: None)
        answer = approvals.answer("pypi.org", "always")
        assert granted and answer["overlay"] == str(tmp_path / "approved" / "p.toml")

    asyncio.run(go())
    overlay = tmp_path / "approved" / "p.toml"
    append_overlay(overlay, str(tmp_path / "p.toml"), "dev", "files.pythonhosted.org")
    append_overlay(overlay, str(tmp_path / "p.toml"), "dev", "pypi.org")  # already there
    text = overlay.read_text()
    assert text.count("pypi.org") == 1 and "files.pythonhosted.org" in text
    profile = load_policy(overlay).profile("dev")
    assert [r.spec.domain for r in profile.allow] == ["pypi.org", "files.pythonhosted.org"]
    assert profile.mode is Mode.ALLOWLIST and profile.ask


def test_internet_ask_is_the_allowlist_that_asks() -> None:
    policy = parse_policy(b'[profiles.p]\ninternet = "ask"\n', "p.toml")
    assert policy.profile().mode is Mode.ALLOWLIST and policy.profile().ask
    assert not policy.profile(mode=Mode.OPEN).ask  # --mode open: nothing to ask about
    plain = parse_policy(b'[profiles.p]\ninternet = "allowlist"\n', "p.toml")
    assert not plain.profile().ask and plain.profile(ask=True).ask  # sandgate run --ask
