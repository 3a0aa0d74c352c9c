"""Pins: what an answered name opens (or closes) at L3, as sets of addresses per pin group.

The kernel sees addresses, not names. When the resolver answers a name, the addresses it
returns join the nftables set of each domain rule's *pin group* that speaks to the name, and
each group's rule in the guest's forward chain carries the group's ports and protocols
(net/compile.py). So at L3 an address ``A`` that the guest learnt as ``N`` is judged as
``decide()`` judges ``(A, port, N)``:

* a domain **deny** rule scoped to ports (``{ domain = "gist.github.com", port = 22 }``) lets
  the name resolve, and its group's set refuses ``A`` on exactly those ports, in every mode; a
  deny rule for the whole name never pins (the resolver refuses the name itself);
* in **allowlist** mode a domain **allow** rule's group admits ``A`` on that rule's ports only
  (a port-scoped rule no longer opens every port of the address).

A group is every pinning rule of one list (``allow`` or ``deny``) and one scope (ports,
protocols): 50,000 domain rules on two scopes are two sets and two verdict sites, not 50,000
(issue 11 part 4). Grouping cannot change a verdict: every site of a list has the same
verdict, deny sites come first, and a group's site matches exactly its rules' scope. What the
kernel cannot tell is the rule: the resolver remembers which rules' tags it pinned an address
under (``PinRule.tag``, ``a0.3``: allow[3] in allow group 0), and ``PinGroup.at`` names the
first of them in profile order whose scope holds the packet, as ``decide()`` does.

One address learnt under two names is in both names' sets: deny sets come first, so the
stricter reading wins. ``pin_rules`` is the one place that says which sets an answer joins;
tests/unit/test_enforcers_agree.py checks the compiled sets against ``decide()``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from sandgate.policy.decide import Decision, allow, deny
from sandgate.policy.groups import Scope, scope_of
from sandgate.policy.index import RuleList
from sandgate.policy.model import Mode, Protocol
from sandgate.policy.profile import Action, Profile, Rule


@dataclass(frozen=True, slots=True)  # no __dict__: one per rule of 100,000
class PinRule:
    """A domain rule with a pin: ``index`` into the profile's ``allow`` or ``deny``, ``group``
    the pin group (one set) its addresses join."""

    action: Action
    index: int
    rule: Rule
    group: int = 0

    @property
    def tag(self) -> str:
        """The rule and its set: ``a0.3`` (allow[3], set ``a0``); ``set_tag`` names the set."""
        return f"{self.set_tag}.{self.index}"

    @property
    def set_tag(self) -> str:
        return f"{self.action[0]}{self.group}"


@dataclass(frozen=True, eq=False)  # identity: a group of 50,000 rules is never hashed whole
class PinGroup:
    """The pinning rules of one list and one scope, in profile order: one set, one site.
    ``peers``: every pinning rule of the same list by tag (shared by its groups)."""

    action: Action
    tag: str  # the set's tag: ``a0``, ``d1``
    scope: Scope
    rules: tuple[PinRule, ...]
    peers: Mapping[str, PinRule] = field(default_factory=dict, repr=False)

    def at(
        self, decision: Decision, tags: Iterable[str], port: int | None, protocol: Protocol | None
    ) -> Decision:
        """The group's site ``decision`` for a packet to an address the resolver pinned under
        ``tags`` (rule tags, ``PinRule.tag``), naming the rule ``decide()`` names: the first in
        profile order, of this list, whose scope holds the packet (it may be another group's:
        groups are not in profile order)."""
        if decision.rule is not None:
            return decision
        first: PinRule | None = None
        for tag in tags:
            pin = self.peers.get(tag)
            if pin is None or (first is not None and pin.index >= first.index):
                continue
            if protocol is None or pin.rule.in_scope(port, protocol):
                first = pin
        if first is None:
            return decision
        rule = first.rule
        make = allow if decision.allowed else deny
        return make(decision.reason, rule=rule, detail=f"{rule.ref} ({rule.label})")


def set_of(tag: str) -> str:
    """The set a rule's tag pins into: ``a0`` for ``a0.3``."""
    return tag.partition(".")[0]


def _pinning(profile: Profile) -> list[tuple[Action, int, Rule]]:
    out: list[tuple[Action, int, Rule]] = [
        ("deny", i, r)
        for i, r in enumerate(profile.deny)
        if r.spec.pattern is not None and not r.whole
    ]
    if profile.mode is Mode.ALLOWLIST:
        out += [("allow", i, r) for i, r in enumerate(profile.allow) if r.spec.pattern is not None]
    return out


def pinned_rules(profile: Profile) -> tuple[PinRule, ...]:
    """Every rule of the profile that pins, deny rules first, in profile order; its group is
    numbered per list in order of the group's first rule. (Made once per profile.)"""
    return _pins(profile)[0]


def pin_groups(profile: Profile) -> tuple[PinGroup, ...]:
    """The profile's pin groups (one set and one verdict site each), deny groups first."""
    return _pins(profile)[1]


def pin_rules(profile: Profile, name: str) -> tuple[PinRule, ...]:
    """The rules whose pin sets an address of ``name`` joins when the resolver answers it."""
    peers = _pins(profile)[2]
    out: list[PinRule] = []
    lists: tuple[tuple[Action, RuleList[Rule]], ...] = (
        ("deny", profile.index.deny),
        ("allow", profile.index.allow),
    )
    for action, rules in lists:
        for rule in rules.candidates(None, name):
            pin = peers[action].get(id(rule))
            if pin is not None and rule.spec.pattern and rule.spec.pattern.matches(name):
                out.append(pin)
    return tuple(out)


_Pins = tuple[tuple[PinRule, ...], tuple[PinGroup, ...], dict[Action, dict[int, PinRule]]]


def _pins(profile: Profile) -> _Pins:
    memo = profile.index.memo
    if "pins" not in memo:
        memo["pins"] = _make_pins(profile)
    made: _Pins = memo["pins"]
    return made


def _make_pins(profile: Profile) -> _Pins:
    numbers: dict[tuple[Action, Scope], int] = {}
    count: dict[Action, int] = {}
    pins: list[PinRule] = []
    found: dict[str, list[PinRule]] = {}
    peers: dict[Action, dict[str, PinRule]] = {"allow": {}, "deny": {}}
    by_rule: dict[Action, dict[int, PinRule]] = {"allow": {}, "deny": {}}
    for action, i, rule in _pinning(profile):
        key = (action, scope_of(rule))
        n = numbers.get(key)
        if n is None:
            n = numbers[key] = count.get(action, 0)
            count[action] = n + 1
        pin = PinRule(action, i, rule, n)
        pins.append(pin)
        set_tag = f"{action[0]}{n}"  # pin.set_tag and pin.tag, written out: 100,000 rules
        members = found.get(set_tag)
        if members is None:
            members = found[set_tag] = []
        members.append(pin)
        peers[action][f"{set_tag}.{i}"] = pin
        by_rule[action][id(rule)] = pin
    groups = tuple(
        PinGroup(m[0].action, tag, scope_of(m[0].rule), tuple(m), peers[m[0].action])
        for tag, m in found.items()
    )
    return tuple(pins), groups, by_rule


__all__ = ["PinGroup", "PinRule", "pin_groups", "pin_rules", "pinned_rules", "set_of"]
