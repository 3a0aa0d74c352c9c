"""``sandgate explain``: what the policy says about a target, and why.

A target is a host, host:port, [v6]:port or URL. Names are resolved with the system resolver
(as the guest's would be, through the gateway); every address is judged, and the target is
allowed only if every address is (the proxy dials only addresses it checked).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sandgate.policy.classify import classify
from sandgate.policy.decide import Attempt, Decision, Reason, decide, deny, request_rules
from sandgate.policy.hostparse import HostParseError, IPHost, parse_target
from sandgate.policy.model import IPAddress, Protocol
from sandgate.policy.profile import Profile
from sandgate.policy.requests import judge_answers

Resolve = Callable[[str], list[IPAddress]]


@dataclass
class Explanation:
    target: str
    verdict: str
    rule: str | None
    reason: str
    detail: str
    host: str | None = None
    port: int | None = None
    protocol: str = "tcp"
    addresses: list[dict[str, Any]] = field(default_factory=list)
    # Request rules that judge each request to the target (``METHOD /path`` entries), and why
    # its HTTPS is inspected when a request rule forces it.
    requests: list[str] = field(default_factory=list)
    inspected: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "verdict": self.verdict,
            "rule": self.rule,
            "reason": self.reason,
            "detail": self.detail,
            "host": self.host,
            "port": self.port,
            "protocol": self.protocol,
            "addresses": self.addresses,
            "requests": self.requests,
            "inspected": self.inspected,
        }


def system_resolve(name: str) -> list[IPAddress]:
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return []
    seen: list[IPAddress] = []
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%")[0])
        if address not in seen:
            seen.append(address)
    return seen


def explain(
    profile: Profile,
    text: str,
    protocol: Protocol = Protocol.TCP,
    resolve: Resolve = system_resolve,
) -> Explanation:
    try:
        target = parse_target(text)
    except HostParseError as exc:
        d = deny(Reason.UNPARSEABLE, str(exc))
        return _out(text, d, protocol)
    port = target.port
    if isinstance(target.host, IPHost):
        address = target.host.address
        d = decide(profile, Attempt(protocol, address, port))
        out = _out(text, d, protocol, host=str(address), port=port)
        out.addresses = [_address(address, d)]
        if d.allowed:
            _requests(out, profile, Attempt(protocol, address, port))
        return out
    name = target.host.name
    if profile.front(name) is not None:
        # The gateway answers a fronted name with its own address and serves it itself.
        return _out(
            text, decide(profile, Attempt(protocol, None, port, name)), protocol, name, port
        )
    addresses = resolve(name)
    judged = judge_answers(profile, name, port, addresses, protocol)
    out = _out(text, judged.decision, protocol, host=name, port=port)
    out.addresses = [_address(a, d) for a, d in judged.each]
    if judged.decision.allowed:
        _requests(out, profile, Attempt(protocol, judged.address, port, name))
        forced = profile.forced_inspection(name) if port in (443, None) else None
        if forced is not None and not any(p.matches(name) for p in profile.inspect):
            out.inspected = f"HTTPS is inspected: forced by {forced}, whose requests are judged"
    return out


def _requests(out: Explanation, profile: Profile, attempt: Attempt) -> None:
    """The request rules that would judge each request (empty: requests are not judged)."""
    out.requests = [str(q) for r in request_rules(profile, attempt) for q in r.spec.requests]


def _out(
    text: str, d: Decision, protocol: Protocol, host: str | None = None, port: int | None = None
) -> Explanation:
    return Explanation(
        text, d.verdict.value, d.rule_ref, d.key, d.explain(), host, port, protocol.value
    )


def _address(address: IPAddress, d: Decision) -> dict[str, Any]:
    cls = classify(address)
    return {
        "address": str(address),
        "class": cls.cls.value,
        "embedded": str(cls.embedded) if cls.embedded else None,
        "verdict": d.verdict.value,
        "reason": d.key,
        "rule": d.rule_ref,
    }
