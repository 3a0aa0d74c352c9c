"""Which rules could match: an index of a profile's rules, so ``decide()`` on 100,000 rules
answers in microseconds instead of scanning them all (issue 11 part 4).

The index only narrows: ``candidates`` returns, in profile order, every rule of the list whose
network holds the address or whose pattern matches the name (ports and protocols are not
looked at), and the caller then checks each candidate exactly as the linear scan did. So the
first candidate that matches is the first rule that matches; tests/unit/test_rule_index.py
checks that against the scan on random profiles.

* networks: per prefix length, the networks' numbers (an address's network for each length
  the list uses, at most 33 lookups for IPv4, 129 for IPv6);
* names: exact patterns by name, wildcards by base: ``a.b.example.com`` looks up
  ``b.example.com``, ``example.com`` and ``com`` (``*.x`` never matches ``x`` itself).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from sandgate.policy.model import IPAddress, RuleSpec


class _Written(Protocol):
    """A rule as the index sees it (profile.Rule; not imported: profile imports this)."""

    @property
    def spec(self) -> RuleSpec: ...


R = TypeVar("R", bound=_Written)


@dataclass(eq=False)
class RuleList(Generic[R]):
    """One list (``allow`` or ``deny``) indexed by network and by name."""

    rules: Sequence[R]
    # version -> prefix length -> network number -> indexes, in profile order
    nets: dict[int, dict[int, dict[int, list[int]]]] = field(default_factory=dict)
    exact: dict[str, list[int]] = field(default_factory=dict)
    wild: dict[str, list[int]] = field(default_factory=dict)
    linear: bool = False  # every rule is a candidate (the reference the tests compare with)
    # The last lookup and its answer: one DNS question asks the same name's candidates of a
    # list three or four times (its verdict, pins, inspection). One tuple, replaced whole, so a
    # thread reading it sees one lookup's.
    _last: tuple[IPAddress | None, str | None, tuple[R, ...]] | None = field(
        default=None, repr=False
    )

    @classmethod
    def of(cls, rules: Sequence[R], *, linear: bool = False) -> RuleList[R]:
        out = cls(rules, linear=linear)
        # get() before setdefault(): setdefault(k, []) makes a list per rule (100,000 rules).
        lengths: dict[tuple[int, int], dict[int, list[int]]] = {}
        for i, rule in enumerate(rules):
            spec = rule.spec
            net = spec.network
            if net is not None:
                key = (net.version, net.prefixlen)
                by_len = lengths.get(key)
                if by_len is None:
                    by_len = lengths[key] = out.nets.setdefault(key[0], {}).setdefault(key[1], {})
                number = int(net.network_address)
                hit = by_len.get(number)
                if hit is None:
                    by_len[number] = [i]
                else:
                    hit.append(i)
            pattern = spec.pattern
            if pattern is not None:
                names = out.wild if pattern.wildcard else out.exact
                found = names.get(pattern.base)
                if found is None:
                    names[pattern.base] = [i]
                else:
                    found.append(i)
        return out

    def candidates(self, address: IPAddress | None, name: str | None) -> tuple[R, ...]:
        """Every rule that could match ``address`` or ``name``, in profile order. Hot (a few
        calls a DNS question): what the list does not have is not looked for, and a lookup
        made again at once (the same address object, the same name) is answered from the last."""
        if self.linear:
            return tuple(self.rules)
        last = self._last
        if last is not None and last[0] is address and last[1] == name:
            return last[2]
        found: list[int] = []
        if address is not None and self.nets:
            by_length = self.nets.get(address.version)
            if by_length:
                value, bits = int(address), address.max_prefixlen
                for length, by_net in by_length.items():
                    hit = by_net.get(value >> (bits - length) << (bits - length))
                    if hit:
                        found += hit
        if name is not None:
            if self.exact:
                hit = self.exact.get(name)
                if hit:
                    found += hit
            wild = self.wild
            if wild:
                dot = name.find(".")
                while dot >= 0:  # the bases under the name: "b.example.com", "example.com", "com"
                    hit = wild.get(name[dot + 1 :])
                    if hit:
                        found += hit
                    dot = name.find(".", dot + 1)
        if not found:
            result: tuple[R, ...] = ()
        else:
            if len(found) > 1:
                found = sorted(set(found))
            rules = self.rules
            result = tuple([rules[i] for i in found])
        self._last = (address, name, result)
        return result


@dataclass(eq=False)
class RuleIndex(Generic[R]):
    """A profile's two lists, indexed; ``memo`` holds what other policy modules derive once per
    profile (policy/pins.py's groups)."""

    allow: RuleList[R]
    deny: RuleList[R]
    memo: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, allow: Sequence[R], deny: Sequence[R], *, linear: bool = False) -> RuleIndex[R]:
        return cls(RuleList.of(allow, linear=linear), RuleList.of(deny, linear=linear))


__all__ = ["RuleIndex", "RuleList"]
