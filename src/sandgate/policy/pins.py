"""Pins: what an answered name opens (or closes) at L3, as sets of addresses per domain rule.

The kernel sees addresses, not names. When the resolver answers a name, the addresses it
returns join one nftables set per domain rule that speaks to the name, and each set's rule in
the guest's forward chain carries that rule's own ports and protocol (net/compile.py). So at L3
an address ``A`` that the guest learnt as ``N`` is judged as ``decide()`` judges ``(A, port, N)``:

* a domain **deny** rule scoped to ports (``{ domain = "gist.github.com", port = 22 }``) lets
  the name resolve, and its set refuses ``A`` on exactly those ports, in every mode; a deny
  rule for the whole name never pins (the resolver refuses the name itself);
* in **allowlist** mode a domain **allow** rule's set admits ``A`` on that rule's ports only
  (a port-scoped rule no longer opens every port of the address).

One address learnt under two names is in both names' sets: deny sets come first, so the
stricter reading wins. ``pin_rules`` is the one place that says which sets an answer joins;
tests/unit/test_enforcers_agree.py checks the compiled sets against ``decide()``.
"""

from __future__ import annotations

from dataclasses import dataclass

from sandgate.policy.model import Mode
from sandgate.policy.profile import Action, Profile, Rule


@dataclass(frozen=True)
class PinRule:
    """A domain rule with a pin set: ``index`` into the profile's ``allow`` or ``deny``."""

    action: Action
    index: int
    rule: Rule

    @property
    def tag(self) -> str:
        """A short stable name for the rule's set: ``a3`` (allow[3]) or ``d0`` (deny[0])."""
        return f"{self.action[0]}{self.index}"


def pinned_rules(profile: Profile) -> tuple[PinRule, ...]:
    """Every rule of the profile that has a pin set (the compiler makes one set each)."""
    out = [
        PinRule("deny", i, r)
        for i, r in enumerate(profile.deny)
        if r.spec.pattern is not None and not r.whole
    ]
    if profile.mode is Mode.ALLOWLIST:
        out += [
            PinRule("allow", i, r)
            for i, r in enumerate(profile.allow)
            if r.spec.pattern is not None
        ]
    return tuple(out)


def pin_rules(profile: Profile, name: str) -> tuple[PinRule, ...]:
    """The pin sets an address of ``name`` joins when the resolver answers ``name``."""
    return tuple(
        p
        for p in pinned_rules(profile)
        if p.rule.spec.pattern and p.rule.spec.pattern.matches(name)
    )


__all__ = ["PinRule", "pin_rules", "pinned_rules"]
