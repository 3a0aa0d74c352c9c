"""What one session reached for, computed from its events. Pure: events in, a report out.

Names asked (allowed and denied), connection attempts grouped by destination with their
verdict, reason, category and the uids that made them, totals per category and verdict, and
the gateway's exact counters (the event log of drops is rate-limited; the counters are not).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from sandgate.events.schema import Event, Kind
from sandgate.events.store import SessionRow


@dataclass
class Destination:
    dst: str
    port: int | None
    protocol: str | None
    category: str | None
    verdict: str | None
    reason: str | None
    rule: str | None
    attempts: int = 0  # distinct flows
    packets: int = 0
    uids: list[int] = field(default_factory=list)
    processes: list[str] = field(default_factory=list)  # "role:command" of the senders


@dataclass
class NameAsked:
    name: str
    verdict: str | None
    reason: str | None
    rule: str | None
    questions: int = 0
    types: list[str] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)
    uids: list[int] = field(default_factory=list)


@dataclass
class Request:
    """One request (plain or inspected HTTP) or tunnel (passthrough TLS, CONNECT) via the proxy."""

    host: str | None
    port: int | None
    method: str | None
    path: str | None
    status: int | None
    tls: str | None
    door: str | None
    verdict: str | None
    reason: str | None
    rule: str | None
    bytes_up: int
    bytes_down: int
    uid: int | None
    credentials: list[str] = field(default_factory=list)
    process: str | None = None  # "role:command" of the sender


@dataclass
class SessionReport:
    session: str | None
    command: list[str]
    mode: str | None
    profile: str | None
    policy: str | None
    world: str | None
    exit_code: int | None
    duration: float | None
    names: list[NameAsked]
    destinations: list[Destination]
    totals: dict[str, dict[str, int]]  # category -> verdict -> attempts
    uids: list[int]
    requests: list[Request]
    counters: dict[str, Any]
    message: str | None = None
    # Findings the runner computed around the command (see session/runner.py): writes outside
    # the work dir, drift, privilege attempts, the work dir's new files, claims, attribution.
    writes: dict[str, Any] = field(default_factory=dict)
    drift: dict[str, Any] = field(default_factory=dict)
    privilege: list[dict[str, Any]] = field(default_factory=list)
    work_changes: list[dict[str, Any]] = field(default_factory=list)
    claims: list[dict[str, Any]] = field(default_factory=list)
    attribution: dict[str, Any] = field(default_factory=dict)
    answer: str | None = None
    output: str | None = None
    # Resource limits in effect (sandbox/limits.py), what the session used, the limits it hit.
    limits: dict[str, Any] = field(default_factory=dict)
    usage: dict[str, Any] = field(default_factory=dict)
    limit_hits: list[dict[str, Any]] = field(default_factory=list)
    # The session's requests to the model server, tokens and streaming delays
    # (session/modeluse.py); empty when the session ran without a test world.
    model_use: dict[str, Any] = field(default_factory=dict)
    vm: dict[str, Any] = field(default_factory=dict)  # a VM guest: accelerator, kernel, NIC

    @property
    def flagged_claims(self) -> list[dict[str, Any]]:
        return [c for c in self.claims if c.get("verdict") == "unsupported"]

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["names_allowed"] = sorted({n.name for n in self.names if n.verdict == "allow"})
        out["names_denied"] = sorted({n.name for n in self.names if n.verdict == "deny"})
        out["flagged_claims"] = self.flagged_claims
        return out


def process_label(e: Event) -> str | None:
    """``role:command`` of the process that made the flow (procattr), e.g. ``tool:curl``."""
    process = e.details.get("process")
    if not isinstance(process, dict):
        return None
    cmdline = process.get("cmdline") or []
    exe = process.get("exe") or (cmdline[0] if cmdline else "?")
    name = str(cmdline[0] if cmdline else exe).rsplit("/", 1)[-1]
    if name.startswith("python") and len(cmdline) > 1:
        name = f"{name} {str(cmdline[1]).rsplit('/', 1)[-1]}"
    return f"{process.get('role', '?')}:{name}"


def attribution(events: list[Event]) -> dict[str, Any]:
    """How many TCP attempts (connections judged at the gateway, proxy requests and tunnels)
    were traced to a process, and how they split between the agent framework and its tools."""
    tcp = [
        e for e in events if (e.kind is Kind.CONN and e.protocol == "tcp") or e.kind is Kind.HTTP
    ]
    traced = [e for e in tcp if isinstance(e.details.get("process"), dict)]
    roles: Counter[str] = Counter()
    for e in events:
        process = e.details.get("process")
        if isinstance(process, dict) and e.kind in (Kind.CONN, Kind.HTTP, Kind.DNS):
            roles[str(process.get("role", "?"))] += 1
    return {
        "tcp_attempts": len(tcp),
        "tcp_attributed": len(traced),
        "tcp_share": round(len(traced) / len(tcp), 4) if tcp else None,
        "by_role": dict(roles),
    }


def build_report(
    session: SessionRow | None, events: list[Event], counters: dict[str, Any] | None = None
) -> SessionReport:
    names: dict[tuple[str, str | None], NameAsked] = {}
    for e in events:
        if e.kind is not Kind.DNS or e.name is None:
            continue
        item = names.setdefault((e.name, e.verdict), NameAsked(e.name, e.verdict, e.reason, e.rule))
        item.questions += 1
        qtype = str(e.details.get("qtype", ""))
        if qtype and qtype not in item.types:
            item.types.append(qtype)
        for a in e.details.get("answers", []):
            if a not in item.answers:
                item.answers.append(a)
        if e.uid is not None and e.uid not in item.uids:
            item.uids.append(e.uid)

    dests: dict[tuple[Any, ...], Destination] = {}
    flows: dict[tuple[Any, ...], set[Any]] = defaultdict(set)
    totals: dict[str, Counter[str]] = defaultdict(Counter)
    seen_flows: set[tuple[Any, ...]] = set()
    for e in events:
        if e.kind is not Kind.CONN:
            continue
        key = (e.dst, e.port, e.protocol, e.verdict, e.reason)
        d = dests.setdefault(
            key,
            Destination(e.dst or "?", e.port, e.protocol, e.category, e.verdict, e.reason, e.rule),
        )
        flow = (e.details.get("sport"), e.details.get("icmp_type"))
        if flow not in flows[key] or flow == (None, None):
            d.attempts += 1
        flows[key].add(flow)
        d.packets += e.count
        if e.uid is not None and e.uid not in d.uids:
            d.uids.append(e.uid)
        who = process_label(e)
        if who and who not in d.processes:
            d.processes.append(who)
        fkey = (*key, flow)
        if fkey not in seen_flows:
            seen_flows.add(fkey)
            totals[e.category or "other"][e.verdict or "?"] += 1
    for n in names.values():
        totals["DNS questions"][n.verdict or "?"] += n.questions

    requests = [
        Request(
            host=e.name,
            port=e.port,
            method=e.details.get("method"),
            path=e.details.get("path"),
            status=e.details.get("status"),
            tls=e.details.get("tls"),
            door=e.details.get("door"),
            verdict=e.verdict,
            reason=e.reason,
            rule=e.rule,
            bytes_up=int(e.details.get("bytes_up", 0)),
            bytes_down=int(e.details.get("bytes_down", 0)),
            uid=e.uid,
            credentials=list(e.details.get("credentials", [])),
            process=process_label(e),
        )
        for e in events
        if e.kind is Kind.HTTP
    ]
    for r in requests:
        totals["HTTP requests" if r.method and r.method != "CONNECT" else "tunnels"][
            r.verdict or "?"
        ] += 1
    uids = sorted({e.uid for e in events if e.uid is not None})
    details = session.details if session is not None else {}
    duration = None
    if session is not None and session.ended is not None:
        duration = round(session.ended - session.started, 3)
    return SessionReport(
        session=session.id if session else None,
        command=session.command if session else [],
        mode=session.mode if session else None,
        profile=session.profile if session else None,
        policy=session.policy if session else None,
        world=session.world if session else None,
        exit_code=session.exit_code if session else None,
        duration=duration,
        names=sorted(names.values(), key=lambda n: (n.verdict or "", n.name)),
        destinations=sorted(
            dests.values(), key=lambda d: (d.verdict or "", d.category or "", d.dst)
        ),
        totals={k: dict(v) for k, v in sorted(totals.items())},
        uids=uids,
        requests=requests,
        counters=counters or {},
        message=details.get("message"),
        writes=details.get("writes", {}),
        drift=details.get("drift", {}),
        privilege=details.get("privilege", []),
        work_changes=details.get("work_changes", []),
        claims=details.get("claims", []),
        attribution=attribution(events),
        answer=details.get("answer"),
        output=details.get("output"),
        limits=details.get("limits", {}),
        usage=details.get("usage", {}),
        limit_hits=details.get("limit_hits", []),
        model_use=details.get("model_use", {}),
        vm=details.get("vm", {}),
    )
