"""Terminal rendering of reports and logs (the only module that imports rich)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from sandgate.events.schema import Event
from sandgate.report.session import SessionReport

VERDICT_STYLE = {"allow": "green", "deny": "red"}


def _verdict(v: str | None) -> Text:
    return Text(v or "-", style=VERDICT_STYLE.get(v or "", ""))


def session_tables(r: SessionReport, title: str | None = None) -> Group:
    head = Text()
    head.append(title or f"session {r.session}", style="bold")
    head.append(f"  mode {r.mode}  profile {r.profile}  exit {r.exit_code}")
    if r.duration is not None:
        head.append(f"  {r.duration:.1f} s")
    parts: list[object] = [head]
    if r.message:
        parts.append(Text(r.message, style="yellow"))
    names = Table(title="names asked", title_justify="left", expand=False)
    for col in ("name", "verdict", "reason", "questions", "answers"):
        names.add_column(col)
    for n in r.names:
        names.add_row(
            n.name, _verdict(n.verdict), n.reason or "", str(n.questions), ", ".join(n.answers[:3])
        )
    parts.append(names if r.names else Text("names asked: none"))
    conns = Table(title="connection attempts", title_justify="left")
    for col in ("destination", "category", "verdict", "reason", "rule", "attempts", "uids", "by"):
        conns.add_column(col)
    for d in r.destinations:
        port = f":{d.port}" if d.port is not None else ""
        conns.add_row(
            f"{d.dst}{port}/{d.protocol or '?'}",
            d.category or "",
            _verdict(d.verdict),
            d.reason or "",
            d.rule or "",
            str(d.attempts),
            ",".join(str(u) for u in d.uids),
            Text(", ".join(d.processes[:3])),
        )
    parts.append(conns if r.destinations else Text("connection attempts: none"))
    if r.requests:
        reqs = Table(title="requests and tunnels (proxy)", title_justify="left")
        for col in ("request", "tls", "status", "verdict", "reason", "bytes ↑/↓", "uid"):
            reqs.add_column(col)
        for q in r.requests:
            what = f"{q.method or 'TLS'} {q.host or '?'}:{q.port or ''}{q.path or ''}"
            if q.credentials:
                what += f" [{', '.join(q.credentials)}]"
            reqs.add_row(
                what,
                q.tls or "",
                str(q.status or ""),
                _verdict(q.verdict),
                q.reason or "",
                f"{q.bytes_up}/{q.bytes_down}",
                Text(
                    ("" if q.uid is None else str(q.uid)) + (f" {q.process}" if q.process else "")
                ),
            )
        parts.append(reqs)
    totals = ", ".join(
        f"{cat}: " + " ".join(f"{v} {n}" for v, n in sorted(c.items()))
        for cat, c in r.totals.items()
    )
    if totals:
        parts.append(Text("totals  " + totals))
    if r.uids:
        parts.append(Text("uids  " + ", ".join(str(u) for u in r.uids)))
    if r.limits:
        parts.append(Text("limits  " + limits_line(r.limits, r.usage)))
    for hit in r.limit_hits:
        parts.append(Text(str(hit.get("text", hit.get("reason"))), style="red"))
    parts += findings(r)
    return Group(*parts)  # type: ignore[arg-type]


STRAYS_SHOWN = 15


def model_use_line(use: dict[str, Any]) -> str:
    """The one line of session/modeluse.py's ``ModelUse.line()``, from its JSON."""
    from sandgate.session.modeluse import ModelUse

    known = {k: v for k, v in use.items() if k in ModelUse.__dataclass_fields__}
    return ModelUse(**known).line()


def findings(r: SessionReport) -> list[object]:
    """What the session changed and claimed: stray writes, drift, privilege attempts, claims."""
    parts: list[object] = []
    attribution = r.attribution
    if r.vm:  # issue 9: a VM guest has its own kernel; the gateway knows only the guest
        parts.append(
            Text(
                f"VM guest  accelerator {r.vm.get('accel')} ({r.vm.get('accel_why')}), "
                f"kernel {r.vm.get('kernel')}, as {r.vm.get('user')}; "
                f"attempts attributed {r.vm.get('attribution')}"
            )
        )
    elif attribution.get("tcp_attempts"):
        roles = ", ".join(f"{k} {v}" for k, v in sorted(attribution.get("by_role", {}).items()))
        parts.append(
            Text(
                f"process attribution  {attribution.get('tcp_attributed', 0)}/"
                f"{attribution['tcp_attempts']} TCP attempts traced to a process"
                + (f"; attempts by role: {roles}" if roles else "")
            )
        )
    if r.model_use:
        parts.append(Text("model server  " + model_use_line(r.model_use)))
    parts += _strays(r.writes)
    parts += _drift(r.drift)
    if r.privilege:
        tools = ", ".join(f"{p['tool']} {p['args']}".strip() for p in r.privilege[:5])
        parts.append(Text(f"privilege attempts: {len(r.privilege)} ({tools})", style="yellow"))
    if r.claims:
        table = Table(title="claims in the final answer", title_justify="left")
        for col in ("claim", "verdict", "evidence"):
            table.add_column(col, overflow="fold")
        for c in r.claims:
            style = "red" if c.get("verdict") == "unsupported" else "green"
            table.add_row(
                Text(str(c.get("text", ""))),
                Text(str(c.get("verdict", "")), style=style),
                Text("; ".join(str(e) for e in c.get("evidence", []))),
            )
        parts.append(table)
    return parts


def _strays(writes: dict[str, object]) -> list[object]:
    strays = writes.get("strays") or []
    assert isinstance(strays, list)
    out: list[object] = []
    if writes.get("disk_full"):
        limit = int(str(writes.get("disk_limit", 0))) >> 20
        out.append(Text(f"the session's disk ({limit} MiB) filled up", style="red"))
    if not strays:
        if writes:
            out.append(Text("writes outside the work dir: none"))
        return out
    table = Table(
        title=f"writes outside the work dir ({len(strays)}, kept in {writes.get('quarantine')})",
        title_justify="left",
    )
    for col in ("path", "change", "size", "sha256"):
        table.add_column(col, overflow="fold")
    for s in strays[:STRAYS_SHOWN]:
        sha = s.get("sha256") or (f"-> {s['target']}" if s.get("target") else "")
        table.add_row(Text(s["path"]), s["change"], str(s.get("size", "")), (sha or "")[:16])
    if len(strays) > STRAYS_SHOWN:
        table.add_row(f"... and {len(strays) - STRAYS_SHOWN} more", "", "", "")
    out.append(table)
    if writes.get("kept_writes"):
        out.append(Text(f"--keep-writes: home changes written back to {writes['kept_writes']}"))
    return out


def _drift(drift: dict[str, object]) -> list[object]:
    items = drift.get("items") or []
    assert isinstance(items, list)
    if not drift:
        return []
    if not items:
        return [Text("drift: none (gateway, resolver, hosts, pip, apt, git, proxy settings)")]
    out: list[object] = []
    if drift.get("gateway_changed"):
        restored = drift.get("gateway_restored")
        out.append(
            Text(
                "the gateway's ruleset was changed during the session; "
                + ("restored" if restored else "NOT restored: the gateway stays cut off"),
                style="red",
            )
        )
    table = Table(title="drift (before → after)", title_justify="left")
    table.add_column("what")
    table.add_column("change")
    table.add_column("diff", overflow="fold")
    for item in items:
        lines = [
            ln
            for ln in str(item.get("diff", "")).splitlines()
            if ln[:1] in "+-" and not ln.startswith(("+++", "---"))
        ]
        table.add_row(Text(item["what"]), item["change"], Text("\n".join(lines[:6])))
    out.append(table)
    return out


def limits_line(limits: dict[str, Any], usage: dict[str, Any]) -> str:
    """The limits in effect and the peaks, e.g. "pids 1024 (peak 3), memory 12G (peak 4M)"."""
    from sandgate.policy.limits import format_size

    parts = []
    if limits.get("pids") is not None:
        parts.append(f"pids {limits['pids']} (peak {usage.get('pids_peak', '?')})")
    if limits.get("memory") is not None:
        peak = usage.get("memory_peak")
        parts.append(
            f"memory {format_size(int(limits['memory']))}, swap off"
            f" (peak {format_size(int(peak)) if peak else '?'})"
        )
    cpus = limits.get("cpus")
    parts.append(f"cpus {cpus:g}" if cpus is not None else "cpus unlimited")
    parts += [str(n) for n in limits.get("notes", [])]
    return ", ".join(parts)


def print_report(
    r: SessionReport, console: Console | None = None, title: str | None = None
) -> None:
    (console or Console(stderr=True)).print(session_tables(r, title))


def comparison(reports: Sequence[tuple[str, SessionReport]]) -> Table:
    """One row per name or destination, one column per session: what each reached for."""
    table = Table(title="what the agent reached for", title_justify="left")
    table.add_column("attempt")
    for title, r in reports:
        table.add_column(f"{title}\n{r.session}", overflow="fold")
    rows: dict[str, list[Text]] = {}
    width = len(reports)
    for i, (_, r) in enumerate(reports):
        for n in r.names:
            cells = rows.setdefault(f"name {n.name}", [Text("-", style="dim")] * width)
            answer = f" → {n.answers[0]}" if n.answers else ""
            cells[i] = Text(
                f"{n.verdict} {n.reason}{answer} ×{n.questions}",
                style=VERDICT_STYLE.get(n.verdict or "", ""),
            )
        for d in r.destinations:
            port = f":{d.port}" if d.port is not None else ""
            cells = rows.setdefault(f"{d.category} {d.dst}{port}", [Text("-", style="dim")] * width)
            rule = f" ({d.rule})" if d.rule else ""
            cells[i] = Text(
                f"{d.verdict} {d.reason}{rule} ×{d.attempts}",
                style=VERDICT_STYLE.get(d.verdict or "", ""),
            )
        for q in r.requests:
            scheme = "HTTP" if q.tls == "plain" else "HTTPS"
            cells = rows.setdefault(f"{scheme} {q.host}:{q.port}", [Text("-", style="dim")] * width)
            status = f" {q.status}" if q.status else ""
            cells[i] = Text(
                f"{q.verdict} {q.reason} ({q.tls}){status}",
                style=VERDICT_STYLE.get(q.verdict or "", ""),
            )
    for key in sorted(rows, key=lambda k: (not k.startswith("name "), k)):
        table.add_row(key, *rows[key])
    table.add_section()
    table.add_row("exit status", *[Text(str(r.exit_code)) for _, r in reports])
    table.add_row("uids", *[Text(", ".join(map(str, r.uids)) or "-") for _, r in reports])
    table.add_row(
        "writes outside /work",
        *[Text(str(len(r.writes.get("strays", []))) if r.writes else "-") for _, r in reports],
    )
    table.add_row(
        "claims the evidence does not support",
        *[
            Text("; ".join(str(c.get("text", "")) for c in r.flagged_claims) or "none",
                 style="red" if r.flagged_claims else "green")
            for _, r in reports
        ],
    )  # fmt: skip
    return table


def print_side_by_side(
    reports: Sequence[tuple[str, SessionReport]], console: Console | None = None
) -> None:
    (console or Console()).print(comparison(reports))


def event_line(e: Event) -> Text:
    """One event as one line, for `sandgate watch`."""
    line = Text(
        time.strftime("%H:%M:%S", time.localtime(e.ts)) + f" {e.kind!s:6} {e.guest or '-':5} "
    )
    line.append(f"{e.verdict or '-':5}", style=VERDICT_STYLE.get(e.verdict or "", ""))
    target = e.name or e.dst or ""
    if e.port is not None and not e.name:
        target += f":{e.port}"
    line.append(f" {target} {e.reason or ''}")
    if e.uid is not None:
        line.append(f" uid {e.uid}", style="dim")
    if e.rule:
        line.append(f" ({e.rule})", style="dim")
    return line


def events_table(events: Iterable[Event]) -> Table:
    table = Table()
    for col in ("time", "kind", "guest", "uid", "verdict", "reason", "destination", "name", "rule"):
        table.add_column(col)
    for e in events:
        dst = e.dst or ""
        if e.port is not None:
            dst += f":{e.port}"
        if e.protocol:
            dst += f"/{e.protocol}"
        table.add_row(
            time.strftime("%H:%M:%S", time.localtime(e.ts)) + f".{int(e.ts * 1000) % 1000:03d}",
            str(e.kind),
            e.guest or "",
            "" if e.uid is None else str(e.uid),
            _verdict(e.verdict),
            e.reason or "",
            dst,
            e.name or "",
            e.rule or "",
        )
    return table


def prove_table(result: object) -> Table:
    """Report 001's table: probe, target, expected, observed, logged, result."""
    table = Table(
        title=f"sandgate prove: {getattr(result, 'mode', '')} mode, profile "
        f"{getattr(result, 'profile', '')}",
        title_justify="left",
    )
    for col in ("group", "probe", "target", "expected", "observed", "logged", "result"):
        table.add_column(col, overflow="fold")
    style = {"PASS": "green", "FAIL": "bold red", "SKIP": "yellow"}
    for r in getattr(result, "results", []):
        table.add_row(
            r.group,
            r.probe,
            r.target,
            r.expected,
            _verdict(r.observed),
            r.logged if r.logged in ("yes", "no") else Text(r.logged, style="dim"),
            Text(r.result, style=style.get(r.result, "")),
        )
        if r.result == "FAIL" and r.why:
            table.add_row("", Text(f"  ↳ {r.why}", style="red"), "", "", "", "", "")
    return table


def doctor_table(result: object) -> Table:
    """``sandgate doctor``: one row per hop, in the order traffic crosses them; a failed hop's
    fix on the line below it."""
    table = Table(
        title=f"sandgate doctor: profile {getattr(result, 'profile', '')}, "
        f"{getattr(result, 'mode', '')} mode",
        title_justify="left",
    )
    for col in ("hop", "status", "detail"):
        table.add_column(col, overflow="fold")
    style = {"ok": "green", "fail": "bold red", "skip": "yellow"}
    for h in getattr(result, "hops", []):
        status = str(h.status)
        table.add_row(h.name, Text(status, style=style.get(status, "")), Text(h.detail))
        if h.fix:
            table.add_row("", "", Text(f"↳ fix: {h.fix}", style="red"))
    return table


def _roles_cell(attribution: dict[str, object]) -> str:
    roles = attribution.get("by_role") or {}
    assert isinstance(roles, dict)
    return f"{roles.get('framework', 0)}/{roles.get('tool', 0)}" if roles else "-"


def _model_cell(use: dict[str, Any]) -> str:
    """'4/812>40/0.4': requests, tokens in>out, seconds at the model (p99 gap in the JSON)."""
    if not use:
        return "-"
    tokens = f"{use.get('tokens_in') or 0}>{use.get('tokens_out') or 0}"
    return f"{use.get('requests', 0)}/{tokens}/{use.get('seconds', 0):g}"


def _names_cell(names: list[str]) -> str:
    # Reverse lookups (ping, ss) are noise in a one-line summary; the JSON keeps them.
    shown = [n for n in names if not n.endswith(".arpa")]
    extra = len(names) - len(shown[:3])
    return ", ".join(shown[:3]) + (f" +{extra}" if extra > 0 else "") or "-"


OUTCOME_STYLE = {
    "pass": "green",
    "partial": "yellow",
    "fail": "red",
    "error": "red",
    "fail (invented)": "bold red",
    "fail (guessed)": "bold red",
}
CLAIMS_STYLE = {"invented": "red", "guessed": "yellow", "supported": "green"}


def suite_table(result: object) -> Table:
    """One row per task and mode: outcome, what it reached for, what it changed and claimed."""
    from sandgate.session.suite import SuiteResult

    assert isinstance(result, SuiteResult)
    table = Table(title=f"suite {result.name} ({result.agent} agent)", title_justify="left")
    for col in (
        "task",
        "mode",
        "outcome",
        "checks",
        "claims",
        "names asked",
        "connections",
        "strays",
        "drift",
        "sudo",
        "by framework/tools",
        "model req/tok/s",
        "flagged claims",
        "session",
    ):
        table.add_column(col, overflow="fold")
    for r in result.rows:
        conns = " ".join(
            f"{cat} {v} {n}" for cat, counts in r.connections.items() for v, n in counts.items()
        )
        table.add_row(
            r.task,
            r.mode,
            Text(r.outcome, style=OUTCOME_STYLE.get(r.outcome, "")),
            r.check or "-",
            Text(r.claims_verdict, style=CLAIMS_STYLE.get(r.claims_verdict, "")),
            Text(_names_cell(r.names)),
            Text(conns or "-"),
            str(len(r.strays)) if r.strays else "-",
            Text(", ".join(r.drift)) if r.drift else "-",
            str(r.sudo_attempts) if r.sudo_attempts else "-",
            _roles_cell(r.attribution),
            _model_cell(r.model_use),
            Text(
                "; ".join(str(c.get("text", ""))[:60] for c in r.flagged_claims) or "-",
                style="red" if r.flagged_claims else "",
            ),
            r.session or "-",
        )
    table.add_section()
    summary = result.summary()
    for mode, counts in summary.items():
        table.add_row(
            "total",
            mode,
            " ".join(f"{k} {v}" for k, v in sorted(counts.items())),
            *[""] * 10,
        )
    return table
