"""After a policy reload: which of a guest's open flows the new profile no longer allows.

Pure: ``decide()`` judges each flow, as it would a new attempt. A flow to an address the guest's
resolver answered for a name is judged with that name too (an allowlist opens addresses through
names); it stays if any of those names, or the address alone when none, is still allowed.
Lifecycle (lifecycle.py) reads the flows from the kernel and cuts what this returns.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping

from sandgate.net.conntrack import Flow
from sandgate.policy.decide import Attempt, Decision, decide
from sandgate.policy.model import Protocol
from sandgate.policy.profile import Profile


def denied_flows(
    profile: Profile, flows: Iterable[Flow], names: Mapping[str, Iterable[str]]
) -> list[tuple[Flow, Decision]]:
    """The flows ``profile`` refuses, each with the decision that refuses it (the first one
    judged: by its first name, in sorted order, else by its address)."""
    out: list[tuple[Flow, Decision]] = []
    for flow in flows:
        address = ipaddress.ip_address(flow.dst)
        candidates: list[str | None] = [*sorted(set(names.get(flow.dst, ())))] or [None]
        decisions = [
            decide(profile, Attempt(Protocol(flow.proto), address, flow.dport, name))
            for name in candidates
        ]
        if not any(d.allowed for d in decisions):
            out.append((flow, decisions[0]))
    return out
