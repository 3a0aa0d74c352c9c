"""Verdicts on what a request or a connection carries, beyond its destination: the names in one
connection, placeholder credentials, inspection, and a name's resolved addresses taken together.

``decide()`` judges one attempt; these judge what the enforcers see around it, so that the proxy,
the TLS gate and ``explain`` ask ``policy/`` instead of keeping their own arithmetic:

- ``names_agree(outer, inner)``: the names one connection gives (CONNECT target or TLS name, then
  SNI or Host) must be one name, or it is domain fronting;
- ``placeholder_sent(secret, host, where)``: a placeholder credential bound for a host that is
  not its own (or over plain HTTP) is exfiltration;
- ``tls_mode(profile, name)``: an allowed TLS flow is inspected (terminated here, credentials
  swapped) or passed through raw;
- ``judge_answers(profile, name, port, answers)``: a name is allowed only if every address it
  resolved to is (rebinding), and the address to dial is one that was judged;
- ``raw_relay(profile, decision, name, address, port)``: a tunnel relayed raw may not carry
  requests that request rules would judge.

Pure: no sockets, no resolver (answers are handed in).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from sandgate.policy.decide import Attempt, Decision, Reason, decide, deny, request_rules
from sandgate.policy.model import IPAddress, Protocol
from sandgate.policy.profile import Profile

__all__ = [
    "Answers",
    "TlsMode",
    "judge_answers",
    "names_agree",
    "placeholder_sent",
    "raw_relay",
    "tls_mode",
]

TlsMode = Literal["inspect", "passthrough"]


def _norm(name: str) -> str:
    return name.lower().rstrip(".")


def names_agree(outer: str | None, inner: str | None, what: str = "") -> Decision | None:
    """None when the two names of one connection agree (or one is absent); else deny
    (fronting). ``what`` says which names they were, e.g. ``"CONNECT {outer} but SNI {inner}"``."""
    if outer is None or inner is None or _norm(outer) == _norm(inner):
        return None
    return deny(Reason.FRONTING, what or f"{outer} but {inner}")


def placeholder_sent(secret: str, host: str | None, where: str = "") -> Decision:
    """The verdict on a request carrying the placeholder of ``secret`` where it may not go
    (credentials.py finds it; this says what that is)."""
    place = f" in the {where}" if where else ""
    return deny(
        Reason.EXFILTRATION, f"placeholder of {secret!r}{place} to {host or 'another host'}"
    )


def tls_mode(profile: Profile, decision: Decision, name: str | None) -> TlsMode | None:
    """How an allowed TLS flow to ``name`` is carried; None when it is not allowed."""
    if not decision.allowed:
        return None
    return "inspect" if name is not None and profile.inspects(name) else "passthrough"


def gate_verdict(profile: Profile, decision: Decision, sni: str | None) -> Decision:
    """The kernel's TLS gate on a ClientHello it holds (the flow was not sent to the proxy):
    an inspected name may only be reached through the proxy, at addresses the gateway's
    resolver handed out (those go to the proxy before the gate), so here it is refused."""
    if tls_mode(profile, decision, sni) == "inspect":
        return deny(
            Reason.PROTOCOL,
            f"{sni} is inspected, but this address did not come from the gateway's resolver; "
            "connect by name",
        )
    if decision.allowed and sni is not None and profile.proxied(sni):
        return deny(
            Reason.PROTOCOL,
            f"{sni} is allowed for some programs only, which the proxy tells apart, but this "
            "address did not come from the gateway's resolver; connect by name",
        )
    return decision


def raw_relay(
    profile: Profile, decision: Decision, name: str | None, address: IPAddress | None, port: int
) -> Decision:
    """A connection the proxy would relay raw (a CONNECT tunnel, TLS passed through): refused
    where the destination's allow rules judge requests, which a raw relay would hide."""
    if not decision.allowed:
        return decision
    judging = request_rules(profile, Attempt(Protocol.TCP, address, port, name))
    if not judging:
        return decision
    rule = judging[0]
    return deny(
        Reason.REQUEST,
        f"{rule} judges each request to {name or address}:{port}, which a raw tunnel would "
        "hide; send plain HTTP (no CONNECT) or HTTPS by name",
        rule,
    )


@dataclass(frozen=True)
class Answers:
    """A name's addresses judged together. ``decision``: the first refusal, else the first
    allow; ``address``: where to dial (None unless allowed); ``each``: every address's own."""

    decision: Decision
    address: IPAddress | None
    each: tuple[tuple[IPAddress, Decision], ...] = ()


def judge_answers(
    profile: Profile,
    name: str,
    port: int | None,
    answers: Sequence[IPAddress],
    protocol: Protocol = Protocol.TCP,
    request: tuple[str, str] | None = None,
    process: tuple[str | None, tuple[str, ...]] | None = None,
) -> Answers:
    """Every answer judged with the name (and the request, if one is given: method, path;
    and the process: (exe, parents), exe None if unidentified); one refused refuses the name."""
    if not answers:
        return Answers(deny(Reason.UNRESOLVABLE, f"{name} does not resolve"), None)
    method, path = request or (None, None)
    by = process is not None
    exe, parents = process if process is not None else (None, ())
    each = tuple(
        (a, decide(profile, Attempt(protocol, a, port, name, method, path, by, exe, parents)))
        for a in answers
    )
    refused = next((d for _, d in each if not d.allowed), None)
    if refused is not None:
        return Answers(refused, None, each)
    return Answers(each[0][1], each[0][0], each)
