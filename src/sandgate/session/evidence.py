"""The claim check's inputs, gathered from a finished session; its findings, made storable.

Files are read while the session's disk still exists (the runner calls ``file_facts`` before
tearing it down); the events are read once the gateway has flushed them. Paths are the ones the
agent saw (/work/..., /home/agent/..., /tmp/...), as an answer names them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from sandgate.events.schema import Event
from sandgate.sandbox.bwrap import SANDBOX_WORK
from sandgate.sandbox.tree import Entry
from sandgate.session.claims import Evidence, FileFact, Finding, check_claims

HEAD = 4096
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
) -> list[dict[str, Any]]:
    evidence = Evidence(events=events, files=files, model_hosts=tuple(model_hosts))
    return [as_json(f) for f in check_claims(answer, evidence)]


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
        "evidence": [f.evidence],
        "files": list(f.files),
    }
