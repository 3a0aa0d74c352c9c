"""The dashboard's pages (report/dashboard.py serves them). Pure: data in, HTML out.

``page`` is the live view: inline CSS and JS, nothing fetched from elsewhere. Its script opens
``/events`` (server-sent events), draws the backlog it is sent first, then each event as it
comes. Every value from an event (names come from inside a sandbox) reaches the page as text
(``textContent``), never as markup. ``session_html`` is one session's report, plain HTML.
"""

from __future__ import annotations

import html
import time
from typing import Any

from sandgate.events.schema import Event
from sandgate.report.session import SessionReport, process_label

_STYLE = """
body{font:13px/1.4 system-ui,sans-serif;margin:0;background:#f6f7f9;color:#222}
header{background:#20252b;color:#eee;padding:8px 14px;display:flex;gap:18px;align-items:center}
header h1{font-size:15px;margin:0}
#conn{padding:2px 8px;border-radius:9px;background:#777}
#conn.up{background:#2e7d32}#conn.down{background:#c62828}
main{padding:10px 14px}
.counters{display:flex;gap:10px;flex-wrap:wrap;margin:6px 0}
.counters span{background:#fff;border:1px solid #ddd;border-radius:4px;padding:3px 8px}
.filters{margin:8px 0;display:flex;gap:10px;flex-wrap:wrap}
table{border-collapse:collapse;width:100%;background:#fff;margin-bottom:14px}
th,td{border-bottom:1px solid #e4e4e4;padding:3px 6px;text-align:left;white-space:nowrap}
td.t{white-space:normal;word-break:break-all}
th{background:#eceff3;position:sticky;top:0}
tr.allow td.v{color:#2e7d32;font-weight:600}tr.deny td.v{color:#c62828;font-weight:600}
tr.deny{background:#fff5f5}
h2{font-size:14px;margin:12px 0 4px}
"""

_SCRIPT = r"""
const params = new URLSearchParams(location.search);
const token = params.get('token');
const withToken = u =>
  token ? u + (u.includes('?') ? '&' : '?') + 'token=' + encodeURIComponent(token) : u;
const MAX_ROWS = 5000;
const $ = id => document.getElementById(id);
const filters = {
  guest: $('f-guest'), session: $('f-session'), verdict: $('f-verdict'), proc: $('f-proc'),
};
const seen = {guest: new Set(), session: new Set(), verdict: new Set(), proc: new Set()};
const counts = {};
let total = 0;

function cell(tr, text, cls) {
  const td = document.createElement('td');
  td.textContent = text == null ? '' : String(text);
  if (cls) td.className = cls;
  tr.appendChild(td);
  return td;
}
function option(kind, value) {
  if (value == null || value === '' || seen[kind].has(value)) return;
  seen[kind].add(value);
  const o = document.createElement('option');
  o.value = o.textContent = value;
  filters[kind].appendChild(o);
}
function visible(tr) {
  for (const k in filters) {
    const want = filters[k].value;
    if (want && tr.dataset[k] !== want) return false;
  }
  return true;
}
function refilter() {
  let shown = 0;
  for (const tr of $('events').rows) { tr.hidden = !visible(tr); if (!tr.hidden) shown++; }
  $('shown').textContent = shown;
}
function bump(key) {
  counts[key] = (counts[key] || 0) + 1;
  let el = document.querySelector('[data-counter="' + CSS.escape(key) + '"]');
  if (!el) {
    el = document.createElement('span');
    el.dataset.counter = key;
    $('counters').appendChild(el);
  }
  el.textContent = key + ': ' + counts[key];
}
function target(e) {
  const where = e.dst ? e.dst + (e.port != null ? ':' + e.port : '') : '';
  return e.name && where ? e.name + ' \u2192 ' + where : (e.name || where);
}
function session(s) {
  if (!s || !s.id) return;
  let tr = $('s-' + s.id);
  if (!tr) {
    tr = document.createElement('tr');
    tr.id = 's-' + s.id;
    $('sessions').prepend(tr);
    option('session', s.id);
  }
  tr.replaceChildren();
  tr.dataset.state = s.ended ? 'ended' : 'running';
  cell(tr, s.id);
  cell(tr, s.guest);
  cell(tr, s.profile);
  cell(tr, s.mode);
  cell(tr, s.started ? new Date(s.started * 1000).toLocaleTimeString() : '');
  const exit = s.exit_code != null ? ' (exit ' + s.exit_code + ')' : '';
  cell(tr, s.ended ? 'ended' + exit : 'running');
  const td = cell(tr, '');
  if (s.ended) {
    const a = document.createElement('a');
    a.href = withToken('/session/' + encodeURIComponent(s.id));
    a.textContent = 'report';
    a.className = 'report';
    td.appendChild(a);
  }
  cell(tr, s.command, 't');
}
const sessions = {};
function add(e) {
  if (e.session && !sessions[e.session]) {
    sessions[e.session] = {id: e.session, guest: e.guest, started: e.ts};
    session(sessions[e.session]);
  }
  if (e.kind === 'guest' && e.session && e.details && e.details.joined === false) {
    const s = sessions[e.session];
    s.ended = e.ts;  // the guest left: the session is over, its report is in the store
    session(s);
  }
  const tr = document.createElement('tr');
  tr.className = 'ev ' + (e.verdict || '');
  tr.dataset.guest = e.guest || '';
  tr.dataset.session = e.session || '';
  tr.dataset.verdict = e.verdict || '';
  tr.dataset.proc = e.proc || '';
  cell(tr, new Date(e.ts * 1000).toLocaleTimeString());
  cell(tr, e.session);
  cell(tr, e.guest);
  cell(tr, e.kind);
  cell(tr, e.verdict, 'v');
  cell(tr, e.reason);
  cell(tr, e.rule);
  cell(tr, target(e), 't');
  cell(tr, e.protocol || e.category);
  cell(tr, e.proc || (e.uid != null ? 'uid ' + e.uid : ''));
  cell(tr, e.count);
  for (const k of ['guest', 'verdict', 'proc']) option(k, tr.dataset[k]);
  const body = $('events');
  body.prepend(tr);
  tr.hidden = !visible(tr);
  while (body.rows.length > MAX_ROWS) body.deleteRow(-1);
  total++;
  $('total').textContent = total;
  if (e.verdict) bump(e.verdict);
  bump(e.kind);
  refilterCount();
}
let pending = false;
function refilterCount() {
  if (pending) return;
  pending = true;
  requestAnimationFrame(() => { pending = false; refilter(); });
}
function connected(up) {
  $('conn').className = up ? 'up' : 'down';
  $('conn').textContent = up ? 'live' : 'gateway not answering';
}
for (const k in filters) filters[k].addEventListener('change', refilter);
const source = new EventSource(withToken('/events'));
source.onmessage = m => {
  const msg = JSON.parse(m.data);
  if (msg.type === 'hello') {
    $('events').replaceChildren();
    total = 0;
    for (const k in counts) delete counts[k];
    $('counters').replaceChildren();
    for (const s of msg.sessions.slice().reverse()) { sessions[s.id] = s; session(s); }
    for (const e of msg.backlog) add(e);
    connected(msg.connected);
  } else if (msg.type === 'event') {
    add(msg.event);
  } else if (msg.type === 'status') {
    connected(msg.connected);
  }
};
// Approvals (sessions run with --ask): what waits, with an answer per name, as `sandgate
// approve` gives it. Polled: a wait is short (60 s by default) and seldom.
async function answer(p, verdict) {
  const r = await fetch(withToken('/approve'), {method: 'POST',
    headers: {'content-type': 'application/json'},
    body: JSON.stringify({name: p.name, guest: p.guest, verdict})});
  const got = await r.json();
  $('approve-msg').textContent = r.ok ? `${verdict} ${p.name}` +
    (got.overlay ? `: its rule is in ${got.overlay}` : '') : got.error;
  pollApprovals();
}
async function pollApprovals() {
  let pending = [];
  try {
    const r = await fetch(withToken('/approvals'));
    if (r.ok) pending = (await r.json()).pending;
  } catch (e) { return; }
  // Rows are kept while their name waits (a redraw would take a button from under a click).
  const body = $('approvals');
  const want = new Set(pending.map(p => p.guest + ' ' + p.name));
  for (const tr of [...body.children]) if (!want.has(tr.dataset.key)) tr.remove();
  for (const p of pending) {
    const key = p.guest + ' ' + p.name;
    const old = [...body.children].find(tr => tr.dataset.key === key);
    if (old) { old.querySelector('td.w').textContent = `${p.waiting_s} s`; continue; }
    const tr = document.createElement('tr');
    tr.dataset.key = key;
    tr.dataset.name = p.name;
    cell(tr, p.name, 't'); cell(tr, p.session || ''); cell(tr, p.guest);
    cell(tr, `${p.waiting_s} s`, 'w');
    const td = document.createElement('td');
    for (const [verdict, label] of [['allow', 'Allow once'], ['always', 'Always'],
                                    ['deny', 'Deny']]) {
      const b = document.createElement('button');
      b.textContent = label;
      b.dataset.verdict = verdict;
      b.onclick = () => answer(p, verdict);
      td.append(b);
    }
    tr.append(td);
    body.append(tr);
  }
  $('approvals-box').hidden = pending.length === 0;
}
setInterval(pollApprovals, 1000);
pollApprovals();
source.onerror = () => { $('conn').className = 'down'; $('conn').textContent = 'reconnecting'; };
"""


def page(instance: str) -> str:
    name = html.escape(instance)
    selects = "".join(
        f'<label>{label} <select id="f-{key}"><option value="">all</option></select></label>'
        for key, label in (
            ("guest", "guest"),
            ("session", "session"),
            ("verdict", "verdict"),
            ("proc", "process"),
        )
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>sandgate: {name}</title>
<style>{_STYLE}</style></head>
<body>
<header><h1>sandgate dashboard: gateway {name}</h1><span id="conn">connecting</span></header>
<main>
<div class="counters" id="counters-box"><span>events: <b id="total">0</b></span>
<span>shown: <b id="shown">0</b></span><span id="counters" class="counters"></span></div>
<div id="approvals-box" hidden><h2>Waiting for an answer</h2>
<table><thead><tr><th>name</th><th>session</th><th>guest</th><th>waiting</th><th>answer</th>
</tr></thead><tbody id="approvals"></tbody></table></div>
<p id="approve-msg"></p>
<h2>Sessions</h2>
<table><thead><tr><th>session</th><th>guest</th><th>profile</th><th>mode</th><th>started</th>
<th>state</th><th>report</th><th>command</th></tr></thead><tbody id="sessions"></tbody></table>
<h2>Attempts</h2>
<div class="filters">{selects}</div>
<table><thead><tr><th>time</th><th>session</th><th>guest</th><th>kind</th><th>verdict</th>
<th>reason</th><th>rule</th><th>target</th><th>protocol</th><th>process</th><th>count</th>
</tr></thead><tbody id="events"></tbody></table>
</main>
<script>{_SCRIPT}</script>
</body></html>
"""


def _table(headers: list[str], rows: list[list[Any]], verdict_at: int | None = None) -> str:
    if not rows:
        return "<p>none</p>"
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cls = (
            "" if verdict_at is None else f' class="{html.escape(str(row[verdict_at] or ""))}"'
        )
        cells = "".join(
            f'<td class="{"v" if i == verdict_at else "t"}">'
            f"{html.escape('' if v is None else str(v))}</td>"
            for i, v in enumerate(row)
        )
        body.append(f"<tr{cls}>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else ""


def session_html(r: SessionReport, events: list[Event]) -> str:
    """One session's report: what it asked, reached, requested, and every event."""
    sid = html.escape(r.session or "?")
    facts: list[list[Any]] = [
        ["command", " ".join(r.command)],
        ["mode", r.mode],
        ["profile", r.profile],
        ["policy", r.policy],
        ["exit code", r.exit_code],
        ["duration (s)", r.duration],
        ["uids", ", ".join(map(str, r.uids))],
    ]
    totals = [[cat, v, n] for cat, verdicts in r.totals.items() for v, n in verdicts.items()]
    names = [
        [n.name, n.verdict, n.reason, n.rule, n.questions, ", ".join(n.types),
         ", ".join(n.answers)]
        for n in r.names
    ]  # fmt: skip
    dests = [
        [f"{d.dst}:{d.port}" if d.port is not None else d.dst, d.protocol, d.category, d.verdict,
         d.reason, d.rule, d.attempts, d.packets, ", ".join(d.processes)]
        for d in r.destinations
    ]  # fmt: skip
    requests = [
        [q.host, q.port, q.method, q.path, q.status, q.tls, q.verdict, q.reason, q.bytes_up,
         q.bytes_down, q.process]
        for q in r.requests
    ]  # fmt: skip
    counters = [
        [prefix, c.get("verdict"), c.get("reason"), c.get("rule"), c.get("packets")]
        for prefix, c in sorted(r.counters.items())
        if isinstance(c, dict)
    ]
    rows = [
        [_when(e.ts), e.kind.value, e.verdict, e.reason, e.rule, e.name, e.dst, e.port,
         e.protocol, process_label(e) or (f"uid {e.uid}" if e.uid is not None else ""), e.count]
        for e in events
    ]  # fmt: skip
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>sandgate session {sid}</title>
<style>{_STYLE}</style></head><body>
<header><h1>session {sid}</h1></header><main>
{_table(["", ""], facts)}
<h2>Totals</h2>{_table(["category", "verdict", "attempts"], totals, 1)}
<h2>Names asked</h2>
{_table(["name", "verdict", "reason", "rule", "questions", "types", "answers"], names, 1)}
<h2>Destinations</h2>
{
        _table(
            [
                "destination",
                "protocol",
                "category",
                "verdict",
                "reason",
                "rule",
                "attempts",
                "packets",
                "process",
            ],
            dests,
            3,
        )
    }
<h2>Proxy requests and tunnels</h2>
{
        _table(
            [
                "host",
                "port",
                "method",
                "path",
                "status",
                "tls",
                "verdict",
                "reason",
                "bytes up",
                "bytes down",
                "process",
            ],
            requests,
            6,
        )
    }
<h2>Gateway counters (exact)</h2>
{_table(["site", "verdict", "reason", "rule", "packets"], counters, 1)}
<h2>Every event</h2>
{
        _table(
            [
                "time",
                "kind",
                "verdict",
                "reason",
                "rule",
                "name",
                "dst",
                "port",
                "protocol",
                "process",
                "count",
            ],
            rows,
            2,
        )
    }
</main></body></html>
"""


__all__ = ["page", "session_html"]
