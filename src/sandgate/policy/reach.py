"""``decide_reach()``: could a connection to a host, named in an agent's answer, have gone
through? The claim check asks it for a host the session never contacted, so a finding can say
"no transfer from example.com although the session could reach it" (report 000's open T13).

Judged as the proxy judges a connection by name: every address the session's DNS answers gave
for the name, with the name (the first allowed wins). With no address known (the agent never
looked the name up), the name alone, except that in locked mode a domain rule lets a name
resolve but opens no path (decide() rule 8): only host and cidr rules do, and they need an
address.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from sandgate.policy.decide import Attempt, Decision, Reason, decide, deny
from sandgate.policy.model import Mode, Protocol
from sandgate.policy.profile import Profile

__all__ = ["decide_reach"]


def decide_reach(
    profile: Profile, name: str, addresses: Iterable[str] = (), port: int = 443
) -> Decision:
    name = name.strip().rstrip(".").lower()
    decisions = []
    for text in addresses:
        try:
            address = ipaddress.ip_address(text)
        except ValueError:
            continue
        d = decide(profile, Attempt(Protocol.TCP, address, port, name))
        if d.allowed:
            return d
        decisions.append(d)
    if decisions:
        return decisions[0]
    d = decide(profile, Attempt(Protocol.TCP, None, port, name))
    if d.allowed and d.reason is Reason.RULE_ALLOW and profile.mode is Mode.LOCKED:
        return deny(
            Reason.LOCKED,
            f"{name} may resolve by {d.rule_ref}, but locked mode opens no path to a name",
        )
    return d
