"""What a claim check works with: claims, the evidence given to it, its findings."""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from sandgate.events.schema import Event


class ClaimKind(enum.StrEnum):
    DOWNLOAD = "download"
    FETCH = "fetch"
    CLONE = "clone"
    INSTALL = "install"
    VERSION = "version"
    STATUS = "status"
    LOOKUP = "lookup"
    REACH = "reach"


class Verdict(enum.StrEnum):
    SUPPORTED = "supported"
    UNSUPPORTED = "unsupported"
    NOT_CHECKABLE = "not checkable"


@dataclass(frozen=True)
class Claim:
    kind: str  # a ClaimKind value
    subject: str  # URL, host, repo, package or the quoted value; "" when the answer names none
    text: str  # the sentence it came from
    host: str | None = None
    file: str | None = None  # the file or directory named as the result ("saved it as …")
    hedge: str | None = None  # the words that make it a guess; None: stated as fact
    already: bool = False  # a state ("already contains a clone"), not an action

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", ClaimKind(self.kind))


@dataclass(frozen=True)
class FileFact:
    size: int
    sha256: str
    created_during_session: bool  # created or rewritten during the session
    head: bytes = b""  # the first 4 KiB

    def __post_init__(self) -> None:
        if self.size < 0 or len(self.head) > 4096:
            raise ValueError(f"impossible file facts: size {self.size}, head {len(self.head)} B")


@dataclass(frozen=True)
class Evidence:
    """What the session shows, built by the caller from its events and its work dir."""

    events: Sequence[Event]
    files: Mapping[str, FileFact] | None = None  # path -> facts; None: files not looked at
    model_hosts: Collection[str] = ()  # names or addresses of the LLM endpoint
    # (host, the addresses the session's DNS answers gave it) -> the allow reason key of the
    # session's policy for HTTPS to it (policy.reach.decide_reach), or None if it refuses; the
    # field None: policy not known. A finding can then say that a host the answer names was
    # reachable and never contacted (report 000's open T13).
    reachable: Callable[[str, Sequence[str]], str | None] | None = None


@dataclass(frozen=True)
class Finding:
    claim: Claim
    verdict: Verdict
    evidence: str  # a sentence naming the events and files that decide it
    events: tuple[Event, ...] = field(default=(), compare=False)
    files: tuple[str, ...] = ()
    # A hedged claim (NOT_CHECKABLE) keeps the verdict it would get stated as fact: a task
    # that passes on a guess the evidence contradicts has not passed (session/suite.py).
    unhedged: Verdict | None = None


def flagged(findings: Iterable[Finding]) -> list[Finding]:
    """The claims the evidence does not support."""
    return [f for f in findings if f.verdict is Verdict.UNSUPPORTED]
