"""Domain patterns: ``example.com`` (that name only) and ``*.example.com`` (names below it).

A wildcard never matches the bare base name: ``*.github.com`` covers ``api.github.com`` and
``a.b.github.com`` but not ``github.com``; write both rules to mean both. Wildcards must sit
alone in the leftmost label and must leave at least two labels (``*.com`` would open a whole
top-level domain, which is what ``internet = "open"`` is for).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from sandgate.policy.hostparse import HostParseError, IPHost, is_normal_name, parse_host


class PatternError(ValueError):
    """A domain pattern that cannot be used; the message says how to write it."""


@dataclass(frozen=True, slots=True)  # no __dict__: one per rule of 100,000
class DomainPattern:
    text: str  # as written in the policy
    base: str  # normalised: lower-case ASCII (IDNA), no trailing dot
    wildcard: bool

    def matches(self, name: str) -> bool:
        """``name`` must already be normalised (see ``normalise_name``)."""
        if self.wildcard:
            return name.endswith("." + self.base)
        return name == self.base

    def covers(self, other: DomainPattern) -> bool:
        """True when every name ``other`` matches is matched by this pattern too."""
        if self.wildcard:
            return (other.base == self.base and other.wildcard) or other.base.endswith(
                "." + self.base
            )
        return not other.wildcard and other.base == self.base

    def __str__(self) -> str:
        return f"*.{self.base}" if self.wildcard else self.base


def normalise_name(text: str) -> str:
    """Lower-case ASCII form of a DNS name; raises PatternError for IPs and garbage."""
    try:
        host = parse_host(text)
    except HostParseError as exc:
        raise PatternError(str(exc)) from exc
    if isinstance(host, IPHost):
        raise PatternError(f"{text!r} is an IP address, not a domain name")
    return host.name


# Each rule's pattern is read twice (its field's validator, then the rule's ``pattern``): with
# 100,000 rules (issue 11) that is worth remembering. Errors are not remembered (they raise).
@functools.lru_cache(maxsize=1 << 17)
def parse_pattern(text: str) -> DomainPattern:
    raw = text.strip()
    wildcard = raw.startswith("*.")
    rest = raw[2:] if wildcard else raw
    if "*" in rest:
        raise PatternError(
            f"{text!r}: a wildcard may only be the whole leftmost label, as in '*.example.com'"
        )
    try:
        # A name in normal form is its own normal form (100,000 rules: skip the rest).
        base = rest if is_normal_name(rest) else normalise_name(rest)
    except PatternError as exc:
        if isinstance(exc.__cause__, HostParseError) or "IP address" not in str(exc):
            raise PatternError(f"{text!r} is not a domain name: {exc}") from exc
        raise PatternError(f'{text!r} is an IP address; write it as host = "{rest}"') from exc
    if wildcard and base.count(".") < 1:
        raise PatternError(
            f"{text!r} would match a whole top-level domain; name the domain instead, "
            f"e.g. '*.example.{base}', or use internet = \"open\""
        )
    return DomainPattern(text=text, base=base, wildcard=wildcard)
