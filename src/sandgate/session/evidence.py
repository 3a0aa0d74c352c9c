"""The claim check's inputs, gathered from a finished session; its findings, made storable.

Files are read while the session's disk still exists (the runner calls ``file_facts`` before
tearing it down); the events are read once the gateway has flushed them. Paths are the ones the
agent saw (/work/..., /home/agent/..., /tmp/...), as an answer names them.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from sandgate import TYPE_CHECKING
from sandgate.errors import SandgateError
from sandgate.events.schema import Event
from sandgate.sandbox.bwrap import SANDBOX_WORK
from sandgate.sandbox.tree import Entry

if TYPE_CHECKING:  # loaded where a fact or claim is made: a run without files or answer has none
    from typing import Any

    from sandgate.session.claims import FileFact, Finding

HEAD = 4096
# host, the addresses the session's DNS answers gave it -> allow reason key, or None
Reach = Callable[[str, Sequence[str]], str | None]
MAX_FILES = 5000


def file_facts(
    work_after: dict[str, Entry] | None,
    work_before: dict[str, Entry],
    workdir: Path,
    strays: Iterable[tuple[str, Path, Entry]],
) -> dict[str, FileFact]:
    """Every file in the work dir (``work_after``: None when it was not looked at) and every
    stray write, by its sandbox path."""
    facts: dict[str, FileFact] = {}
    for rel, entry in list((work_after or {}).items())[:MAX_FILES]:
        if entry.kind == "file":
            old = work_before.get(rel)
            facts[f"{SANDBOX_WORK}/{rel}"] = _fact(workdir / rel, entry, created=old != entry)
    for sandbox_path, host_path, entry in strays:
        if entry.kind == "file" and len(facts) < MAX_FILES:
            facts[sandbox_path] = _fact(host_path, entry, created=True)
    return facts


def _fact(path: Path, entry: Entry, created: bool) -> FileFact:
    from sandgate.session.claims import FileFact

    try:
        with open(path, "rb") as f:
            head = f.read(HEAD)
    except OSError:
        head = b""
    return FileFact(entry.size, entry.sha256 or "", created, head)


def findings(
    answer: str,
    events: Sequence[Event],
    files: dict[str, FileFact] | None,
    model_hosts: Iterable[str],
    reachable: Reach | None = None,
) -> list[dict[str, Any]]:
    if not answer.strip():
        return []  # no claim in an empty answer: the reader is not even loaded
    from sandgate.session.claims import Evidence, check_claims

    evidence = Evidence(
        events=events, files=files, model_hosts=tuple(model_hosts), reachable=reachable
    )
    return [as_json(f) for f in check_claims(answer, evidence)]


def reach_by_policy(
    policy: str | None,
    profile: str | None,
    mode: str | None,
    allow: Sequence[str] = (),
    deny: Sequence[str] = (),
    public_override: Sequence[str] = (),
) -> Reach | None:
    """``Evidence.reachable`` for a session: policy.reach.decide_reach() on HTTPS to a host
    (with the addresses the session's DNS gave for it) under the guest's effective profile:
    the same file, profile, mode, --allow/--deny and test-world "internet" the gateway was
    given. None when the profile cannot be built: the check then says nothing about reach."""
    # Here, not at the top: the runner imports this module for file_facts on every run, and
    # policy/ brings pydantic (~100 ms CPU) that a run with an empty answer never needs.
    from sandgate.policy.load import load_policy
    from sandgate.policy.model import Mode
    from sandgate.policy.reach import decide_reach

    try:
        prof = load_policy(policy).profile(
            profile,
            mode=Mode(mode) if mode else None,
            extra_allow=allow,
            extra_deny=deny,
            public_override=tuple(ipaddress.ip_network(n) for n in public_override),
        )
    except (SandgateError, ValueError, OSError):
        return None

    def reachable(host: str, addresses: Sequence[str]) -> str | None:
        d = decide_reach(prof, host, addresses)
        return d.key if d.allowed else None

    return reachable


def reach_when_asked(build: Callable[[], Reach | None]) -> Reach:
    """A ``Reach`` that calls ``build`` (``reach_by_policy`` with the session's arguments) at
    its first question: most answers ask none (a reach is asked only for a claimed transfer
    that did not happen), and building it (the policy file read and its profile made) was
    ~1.5 ms of the runner's teardown (issue 13, 2026-12-02). A profile that cannot be built
    answers None, as no ``reachable`` at all does."""
    built: list[Reach | None] = []

    def reachable(host: str, addresses: Sequence[str]) -> str | None:
        if not built:
            built.append(build())
        reach = built[0]
        return None if reach is None else reach(host, addresses)

    return reachable


def as_json(f: Finding) -> dict[str, Any]:
    c = f.claim
    return {
        "kind": str(c.kind),
        "subject": c.subject,
        "text": c.text,
        "host": c.host,
        "file": c.file,
        "hedge": c.hedge,
        "verdict": str(f.verdict),
        # a hedged claim's verdict had it been stated as fact (None: not hedged)
        "would_be": str(f.unhedged) if f.unhedged is not None else None,
        "evidence": [f.evidence],
        "files": list(f.files),
    }
