"""What another engine cannot say of a policy, reported with the rule and the line it came from.

Every export returns its document *and* these. ``effect`` says which way the export errs:
``narrowed`` (it refuses something sandgate allows: safe, but an agent may miss a host),
``widened`` (it allows something sandgate refuses: the export says so, never silently), or
``dropped`` (a gateway feature with no counterpart: inspection, credentials, fronts, limits).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sandgate.errors import PolicyError, PolicyProblem
from sandgate.policy.load import Policy
from sandgate.policy.locate import find

Effect = Literal["narrowed", "widened", "dropped"]


@dataclass(frozen=True)
class Unexpressed:
    feature: str  # stable key: "domain-deny", "wildcard-depth", "inspect", ...
    effect: Effect
    message: str
    rule: str | None = None  # the rule's reference, "coder.deny[0]"
    file: str = ""
    line: int | None = None

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        ref = f" {self.rule}" if self.rule else ""
        return f"{where}:{ref} [{self.feature}, {self.effect}] {self.message}"


def at_rule(policy: Policy, ref: str, feature: str, effect: Effect, message: str) -> Unexpressed:
    """A warning located at the rule ``ref`` (policy/load.py's own lookup)."""
    stub = policy._where(ref)
    return Unexpressed(feature, effect, message, ref, stub.file, stub.line)


def at_key(
    policy: Policy, profile: str, key: str, feature: str, effect: Effect, message: str
) -> Unexpressed:
    pos = find(policy.positions, ("profiles", profile, key))
    return Unexpressed(feature, effect, message, None, policy.source, pos[0] if pos else None)


def strict_error(warnings: list[Unexpressed]) -> PolicyError:
    """``--strict``: every warning is a problem of the policy file, at its line."""
    return PolicyError(
        [
            PolicyProblem(
                w.file,
                w.line,
                None,
                f"{w.rule + ': ' if w.rule else ''}{w.message} ({w.feature}, {w.effect})",
                "rewrite the rule so the target engine can say it, or export without --strict",
            )
            for w in warnings
        ]
    )


__all__ = ["Effect", "Unexpressed", "at_key", "at_rule", "strict_error"]
