"""Address rules that share one verdict site: what lets 100,000 CIDR rules compile to a few
interval sets instead of 100,000 chains (issue 11 part 4).

The kernel cannot say which element of an interval set matched, so a grouped site logs the
group; ``RuleGroup.rule_at`` recovers the rule from the packet's address, and
``decide.at_address`` puts it into the event. For that to name the rule ``decide()`` names:

* a group holds rules of one scope (the same ports and protocols): the set's rule matches the
  scope once, and an address then stands for exactly one rule of the group;
* only rules whose networks overlap no other rule's of the same list are grouped. A packet
  that matches a grouped rule matches no other rule, so where the group sits among the sites
  cannot change which rule is first (``decide()`` is first-match in profile order). Rules that
  overlap another (``10.0.0.0/8`` and ``10.1.0.0/16``, or one network on two ports) keep a site
  each, in profile order, as before.
"""

from __future__ import annotations

import bisect
import ipaddress
from collections.abc import Callable
from dataclasses import dataclass

from sandgate.policy.model import Protocol
from sandgate.policy.profile import Rule

Scope = tuple[tuple[tuple[int, int], ...], frozenset[Protocol]]


@dataclass(frozen=True, eq=False)  # identity: a group of 50,000 rules is never hashed whole
class RuleGroup:
    """Rules of one scope with disjoint IPv4 networks, sorted by address."""

    scope: Scope
    starts: tuple[int, ...]
    ends: tuple[int, ...]
    rules: tuple[Rule, ...]

    @classmethod
    def of(
        cls, scope: Scope, rules: list[Rule], spans: list[tuple[int, int]] | None = None
    ) -> RuleGroup:
        """``spans``: the rules' ``_span``s, where the caller has them already."""
        made = spans if spans is not None else [_span(r) for r in rules]
        order = sorted(range(len(rules)), key=made.__getitem__)
        return cls(
            scope,
            tuple(made[i][0] for i in order),
            tuple(made[i][1] for i in order),
            tuple(rules[i] for i in order),
        )

    def rule_at(self, address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> Rule | None:
        """The group's rule whose network holds ``address`` (at most one: they are disjoint)."""
        if isinstance(address, ipaddress.IPv6Address):
            if address.ipv4_mapped is None:
                return None
            address = address.ipv4_mapped
        value = int(address)
        i = bisect.bisect_right(self.starts, value) - 1
        if i >= 0 and value <= self.ends[i]:
            return self.rules[i]
        return None


def scope_of(rule: Rule) -> Scope:
    return tuple(rule.spec.ports), frozenset(rule.spec.protocols)


def group_address_rules(
    rules: list[Rule], alone: Callable[[Rule], bool] = lambda rule: False, min_size: int = 2
) -> tuple[list[Rule], list[RuleGroup]]:
    """Split IPv4 network rules (one list: ``deny`` or ``allow``, in profile order) into those
    that keep a site of their own (in profile order) and groups of at least ``min_size``.
    ``alone``: rules the caller must compile on their own (a special block to exempt)."""
    spans = [_span(r) for r in rules]  # once: 100,000 rules
    tangled = _overlapping(rules, spans)
    by_scope: dict[Scope, tuple[list[Rule], list[tuple[int, int]]]] = {}
    singles: list[Rule] = []
    for i, rule in enumerate(rules):
        if i in tangled or alone(rule):
            singles.append(rule)
        else:
            scope = scope_of(rule)
            both = by_scope.get(scope)
            if both is None:
                both = by_scope[scope] = ([], [])
            both[0].append(rule)
            both[1].append(spans[i])
    groups: list[RuleGroup] = []
    for scope, (members, member_spans) in by_scope.items():
        if len(members) < min_size:
            singles += members
        else:
            groups.append(RuleGroup.of(scope, members, member_spans))
    order = {id(r): i for i, r in enumerate(rules)}
    singles.sort(key=lambda r: order[id(r)])
    return singles, groups


def _span(rule: Rule) -> tuple[int, int]:
    net = rule.spec.network
    assert net is not None and net.version == 4, rule
    start = int(net.network_address)  # the end by arithmetic: broadcast_address is 10x slower
    return start, start | ((1 << (32 - net.prefixlen)) - 1)


def _overlapping(rules: list[Rule], spans: list[tuple[int, int]]) -> set[int]:
    """Indexes of rules that can match a packet another rule matches: networks that overlap
    and scopes (ports, protocols) that overlap. Networks are prefixes, so two overlap only by
    nesting: sorted by start (wider first), a stack of the open ones holds each rule's
    containers (at most 33 deep)."""
    ordered = sorted(((*s, i) for i, s in enumerate(spans)), key=lambda s: (s[0], -s[1]))
    stack: list[tuple[int, int, int]] = []
    out: set[int] = set()
    for start, end, i in ordered:
        while stack and stack[-1][1] < start:
            stack.pop()
        for _, _, j in stack:
            if _scopes_overlap(rules[i], rules[j]):
                out.add(i)
                out.add(j)
        stack.append((start, end, i))
    return out


def _scopes_overlap(a: Rule, b: Rule) -> bool:
    """Could one packet be in both rules' scopes? (Erring towards yes is safe: a site each.)"""
    if not a.spec.protocols & b.spec.protocols:
        return False
    if not a.spec.ports or not b.spec.ports:
        return True
    return any(lo <= high and low <= hi for lo, hi in a.spec.ports for low, high in b.spec.ports)


__all__ = ["RuleGroup", "group_address_rules", "scope_of"]
