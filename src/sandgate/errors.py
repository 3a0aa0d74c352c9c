"""Failures sandgate reports, as a small tree.

    SandgateError                 anything sandgate refuses or cannot do; carries a remedy
    ├── PolicyError               a policy file is wrong: file, line, what, and the fix
    ├── SetupError                the machine lacks something (root, a package, a kernel feature)
    ├── NetError                  kernel plumbing failed (netlink, namespaces, links)
    │   └── RulesetRejected       nftables refused a ruleset; the previous one stays in force
    ├── GatewayError              the gateway daemon is missing, dead or refused a request
    ├── SandboxError              a sandbox could not be started
    └── PeerProtocolError         a peer spoke a protocol wrong; `status_hint` is our answer

Errors of dependencies (pyroute2, libnftables, sqlite3) are translated at the edge
with ``raise ... from exc`` so callers only ever catch these.
"""

from __future__ import annotations

from dataclasses import dataclass


class SandgateError(Exception):
    """Base class. ``fix`` says what the user can do about it."""

    def __init__(self, message: str, fix: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix

    def __str__(self) -> str:
        return self.message if not self.fix else f"{self.message} (fix: {self.fix})"


@dataclass(frozen=True)
class PolicyProblem:
    """One mistake in a policy file, located as precisely as the source allows."""

    file: str
    line: int | None
    column: int | None
    message: str
    fix: str | None = None

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        text = f"{where}: {self.message}"
        return text if not self.fix else f"{text}\n    fix: {self.fix}"


class PolicyError(SandgateError):
    """A policy that cannot be used. Holds every problem found, not only the first."""

    def __init__(self, problems: list[PolicyProblem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))

    def __str__(self) -> str:
        return self.message


class SetupError(SandgateError):
    """The machine cannot run sandgate as asked (not root, package or kernel feature missing)."""


class NetError(SandgateError):
    """Kernel network plumbing failed."""


class RulesetRejected(NetError):
    """nftables rejected a ruleset; nothing of it was applied and the old ruleset is in force."""


class GatewayError(SandgateError):
    """The gateway daemon is not there, died, or refused a request."""


class SandboxError(SandgateError):
    """A sandbox could not be started."""


class PeerProtocolError(SandgateError):
    """A client or server spoke its protocol wrong; ``status_hint`` is the HTTP status to answer."""

    def __init__(self, message: str, status_hint: int = 400) -> None:
        super().__init__(message)
        self.status_hint = status_hint
