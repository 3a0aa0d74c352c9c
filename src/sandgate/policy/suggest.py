"""``sandgate policy suggest``: a session's refusals → the rules that would have let them through.

audit2allow for sandgate. The refused attempts of one session (DNS questions, connections,
proxy requests) become the fewest allow rules that let each through: one rule per name (where
a name was asked: DNS, SNI, Host, CONNECT) or per address (where none was), with the ports and
protocol the attempts used, grouped by the process that made them. The result is an overlay
(policy/overlay.py) on the session's own policy, so ``policy check`` and ``run --policy`` take
it as it is, and each rule carries a comment: which attempts it covers, what it also allows.

Risky suggestions are written commented out, never active: an address in a special-purpose
block (a private range, the LAN model server, link-local, the metadata endpoint), a public name
that resolved to one (rebinding), and a wildcard over a platform shared by strangers
(``*.githubusercontent.com``), offered only as a commented alternative. Refusals no allow
rule can lift (a deny rule, DNS to another resolver, QUIC, fronting, lateral traffic...) are
listed at the end with why. A request a request rule refused is not widened silently either:
the comment names the rule and the ``METHOD /path`` to add to it.

Before the text is returned, the suggestion is applied to the session's profile and every
refusal is judged again with ``decide()``: each one a rule covers must now be allowed, and
what the header says ("the other N stay refused") is what ``decide()`` says.

Pure: events in (any objects with the event fields), text out; no store, no files.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from ipaddress import ip_address
from typing import Any

from sandgate.policy.classify import AddressClass, classify
from sandgate.policy.decide import Attempt, decide, decide_name
from sandgate.policy.load import apply_overlay
from sandgate.policy.model import IPNetwork, Mode, Protocol, RuleSpec
from sandgate.policy.overlay import BUILTIN_NAME, OverlayFile, OverlayProfile

__all__ = ["Refusal", "Suggested", "Suggestion", "refusals", "suggest"]

# Platforms where a wildcard opens names anyone can register or upload under.
SHARED_PLATFORMS = (
    "githubusercontent.com",
    "github.io",
    "gitlab.io",
    "amazonaws.com",
    "cloudfront.net",
    "azurewebsites.net",
    "blob.core.windows.net",
    "windows.net",
    "appspot.com",
    "googleapis.com",
    "storage.googleapis.com",
    "herokuapp.com",
    "vercel.app",
    "netlify.app",
    "pages.dev",
    "workers.dev",
    "r2.dev",
    "fly.dev",
    "ngrok.io",
    "ngrok-free.app",
)
# Refusals an allow rule cannot lift, and why (the rest are the mode's or a special block's).
UNLIFTABLE = {
    "deny.rule": "a deny rule refused it (deny wins over every allow)",
    "deny.dns_redirect": "DNS to another resolver: the gateway's resolver answers every question",
    "deny.gateway": "the gateway's own ports",
    "deny.lateral": "another guest of the gateway",
    "deny.host": "the host the gateway runs on",
    "deny.quic": "QUIC is refused so HTTPS goes through the proxy",
    "deny.dns_bypass": "DNS over TLS would bypass the gateway's resolver",
    "deny.ipv6": "the gateway's uplink has no IPv6",
    "deny.fronting": "domain fronting",
    "deny.exfiltration": "a placeholder credential sent to another host",
    "deny.protocol": "the request broke its protocol",
    "deny.unresolvable": "the name did not resolve",
    "deny.special_name": "a special-use name",
}
_SPECIAL = {c.value for c in AddressClass} - {AddressClass.PUBLIC.value}
_PORTLESS_GUESS = 443


@dataclass(frozen=True)
class Refusal:
    """One refused attempt, as the session's events recorded it."""

    kind: str  # dns | conn | http
    reason: str
    name: str | None = None
    address: str | None = None
    port: int | None = None
    protocol: str = "tcp"
    method: str | None = None
    path: str | None = None  # redacted as logged ("?…" for a query)
    process: str | None = None  # the executable, where attribution found it
    rule: str | None = None
    count: int = 1

    def attempt(self) -> str:
        where = self.name or self.address or "?"
        if self.kind == "dns":
            return f"dns {where}"
        text = f"{self.protocol} {where}:{self.port}" if self.port else f"{self.protocol} {where}"
        if self.method:
            text += f" {self.method} {self.path or '/'}"
        return text


def refusals(events: Iterable[Any]) -> list[Refusal]:
    """The refused DNS, connection and HTTP attempts among a session's events."""
    out = []
    for e in events:
        kind = str(e.kind)
        if kind not in ("dns", "conn", "http") or e.verdict != "deny" or not e.reason:
            continue
        details = e.details or {}
        process = details.get("process")
        exe = process.get("exe") if isinstance(process, dict) else None
        name, address = e.name, e.dst if kind != "dns" else None
        if name is not None and _is_address(name):  # a literal in Host or CONNECT
            name, address = None, address or name
        method = details.get("method") if kind == "http" else None
        out.append(
            Refusal(
                kind=kind,
                reason=e.reason,
                name=name,
                address=address,
                port=e.port if kind != "dns" else None,
                protocol=(e.protocol or "tcp") if kind != "dns" else "udp",
                method=method if method != "CONNECT" else None,
                path=details.get("path") if kind == "http" else None,
                process=exe if isinstance(exe, str) else None,
                rule=e.rule,
                count=e.count or 1,
            )
        )
    return out


@dataclass
class Suggested:
    """One suggested rule and the refusals it covers."""

    target: str  # "domain" | "host"
    value: str
    protocol: str
    ports: set[int] = field(default_factory=set)
    covers: list[Refusal] = field(default_factory=list)
    risky: str | None = None  # why it is written commented out
    guessed_port: bool = False

    def spec(self) -> RuleSpec:
        return RuleSpec.model_validate(self._fields())

    def _fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {self.target: self.value}
        ports = sorted(self.ports)
        if ports:
            fields["port"] = ports[0] if len(ports) == 1 else ports
        if self.protocol != "tcp":
            fields["protocol"] = self.protocol
        return fields

    def toml(self) -> str:
        return "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in self._fields().items()) + " }"

    @property
    def processes(self) -> list[str]:
        return sorted({r.process or "an unidentified process" for r in self.covers})


@dataclass
class Suggestion:
    text: str
    rules: list[Suggested]
    notes: list[str]  # request-rule widenings, left to the user
    unliftable: list[Refusal]
    allowed_after: list[Refusal]  # refusals the active rules let through (decide() says)
    still_refused: list[Refusal]


def suggest(
    policy: Any,
    profile_name: str | None,
    mode: Mode | None,
    events: Sequence[Any],
    *,
    session: str = "",
    public_override: tuple[IPNetwork, ...] = (),
    extends: str | None = None,
) -> Suggestion:
    """The overlay text for ``policy`` (a loaded ``Policy``) that lets the session's refusals
    through, and what ``decide()`` says of every refusal once it is applied."""
    base_profile = policy.profile(profile_name, mode=mode, public_override=public_override)
    name = base_profile.name
    refused = refusals(events)
    rules: dict[tuple[str, str, str], Suggested] = {}
    notes: list[str] = []
    unliftable: list[Refusal] = []
    for r in refused:
        if r.reason == "deny.request":
            shown = (r.path or "/").split("?", 1)[0]
            notes.append(
                f"{r.rule} refused {r.method} {shown} ({r.attempt()}, by "
                f"{r.process or 'an unidentified process'}): to allow it, add "
                f'"{r.method} {shown}" to that rule\'s http list'
            )
            continue
        if r.reason in UNLIFTABLE or not r.reason.startswith("deny."):
            unliftable.append(r)
            continue
        key = _target(r, base_profile.mode, public_override)
        if key is None:
            unliftable.append(r)
            continue
        s = rules.setdefault(key, Suggested(*key))
        s.covers.append(r)
        if r.port is not None:
            s.ports.add(r.port)
        s.risky = s.risky or _risk(r, public_override)
    for s in rules.values():
        if not s.ports and s.protocol != "icmp":
            s.ports.add(_PORTLESS_GUESS)  # only DNS questions: the port was never tried
            s.guessed_port = True
    ordered = sorted(rules.values(), key=lambda s: (s.processes, s.target, s.value))
    active = [s for s in ordered if s.risky is None]
    overlay = OverlayFile(
        extends=extends or policy.source,
        profiles={name: OverlayProfile(allow=[s.spec() for s in active])},
    )
    after = apply_overlay(policy, overlay, {}, "<suggestion>").profile(
        name, mode=mode, public_override=public_override
    )
    allowed_after = [r for r in refused if _allowed(after, r)]
    still = [r for r in refused if r not in allowed_after]
    text = _render(
        name, overlay.extends, session, ordered, notes, unliftable, refused, allowed_after, still
    )
    return Suggestion(text, ordered, notes, unliftable, allowed_after, still)


def _is_address(text: str) -> bool:
    try:
        ip_address(text.strip("[]"))
    except ValueError:
        return False
    return True


def _target(
    r: Refusal, mode: Mode, override: tuple[IPNetwork, ...]
) -> tuple[str, str, str] | None:
    # A DNS question is let through by a rule for its name on any port: it joins the name's
    # TCP rule (and gets a guessed port if it is alone).
    proto = r.protocol if r.protocol in ("tcp", "udp", "icmp") and r.kind != "dns" else "tcp"
    special = _special(r.address, override)
    # By name where a name was asked, unless locked mode (names never open a path there) or the
    # address is special-purpose (only a rule naming the address lifts that).
    if r.name and not (mode is Mode.LOCKED and r.address) and special is None:
        return ("domain", r.name, proto)
    if r.address:
        return ("host", r.address, proto)
    return ("domain", r.name, proto) if r.name else None


def _special(address: str | None, override: tuple[IPNetwork, ...]) -> AddressClass | None:
    """The special-purpose class of an address (None: public, or the test world's internet)."""
    if address is None:
        return None
    try:
        ip = ip_address(address)
    except ValueError:
        return None
    if any(ip.version == n.version and ip in n for n in override):
        return None
    cls = classify(ip)
    return cls.cls if cls.special else None


def _risk(r: Refusal, override: tuple[IPNetwork, ...]) -> str | None:
    cls = _special(r.address, override)
    if cls is AddressClass.METADATA:
        return "the cloud metadata endpoint: it hands out the machine's credentials"
    if cls is not None:
        return f"{r.address} is {cls.label.lower()}: it opens a place outside the internet"
    if r.reason == "deny.rebinding" or r.reason.removeprefix("deny.") in _SPECIAL:
        return "a public name that resolved to a special-purpose address (rebinding)"
    return None


def _allowed(profile: Any, r: Refusal) -> bool:
    if r.kind == "dns":
        return r.name is not None and decide_name(profile, r.name).allowed
    proto = Protocol(r.protocol) if r.protocol in ("tcp", "udp", "icmp") else Protocol.TCP
    address = ip_address(r.address) if r.address else None
    method, path = (r.method, (r.path or "/").split("?", 1)[0]) if r.method else (None, None)
    d = decide(profile, Attempt(proto, address, r.port, r.name, method, path))
    if r.name is None or address is None:
        return d.allowed
    # The proxy judges the name first, then each address it resolved to.
    return d.allowed and decide(profile, Attempt(proto, None, r.port, r.name, method, path)).allowed


def _also(s: Suggested) -> str:
    ports = ", ".join(map(str, sorted(s.ports)))
    who = "every process in the sandbox"
    if s.target == "domain":
        return f"{s.protocol} to every address {s.value} resolves to, on port {ports}, for {who}"
    return f"anything over {s.protocol} to {s.value} port {ports}, for {who}"


def _wildcards(rules: list[Suggested]) -> list[str]:
    """A commented alternative where several names share a parent: one wildcard rule."""
    parents: dict[str, list[Suggested]] = {}
    for s in rules:
        if s.target == "domain" and s.value.count(".") >= 2:
            parents.setdefault(s.value.split(".", 1)[1], []).append(s)
    out = []
    for parent, group in sorted(parents.items()):
        if len(group) < 2:
            continue
        shared = any(parent == p or parent.endswith("." + p) for p in SHARED_PLATFORMS)
        ports = sorted(set().union(*(s.ports for s in group)))
        port = ports[0] if len(ports) == 1 else ports
        line = f'{{ domain = "*.{parent}", port = {json.dumps(port)} }}'
        names = ", ".join(s.value for s in group)
        if shared:
            out.append(
                f"  # RISKY, not suggested: {line} would cover {names}, but {parent} is a "
                "platform anyone can publish under"
            )
        else:
            out.append(f"  # or one rule for {names} (and every other name under {parent}):")
            out.append(f"  # {line},")
    return out


def _render(
    profile: str,
    extends: str,
    session: str,
    rules: list[Suggested],
    notes: list[str],
    unliftable: list[Refusal],
    refused: list[Refusal],
    allowed_after: list[Refusal],
    still: list[Refusal],
) -> str:
    risky = [s for s in rules if s.risky]
    covered = {id(r) for s in rules if not s.risky for r in s.covers}
    lifted_extra = [r for r in allowed_after if id(r) not in covered]
    lines = [
        f"# sandgate policy suggest{f' --session {session}' if session else ''}",
        f"# {len(refused)} refused attempt(s); {len(rules) - len(risky)} rule(s) suggested, "
        f"{len(risky)} risky one(s) commented out: read each comment before you uncomment.",
        f"# Judged again with these rules: {len(allowed_after)} of them pass, "
        f"{len(still)} stay refused.",
    ]
    if lifted_extra:
        lines.append(
            f"# Note: {len(lifted_extra)} refused attempt(s) these rules were not made for "
            "would pass too: " + ", ".join(r.attempt() for r in lifted_extra[:5])
        )
    lines += [
        "# Use it as it is (it extends the session's policy):",
        "#   sandgate policy check THIS_FILE && sandgate run --policy THIS_FILE -- ...",
        "# or copy the rules you keep into the policy itself.",
        f"extends = {json.dumps(extends if extends else BUILTIN_NAME)}",
        "",
        f"[profiles.{_key(profile)}]",
        "allow = [",
    ]
    group: list[str] | None = None
    for s in rules:
        if s.processes != group:
            group = s.processes
            lines.append(f"  # --- {', '.join(group)} ---")
        attempts = sorted({r.attempt() for r in s.covers})
        total = sum(r.count for r in s.covers)
        more = f" and {len(attempts) - 4} more" if len(attempts) > 4 else ""
        shown = ", ".join(attempts[:4]) + more
        lines.append(f"  # covers {total} attempt(s): {shown}")
        if s.guessed_port:
            lines.append(
                f"  # port {_PORTLESS_GUESS} is a guess: the name was refused when it was looked "
                "up, before any connection"
            )
        lines.append(f"  # also allows: {_also(s)}")
        if s.risky:
            lines.append(f"  # RISKY ({s.risky}); uncomment only if you mean it:")
            lines.append(f"  # {s.toml()},")
        else:
            lines.append(f"  {s.toml()},")
    lines += _wildcards([s for s in rules if not s.risky])
    lines.append("]")
    if notes:
        lines.append("")
        lines.append("# Refused by a request rule (widen the rule itself, after review):")
        lines += [f"#   {n}" for n in sorted(set(notes))]
    if unliftable:
        lines.append("")
        lines.append("# Not suggested: no allow rule lets these through.")
        by_reason: dict[str, list[Refusal]] = {}
        for r in unliftable:
            by_reason.setdefault(r.reason, []).append(r)
        for reason, group_ in sorted(by_reason.items()):
            why = UNLIFTABLE.get(reason, reason)
            some = ", ".join(sorted({r.attempt() for r in group_})[:3])
            lines.append(f"#   {len(group_)} x {reason} ({why}): {some}")
    return "\n".join(lines) + "\n"


def _key(name: str) -> str:
    bare = name.replace("-", "").replace("_", "").isalnum() and name.isascii()
    return name if bare else json.dumps(name)
