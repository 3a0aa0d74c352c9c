"""Live approvals (issue 14, part 4): ``internet = "ask"`` / ``sandgate run --ask``.

A name the allowlist would refuse does not get its refusal at once: its question (at the
resolver) or its request (at the proxy's explicit door) waits, at most ``timeout`` seconds,
for ``sandgate approve NAME`` from another terminal. The answer is an event (``notice``,
``details.approval``): ``allow`` (this session), ``always`` (this session, and the rule is
appended to an overlay of the guest's policy the user can review and commit), ``deny``, or
``timeout`` (a deny). An approval adds ``{ domain = NAME, port = [80, 443] }`` to the guest's
profile through the same swap a reload makes (``grant``), then the waiters are judged again.

Runs on the gateway's event loop; the proxy's threads wait through ``wait_blocking``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandgate.errors import SandgateError
from sandgate.events.schema import Event, Kind
from sandgate.policy.decide import Reason, allow, deny

__all__ = ["APPROVED_PORTS", "Approvals", "Pending", "append_overlay", "rule_text"]

APPROVED_PORTS = (80, 443)
DEFAULT_TIMEOUT = 60.0

Grant = Callable[[str, str, str], None]  # guest link, rule text (--allow form), name
Emit = Callable[[Event], None]


def rule_text(name: str) -> str:
    """The rule an approval adds, as ``--allow`` would write it."""
    return f"{name}:{','.join(map(str, APPROVED_PORTS))}"


@dataclass
class Pending:
    guest: str  # link name
    session: str | None
    name: str
    since: float = field(default_factory=time.time)
    waiters: list[Callable[[], None]] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "guest": self.guest,
            "session": self.session,
            "name": self.name,
            "waiting_s": round(time.time() - self.since, 1),
        }


class Approvals:
    """Pending names per guest, the answers given this session, and the overlay file."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        grant: Grant,
        emit: Emit,
        overlay_for: Callable[[str], tuple[Path, str, str] | None],
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self.loop, self.grant, self.emit, self.timeout = loop, grant, emit, timeout
        # guest link -> (overlay path, the policy it extends, profile name), for "always"
        self.overlay_for = overlay_for
        self.pending: dict[tuple[str, str], Pending] = {}
        self.denied: set[tuple[str, str]] = set()

    # -- the enforcers ask ------------------------------------------------------------------------

    def ask(self, guest: str, session: str | None, name: str, done: Callable[[], None]) -> bool:
        """Wait for an answer on ``name``: True if ``done`` will be called once it comes (then
        judge again); False if it was already refused this session (refuse now)."""
        key = (guest, name)
        if key in self.denied:
            return False
        p = self.pending.get(key)
        if p is None:
            p = self.pending[key] = Pending(guest, session, name)
            p.timer = self.loop.call_later(self.timeout, self._expire, key)
            self._event(p, "asked", "waiting for `sandgate approve " + name + "`")
        p.waiters.append(done)
        return True

    def wait_blocking(self, guest: str, session: str | None, name: str) -> None:
        """From a proxy thread: wait until ``name`` is answered (or times out)."""
        answered = threading.Event()

        def register() -> None:
            if not self.ask(guest, session, name, answered.set):
                answered.set()

        self.loop.call_soon_threadsafe(register)
        answered.wait(self.timeout + 5)

    # -- the user answers -------------------------------------------------------------------------

    def list(self) -> list[dict[str, Any]]:
        return [p.as_json() for p in sorted(self.pending.values(), key=lambda p: p.since)]

    def answer(self, name: str, verdict: str, guest: str | None = None) -> dict[str, Any]:
        """``verdict``: allow | always | deny. Raises when nothing waits for ``name``."""
        keys = [k for k in self.pending if k[1] == name and guest in (None, k[0])]
        if not keys:
            waiting = ", ".join(sorted({k[1] for k in self.pending})) or "nothing"
            raise SandgateError(
                f"no attempt waits for {name!r} (it may have timed out and been refused)",
                f"`sandgate approve --list` shows what waits now ({waiting}); "
                "run the command again to ask anew",
            )
        written = None
        for key in keys:
            p = self.pending.pop(key)
            if p.timer is not None:
                p.timer.cancel()
            try:
                if verdict == "deny":
                    self.denied.add(key)
                else:
                    self.grant(p.guest, rule_text(name), name)
                    if verdict == "always":
                        written = self._always(p.guest, name) or written
                self._event(p, verdict, f"answered by sandgate approve{' --' + verdict}")
            finally:
                for done in p.waiters:  # judged again whatever happened: never left waiting
                    done()
        return {"name": name, "verdict": verdict, "guests": len(keys), "overlay": written}

    def _always(self, guest: str, name: str) -> str | None:
        where = self.overlay_for(guest)
        if where is None:
            return None
        path, extends, profile = where
        append_overlay(path, extends, profile, name)
        return str(path)

    def _expire(self, key: tuple[str, str]) -> None:
        p = self.pending.pop(key, None)
        if p is None:
            return
        self.denied.add(key)
        self._event(p, "timeout", f"no answer in {self.timeout:g} s: refused")
        for done in p.waiters:
            done()

    def forget_guest(self, guest: str) -> None:
        for key in [k for k in self.pending if k[0] == guest]:
            self._expire(key)
        self.denied = {k for k in self.denied if k[0] != guest}

    def _event(self, p: Pending, what: str, note: str) -> None:
        reason = {
            "asked": Reason.ASKED,
            "allow": Reason.APPROVED,
            "always": Reason.APPROVED,
            "deny": Reason.NOT_APPROVED,
            "timeout": Reason.APPROVAL_TIMEOUT,
        }[what]
        d = allow(reason, detail=note) if what in ("allow", "always") else deny(reason, note)
        self.emit(
            Event.attempt(
                Kind.NOTICE,
                d,
                session=p.session,
                guest=p.guest,
                name=p.name,
                details={"approval": what},
            )
        )


def append_overlay(path: Path, extends: str, profile: str, name: str) -> None:
    """Add ``name``'s rule to the overlay at ``path`` (made if missing), keeping what is there:
    a reviewable file (``extends`` the guest's policy) that ``policy check`` and ``run
    --policy`` take as it is."""
    rules: list[str] = []
    if path.exists():
        raw = tomllib.loads(path.read_text())
        for spec in raw.get("profiles", {}).get(profile, {}).get("allow", []):
            rules.append(spec.get("domain", ""))
    if name in rules:
        return
    rules.append(name)
    ports = json.dumps(list(APPROVED_PORTS))
    lines = [
        "# Approved with `sandgate approve --always` (issue 14). Review, then merge into the",
        "# policy, or run with this file: sandgate run --policy THIS_FILE ...",
        f"extends = {json.dumps(extends)}",
        "",
        f"[profiles.{json.dumps(profile)}]",
        "allow = [",
        *(f"  {{ domain = {json.dumps(r)}, port = {ports} }}," for r in rules if r),
        "]",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)
