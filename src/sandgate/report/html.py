"""The self-contained HTML report: one file, opened anywhere, that needs nothing else.

Pure: a ``SessionReport`` and the session's events in, a ``str`` out. The same data as the
terminal report (report/session.py), but nothing cut at 80 columns, plus what a table cannot
show: a timeline of every attempt by process (framework vs tool), attempts over time, verdicts
by category and bytes by destination, drawn here as inline SVG.

Nothing in the file refers to anything outside it: CSS, script and SVG are inline, there are no
fonts, images or favicons, and a Content-Security-Policy (``default-src 'none'``, the one script
allowed by its hash) keeps a browser from fetching anything or running anything else even if a
name the agent chose slipped past the escaping. Every string that came from the session (names,
answers, paths, diffs, claims) goes through ``esc``.
"""

from __future__ import annotations

import base64
import hashlib
import html
import re
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sandgate.events.schema import Event, Kind
from sandgate.policy.decide import Reason
from sandgate.report.session import SessionReport, process_label

if TYPE_CHECKING:
    from sandgate.session.suite import Row, SuiteResult

ATTEMPTS = (Kind.DNS, Kind.CONN, Kind.HTTP)
TIMELINE_MARKS = 5000  # beyond this the SVG gets slow to draw; the events table keeps them all
REASON_LABELS = {r.key: r.label for r in Reason}
COLOURS = {"allow": "#2e7d32", "deny": "#c62828", None: "#757575"}

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0 auto;max-width:1400px;padding:1em;color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;margin:.4em 0;width:100%}
th,td{border:1px solid #ddd;padding:2px 6px;text-align:left;vertical-align:top;
overflow-wrap:anywhere}
th{background:#f3f3f3;overflow-wrap:normal}tr:nth-child(even) td{background:#fafafa}
.allow,.pass{color:#2e7d32;font-weight:600}.deny,.fail,.error{color:#c62828;font-weight:600}
.partial{color:#b26a00;font-weight:600}.dim{color:#777}.flag{background:#fdecea}
pre{background:#f6f6f6;padding:6px;white-space:pre-wrap;overflow-wrap:anywhere;margin:0}
.add{color:#2e7d32}.del{color:#c62828}.meta td:first-child{font-weight:600;width:12em}
.plots{display:flex;flex-wrap:wrap;gap:1.5em}svg text{font:11px system-ui,sans-serif}
details>summary{cursor:pointer;font-weight:600;margin:.5em 0}
.session{border:1px solid #ccc;padding:0 1em;margin:1em 0}
.legend span{margin-right:1.2em}.suite td:nth-child(-n+3){white-space:nowrap}
"""

# The one script: filter the events table, open a session's <details> its link points at.
_JS = """
function sgFilter(box){
  var q=box.value.toLowerCase(),t=document.getElementById(box.dataset.table);
  for(var r of t.tBodies[0].rows){r.hidden=q&&r.textContent.toLowerCase().indexOf(q)<0;}
}
function sgOpen(){
  var id=decodeURIComponent(location.hash.slice(1)),d=id&&document.getElementById(id);
  if(d&&d.tagName==='DETAILS'){d.open=true;d.scrollIntoView();}
}
window.addEventListener('hashchange',sgOpen);
document.addEventListener('DOMContentLoaded',function(){
  sgOpen();
  for(var b of document.querySelectorAll('input.filter')){
    b.addEventListener('input',function(){sgFilter(this);});
  }
});
"""
_JS_HASH = base64.b64encode(hashlib.sha256(_JS.encode()).digest()).decode()
CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
    f"script-src 'sha256-{_JS_HASH}'; base-uri 'none'; form-action 'none'"
)


def esc(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def anchor(text: str) -> str:
    """An id safe in HTML and in a URL fragment (session ids are already, but be sure)."""
    return "s-" + re.sub(r"[^A-Za-z0-9_-]", "_", text)


def document(title: str, body: str) -> str:
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        "<meta name='viewport' content='width=device-width,initial-scale=1'>"
        f"<title>{esc(title)}</title><style>{_CSS}</style><script>{_JS}</script>"
        f"</head><body>{body}</body></html>\n"
    )


# -- session -----------------------------------------------------------------------------------


def session_html(report: SessionReport, events: Sequence[Event]) -> str:
    """The whole file for one session."""
    title = f"sandgate session {report.session}"
    return document(title, f"<h1>{esc(title)}</h1>" + session_body(report, events))


def session_body(report: SessionReport, events: Sequence[Event], prefix: str = "") -> str:
    """One session's report as a fragment (the suite file embeds one per row). ``prefix``
    keeps element ids unique when several sessions share a page."""
    attempts = sorted((e for e in events if e.kind in ATTEMPTS), key=lambda e: e.ts)
    parts = [
        _meta(report),
        "<h2>timeline of every attempt, by process</h2>",
        _timeline(attempts),
        "<h2>plots</h2><div class='plots'>",
        _figure("attempts over time", _over_time(attempts)),
        _figure("verdicts by category", _by_category(report.totals)),
        _figure("bytes by destination (proxy)", _bytes_by_destination(report)),
        "</div>",
        _names(report),
        _destinations(report),
        _requests(report),
        _counters(report.counters),
        _strays(report.writes),
        _drift(report.drift),
        _privilege(report.privilege),
        _claims(report.claims),
        _answer(report),
        _events_table(attempts, f"{prefix}events"),
    ]
    return "\n".join(parts)


def _verdict(v: str | None) -> str:
    return f"<span class='{esc(v or 'dim')}'>{esc(v or '-')}</span>"


def _reason(key: str | None) -> str:
    if not key:
        return ""
    label = REASON_LABELS.get(key)
    return esc(key) + (f"<br><span class='dim'>{esc(label)}</span>" if label else "")


def _table(
    head: Sequence[str], rows: Iterable[Sequence[str]], cls: str = "", table_id: str = ""
) -> str:
    """``rows`` hold cells already escaped (or built from escaped parts)."""
    th = "".join(f"<th>{esc(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    tid = f" id='{esc(table_id)}'" if table_id else ""
    return f"<table class='{cls}'{tid}><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _none(what: str) -> str:
    return f"<p class='dim'>{esc(what)}: none</p>"


def _meta(r: SessionReport) -> str:
    a = r.attribution
    roles = ", ".join(f"{k} {v}" for k, v in sorted((a.get("by_role") or {}).items()))
    rows = [
        ("session", esc(r.session)),
        ("command", f"<pre>{esc(' '.join(r.command))}</pre>"),
        ("mode / profile", esc(f"{r.mode} / {r.profile}")),
        ("policy / world", esc(f"{r.policy or 'built-in'} / {r.world or '-'}")),
        ("exit status", esc(r.exit_code)),
        ("duration", esc(f"{r.duration:.1f} s" if r.duration is not None else "-")),
        ("uids", esc(", ".join(map(str, r.uids)) or "-")),
        (
            "process attribution",
            esc(
                f"{a.get('tcp_attributed', 0)}/{a.get('tcp_attempts', 0)} TCP attempts traced"
                + (f"; by role: {roles}" if roles else "")
            ),
        ),
        (
            "totals",
            esc(
                "; ".join(
                    f"{cat}: " + " ".join(f"{v} {n}" for v, n in sorted(c.items()))
                    for cat, c in r.totals.items()
                )
                or "-"
            ),
        ),
    ]
    if r.model_use:
        from sandgate.report.render import model_use_line

        rows.append(("model server", esc(model_use_line(r.model_use))))
    if r.message:
        rows.append(("message", f"<span class='deny'>{esc(r.message)}</span>"))
    body = "".join(f"<tr><td>{esc(k)}</td><td>{v}</td></tr>" for k, v in rows)
    return f"<table class='meta'><tbody>{body}</tbody></table>"


def _target(e: Event) -> str:
    if e.kind is Kind.DNS:
        return f"{e.name} {e.details.get('qtype', '')}".strip()
    if e.kind is Kind.HTTP:
        method = e.details.get("method") or "TLS"
        path = e.details.get("path") if e.details.get("method") else ""
        return f"{method} {e.name or e.dst}:{e.port or ''}{path or ''}"
    port = f":{e.port}" if e.port is not None else ""
    return f"{e.dst}{port}/{e.protocol or '?'}"


def _lane(e: Event) -> tuple[int, str]:
    """(order, label): the framework's processes first, then tools, then the rest."""
    process = e.details.get("process")
    label = process_label(e)
    if not isinstance(process, dict) or label is None:
        return (3, "unattributed")
    role = str(process.get("role", "?"))
    return ({"framework": 0, "tool": 1}.get(role, 2), label)


def _clock(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts)) + f".{int(ts * 1000) % 1000:03d}"


def _timeline(attempts: Sequence[Event]) -> str:
    if not attempts:
        return _none("attempts")
    shown = attempts[:TIMELINE_MARKS]
    lanes = sorted({_lane(e) for e in shown})
    row = {lane: i for i, lane in enumerate(lanes)}
    t0, t1 = shown[0].ts, shown[-1].ts
    span = max(t1 - t0, 1e-3)
    left, width, lane_h, top = 230, 720, 20, 20
    height = top + lane_h * len(lanes) + 30
    out = [_svg_open(left + width + 20, height, "timeline of every attempt")]
    last_group = None
    for (group, label), i in row.items():
        y = top + i * lane_h
        if group != last_group and i:
            out.append(f"<line x1='0' x2='{left + width}' y1='{y}' y2='{y}' stroke='#999'/>")
        last_group = group
        out.append(
            f"<text x='4' y='{y + 14}'><title>{esc(label)}</title>{esc(label[:34])}</text>"
            f"<line x1='{left}' x2='{left + width}' y1='{y + 10}' y2='{y + 10}' "
            "stroke='#eee'/>"
        )
    for e in shown:
        x = left + (e.ts - t0) / span * width
        y = top + row[_lane(e)] * lane_h + 10
        colour = COLOURS.get(e.verdict, COLOURS[None])
        tip = esc(
            f"+{e.ts - t0:.3f}s {e.kind} {_target(e)} {e.verdict or '-'} {e.reason or ''}"
            + (f" ({e.rule})" if e.rule else "")
        )
        shape = (
            f"<rect x='{x - 4:.1f}' y='{y - 4}' width='8' height='8' fill='{colour}'>"
            if e.verdict == "deny"
            else f"<circle cx='{x:.1f}' cy='{y}' r='4' fill='{colour}'>"
        )
        tag = "rect" if e.verdict == "deny" else "circle"
        out.append(f"{shape}<title>{tip}</title></{tag}>")
    axis_y = top + lane_h * len(lanes) + 14
    out.append(
        f"<text x='{left}' y='{axis_y}'>{esc(_clock(t0))}</text>"
        f"<text x='{left + width}' y='{axis_y}' text-anchor='end'>+{span:.2f} s</text></svg>"
    )
    legend = (
        "<p class='legend'><span class='allow'>● allow</span><span class='deny'>■ deny</span>"
        "<span class='dim'>● not judged</span>"
        "<span class='dim'>lanes: framework processes, then tools, then unattributed</span></p>"
    )
    more = ""
    if len(attempts) > len(shown):
        more = f"<p class='dim'>first {len(shown)} of {len(attempts)} attempts drawn</p>"
    return "".join(out) + legend + more


def _svg_open(width: int, height: int, label: str) -> str:
    return (
        f"<svg width='{width}' height='{height}' "
        f"viewBox='0 0 {width} {height}' role='img' aria-label='{esc(label)}'>"
    )


def _figure(title: str, svg: str) -> str:
    return f"<figure><figcaption><b>{esc(title)}</b></figcaption>{svg}</figure>"


def _over_time(attempts: Sequence[Event], bins: int = 40) -> str:
    if not attempts:
        return _none("attempts")
    t0 = attempts[0].ts
    span = max(attempts[-1].ts - t0, 1e-3)
    counts: list[Counter[str]] = [Counter() for _ in range(bins)]
    for e in attempts:
        counts[min(int((e.ts - t0) / span * bins), bins - 1)][e.verdict or "-"] += 1
    peak = max(sum(c.values()) for c in counts)
    w, h, bar = 440, 160, 440 / bins
    out = [_svg_open(w, h + 20, "attempts over time")]
    for i, c in enumerate(counts):
        y = float(h)
        for verdict in ("allow", "deny", "-"):
            n = c.get(verdict, 0)
            if not n:
                continue
            bh = n / peak * (h - 10)
            y -= bh
            colour = COLOURS.get(verdict, COLOURS[None])
            out.append(
                f"<rect x='{i * bar:.1f}' y='{y:.1f}' width='{bar - 1:.1f}' height='{bh:.1f}' "
                f"fill='{colour}'><title>+{i * span / bins:.2f}s: {n} {esc(verdict)}</title></rect>"
            )
    out.append(
        f"<text x='0' y='{h + 14}'>0 s</text>"
        f"<text x='{w}' y='{h + 14}' text-anchor='end'>{span:.2f} s (peak {peak})</text></svg>"
    )
    return "".join(out)


def _hbars(rows: Sequence[tuple[str, Sequence[tuple[str, int, str]]]], unit: str) -> str:
    """Horizontal stacked bars: (label, [(part, value, colour)]) per row."""
    if not rows:
        return _none("data")
    peak = max(sum(v for _, v, _ in parts) for _, parts in rows) or 1
    left, width, bar_h = 200, 260, 18
    out = [_svg_open(left + width + 80, bar_h * len(rows) + 4, unit)]
    for i, (label, parts) in enumerate(rows):
        y = i * bar_h + 2
        out.append(f"<text x='0' y='{y + 12}'><title>{esc(label)}</title>{esc(label[:30])}</text>")
        x = float(left)
        for part, value, colour in parts:
            bw = value / peak * width
            out.append(
                f"<rect x='{x:.1f}' y='{y}' width='{bw:.1f}' height='{bar_h - 4}' "
                f"fill='{colour}'><title>{esc(label)}: {esc(part)} {value} {esc(unit)}</title>"
                "</rect>"
            )
            x += bw
        total = sum(v for _, v, _ in parts)
        out.append(f"<text x='{x + 4:.1f}' y='{y + 12}'>{total}</text>")
    out.append("</svg>")
    return "".join(out)


def _by_category(totals: Mapping[str, Mapping[str, int]]) -> str:
    rows = [
        (cat, [(v, n, COLOURS.get(v, COLOURS[None])) for v, n in sorted(c.items())])
        for cat, c in totals.items()
    ]
    return _hbars(rows, "attempts")


def _bytes_by_destination(r: SessionReport) -> str:
    up: Counter[str] = Counter()
    down: Counter[str] = Counter()
    for q in r.requests:
        key = f"{q.host or '?'}:{q.port or ''}"
        up[key] += q.bytes_up
        down[key] += q.bytes_down
    keys = sorted(up.keys() | down.keys(), key=lambda k: -(up[k] + down[k]))
    rows = [(k, [("up", up[k], "#1565c0"), ("down", down[k], "#90caf9")]) for k in keys]
    return _hbars([row for row in rows if sum(v for _, v, _ in row[1])], "bytes")


def _names(r: SessionReport) -> str:
    if not r.names:
        return "<h2>names asked</h2>" + _none("names asked")
    rows = [
        (
            esc(n.name),
            _verdict(n.verdict),
            _reason(n.reason),
            esc(n.rule),
            esc(n.questions),
            esc(", ".join(n.types)),
            esc(", ".join(n.answers) or "-"),
            esc(", ".join(map(str, n.uids))),
        )
        for n in r.names
    ]
    head = ("name", "verdict", "reason", "rule", "questions", "types", "answers", "uids")
    return "<h2>names asked</h2>" + _table(head, rows)


def _destinations(r: SessionReport) -> str:
    if not r.destinations:
        return "<h2>connection attempts</h2>" + _none("connection attempts")
    rows = [
        (
            esc(f"{d.dst}{f':{d.port}' if d.port is not None else ''}/{d.protocol or '?'}"),
            esc(d.category),
            _verdict(d.verdict),
            _reason(d.reason),
            esc(d.rule),
            esc(d.attempts),
            esc(d.packets),
            esc(", ".join(map(str, d.uids))),
            esc(", ".join(d.processes)),
        )
        for d in r.destinations
    ]
    head = (
        "destination", "category", "verdict", "reason", "rule", "attempts", "packets", "uids",
        "processes",
    )  # fmt: skip
    return "<h2>connection attempts (destinations)</h2>" + _table(head, rows)


def _requests(r: SessionReport) -> str:
    if not r.requests:
        return "<h2>proxy requests and tunnels</h2>" + _none("proxy requests and tunnels")
    rows = [
        (
            esc(q.method or "TLS tunnel"),
            esc(f"{q.host or '?'}:{q.port or ''}"),
            esc(q.path if q.method else ""),
            esc(q.tls),
            esc(q.door),
            esc(q.status or ""),
            _verdict(q.verdict),
            _reason(q.reason),
            esc(q.rule),
            esc(q.bytes_up),
            esc(q.bytes_down),
            esc(", ".join(q.credentials)),
            esc(" ".join(x for x in (str(q.uid) if q.uid is not None else "", q.process) if x)),
        )
        for q in r.requests
    ]
    head = (
        "request", "host", "path", "TLS", "door", "status", "verdict", "reason", "rule",
        "bytes up", "bytes down", "credentials", "uid / process",
    )  # fmt: skip
    return "<h2>proxy requests and tunnels</h2>" + _table(head, rows)


def _counters(counters: Mapping[str, Any]) -> str:
    if not counters:
        return ""
    rows = [
        (
            esc(site),
            _verdict(c.get("verdict")),
            _reason(c.get("reason")),
            esc(c.get("rule")),
            esc(c.get("packets")),
        )
        for site, c in sorted(counters.items())
        if isinstance(c, dict)
    ]
    return "<h2>the gateway's exact counters</h2>" + _table(
        ("counter", "verdict", "reason", "rule", "packets"), rows
    )


def _strays(writes: Mapping[str, Any]) -> str:
    out = "<h2>writes outside the work dir</h2>"
    if writes.get("disk_full"):
        limit = int(writes.get("disk_limit", 0)) >> 20
        out += f"<p class='deny'>the session's disk ({limit} MiB) filled up</p>"
    strays = writes.get("strays") or []
    if not strays:
        return out + _none("writes outside the work dir")
    rows = [
        (
            esc(s.get("path")),
            esc(s.get("change")),
            esc(s.get("kind", "")) + (" <span class='dim'>framework</span>"
                                      if s.get("framework") else ""),
            esc(s.get("size", "")),
            esc(s.get("sha256") or (f"-> {s['target']}" if s.get("target") else "")),
        )
        for s in strays
    ]  # fmt: skip
    out += f"<p>{len(strays)} kept in {esc(writes.get('quarantine') or '-')}</p>"
    if writes.get("kept_writes"):
        out += f"<p>--keep-writes: home changes written back to {esc(writes['kept_writes'])}</p>"
    return out + _table(("path", "change", "kind", "size", "sha256 / target"), rows)


def _diff(text: str) -> str:
    lines = []
    for ln in text.splitlines():
        cls = "add" if ln.startswith("+") else "del" if ln.startswith("-") else ""
        lines.append(f"<span class='{cls}'>{esc(ln)}</span>" if cls else esc(ln))
    return "<pre>" + "\n".join(lines) + "</pre>"


def _drift(drift: Mapping[str, Any]) -> str:
    out = "<h2>drift (before → after)</h2>"
    if not drift:
        return out + _none("drift (not checked)")
    if drift.get("gateway_changed"):
        restored = drift.get("gateway_restored")
        out += (
            "<p class='deny'>the gateway's ruleset was changed during the session; "
            + ("restored" if restored else "NOT restored: the gateway stays cut off")
            + "</p>"
        )
    items = drift.get("items") or []
    if not items:
        return out + _none("drift")
    rows = [
        (esc(i.get("what")), esc(i.get("change")), _diff(str(i.get("diff", "")))) for i in items
    ]
    return out + _table(("what", "change", "diff"), rows)


def _privilege(privilege: Sequence[Mapping[str, Any]]) -> str:
    if not privilege:
        return ""
    rows = [(esc(p.get("tool")), esc(p.get("args"))) for p in privilege]
    return "<h2>privilege attempts</h2>" + _table(("tool", "args"), rows)


def _claims(claims: Sequence[Mapping[str, Any]]) -> str:
    out = "<h2>claims in the final answer</h2>"
    if not claims:
        return out + _none("claims")
    flagged = sum(1 for c in claims if c.get("verdict") == "unsupported")
    out += f"<p>{len(claims)} claim(s), {flagged} the evidence does not support</p>"
    rows = []
    for c in claims:
        bad = c.get("verdict") == "unsupported"
        evidence = "".join(f"<li>{esc(x)}</li>" for x in c.get("evidence", []))
        files = ", ".join(str(f) for f in c.get("files", []))
        rows.append(
            (
                ("<b>FLAGGED</b> " if bad else "") + esc(c.get("text")),
                esc(c.get("kind")),
                f"<span class='{'deny' if bad else 'allow'}'>{esc(c.get('verdict'))}</span>",
                f"<ul>{evidence}</ul>" + (f"<span class='dim'>files: {esc(files)}</span>"
                                          if files else ""),
            )
        )  # fmt: skip
    return out + _table(("claim", "kind", "verdict", "evidence"), rows)


def _answer(r: SessionReport) -> str:
    if not r.answer and not r.output:
        return ""
    out = "<h2>the agent's final answer</h2>"
    out += f"<pre>{esc(r.answer)}</pre>" if r.answer else _none("answer")
    if r.output:
        out += f"<p class='dim'>full output kept in {esc(r.output)}</p>"
    return out


def _events_table(attempts: Sequence[Event], table_id: str) -> str:
    rows = [
        (
            esc(_clock(e.ts)),
            esc(e.kind),
            esc(e.guest),
            _verdict(e.verdict),
            _reason(e.reason),
            esc(_target(e)),
            esc(e.rule),
            esc(" ".join(x for x in (str(e.uid) if e.uid is not None else "",
                                     process_label(e)) if x)),
        )
        for e in attempts
    ]  # fmt: skip
    head = ("time", "kind", "guest", "verdict", "reason", "attempt", "rule", "uid / process")
    tid = esc(table_id)
    return (
        f"<details><summary>every attempt ({len(attempts)} events)</summary>"
        f"<input class='filter' data-table='{tid}' placeholder='filter' aria-label='filter'>"
        + _table(head, rows, table_id=table_id)
        + "</details>"
    )


# -- suite -------------------------------------------------------------------------------------


def suite_html(
    result: SuiteResult, sessions: Mapping[str, tuple[SessionReport, Sequence[Event]]]
) -> str:
    """The suite table with each row's session report embedded (a <details> per session,
    opened by the row's link), so the one file holds every session."""
    title = f"sandgate suite {result.name} ({result.agent} agent)"
    rows = [_suite_row(r, r.session in sessions) for r in result.rows]
    head = (
        "task", "mode", "outcome", "checks / claims", "names asked", "connections", "strays",
        "drift", "sudo", "by framework/tools", "flagged claims", "session",
    )  # fmt: skip
    summary = "; ".join(
        f"{mode}: " + ", ".join(f"{k} {v}" for k, v in sorted(c.items()))
        for mode, c in result.summary().items()
    )
    body = [f"<h1>{esc(title)}</h1>", f"<p>run {esc(result.id)}; {esc(summary)}</p>"]
    share = result.attribution_share()
    if share is not None:
        body.append(f"<p>TCP attempts traced to a process: {100 * share:.1f}%</p>")
    body.append(_table(head, rows, "suite"))
    body.append("<h2>sessions</h2>")
    for r in result.rows:
        if r.session is None or r.session not in sessions:
            continue
        report, events = sessions[r.session]
        sid = anchor(r.session)
        body.append(
            f"<details class='session' id='{sid}'><summary>{esc(r.task)} {esc(r.mode)}: "
            f"<span class='{esc(r.outcome)}'>{esc(r.outcome)}</span> "
            f"(session {esc(r.session)})</summary>"
            + session_body(report, events, prefix=f"{sid}-")
            + "</details>"
        )
    return document(title, "\n".join(body))


def _suite_row(r: Row, embedded: bool) -> tuple[str, ...]:
    conns = "; ".join(
        f"{cat}: " + " ".join(f"{v} {n}" for v, n in sorted(counts.items()))
        for cat, counts in r.connections.items()
    )
    roles = r.attribution.get("by_role") or {}
    session = esc(r.session or "-")
    if embedded and r.session:
        session = f"<a href='#{anchor(r.session)}'>{session}</a>"
    drift = ", ".join(r.drift) + ("" if r.gateway_restored is None else
                                  f" (gateway restored: {r.gateway_restored})")  # fmt: skip
    return (
        esc(r.task),
        esc(r.mode),
        f"<span class='{esc(r.outcome)}'>{esc(r.outcome)}</span>"
        + (f"<br><span class='dim'>{esc(r.message)}</span>" if r.message else ""),
        f"{esc(r.check or '-')} / {esc(r.claims_verdict)}",
        esc(", ".join(r.names) or "-")
        + (f"<br><span class='deny'>denied: {esc(', '.join(r.names_denied))}</span>"
           if r.names_denied else ""),
        esc(conns or "-"),
        esc("\n".join(r.strays) or "-").replace("\n", "<br>"),
        esc(drift or "-"),
        esc(r.sudo_attempts or "-"),
        esc(f"{roles.get('framework', 0)}/{roles.get('tool', 0)}" if roles else "-"),
        "<br>".join(f"<span class='deny'>{esc(c.get('text'))}</span>"
                    for c in r.flagged_claims) or "-",
        session,
    )  # fmt: skip
