"""The self-contained HTML report (report/html.py), from events to a string, no browser.

What the agent chose (a DNS name with a <script> in it, an answer that is markup, a path with
quotes) must come out as text; the file must refer to nothing outside itself; every section of
the terminal report must be there, uncut.
"""

from __future__ import annotations

import base64
import hashlib
import re
from html.parser import HTMLParser

from sandgate.events.schema import Event, Kind
from sandgate.events.store import SessionRow
from sandgate.report.html import CSP, anchor, session_html, suite_html
from sandgate.report.session import SessionReport, build_report
from sandgate.session.suite import Row, SuiteResult

EVIL = "<script>alert('x')</script>.evil.test"
T0 = 1_800_000_000.0
LONG_RULE = "coder.deny[3] (" + "a-very-long-rule-label-" * 8 + ")"


def _proc(role: str, *cmdline: str) -> dict[str, object]:
    return {"process": {"role": role, "cmdline": list(cmdline), "pid": 7, "exe": cmdline[0]}}


def _events() -> list[Event]:
    tool = _proc("tool", "curl", "https://pypi.org/")
    fw = _proc("framework", "python3", "/opt/agent/run.py")
    return [
        Event(Kind.SESSION, ts=T0, session="s1"),
        Event(Kind.DNS, ts=T0 + 0.1, session="s1", verdict="allow", reason="allow.rule",
              rule="coder.allow[0] (pypi.org)", name="pypi.org", uid=61000,
              details={"qtype": "A", "answers": ["203.0.113.20"], **tool}),
        Event(Kind.DNS, ts=T0 + 0.2, session="s1", verdict="deny", reason="deny.not_allowlisted",
              name=EVIL, uid=61000, details={"qtype": "A", **fw}),
        Event(Kind.CONN, ts=T0 + 0.3, session="s1", verdict="allow", reason="allow.pinned",
              rule="coder.allow[0] (pypi.org)", dst="203.0.113.20", port=443, protocol="tcp",
              category="TCP", uid=61000, details={"sport": 4000, **tool}),
        Event(Kind.CONN, ts=T0 + 0.4, session="s1", verdict="deny", reason="deny.rule",
              rule=LONG_RULE, dst="198.51.100.7", port=22, protocol="tcp", category="TCP",
              details={"sport": 4001}),
        Event(Kind.HTTP, ts=T0 + 0.5, session="s1", verdict="allow", reason="allow.rule",
              rule="coder.allow[0] (pypi.org)", name="pypi.org", dst="203.0.113.20", port=443,
              protocol="tcp", details={"tls": "inspected", "door": "explicit", "method": "GET",
                                       "path": "/simple/\"><img src=x>", "status": 200,
                                       "bytes_up": 512, "bytes_down": 70000, **tool}),
        Event(Kind.HTTP, ts=T0 + 0.6, session="s1", verdict="allow", reason="allow.rule",
              name="files.example", dst="203.0.113.21", port=443, protocol="tcp",
              details={"tls": "passthrough", "door": "transparent", "bytes_up": 100,
                       "bytes_down": 9000}),
    ]  # fmt: skip


DETAILS = {
    "writes": {
        "strays": [
            {"path": "/home/agent/'quoted'<b>.txt", "change": "created", "size": 3,
             "sha256": "ab" * 32, "kind": "file"},
        ],
        "quarantine": "/var/lib/sandgate/sessions/s1/strays",
    },
    "drift": {
        "items": [{"what": "/home/agent/.config/pip/pip.conf", "change": "created",
                   "diff": "--- before\n+++ after\n+[global]\n+index-url = <evil>\n-old"}],
        "gateway_changed": False,
    },
    "privilege": [{"tool": "sudo", "args": "apt-get install <x>"}],
    "claims": [
        {"kind": "download", "text": "I downloaded http://example.com/<page>", "verdict":
         "unsupported", "evidence": ["no HTTP request to example.com was allowed"]},
        {"kind": "version", "text": "rich 13.7", "verdict": "supported",
         "evidence": ["pypi.org answered 200"]},
    ],
    "answer": "</pre><script>alert(2)</script>",
    "message": "the agent <timed out>",
}  # fmt: skip


def _report() -> tuple[SessionReport, list[Event]]:
    row = SessionRow("s1", T0, T0 + 2.0, "allowlist", "coder", None, "test", "g0", 61000,
                     ["sh", "-c", "curl <x>"], 0, DETAILS)  # fmt: skip
    events = _events()
    counters = {"sg:g0:1": {"packets": 3, "verdict": "deny", "reason": "deny.rule", "rule": "r"}}
    return build_report(row, events, counters), events


class Parsed(HTMLParser):
    """Tags with their attributes, the text of <script> and <style>, and the visible text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[str] = []
        self.styles: list[str] = []
        self.text: list[str] = []
        self._in: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in = tag if tag in ("script", "style") else None

    def handle_endtag(self, tag: str) -> None:
        self._in = None

    def handle_data(self, data: str) -> None:
        if self._in == "script":
            self.scripts.append(data)
        elif self._in == "style":
            self.styles.append(data)
        else:
            self.text.append(data)


def parse(doc: str) -> Parsed:
    p = Parsed()
    p.feed(doc)
    p.close()
    return p


def test_what_the_agent_chose_is_shown_as_text() -> None:
    r, events = _report()
    doc = session_html(r, events)
    p = parse(doc)
    assert [t for t, _ in p.tags].count("script") == 1  # ours, in <head>, and no other
    assert not any(t == "img" for t, _ in p.tags)
    text = "".join(p.text)
    for s in (
        EVIL,
        '/simple/"><img src=x>',
        "/home/agent/'quoted'<b>.txt",
        "index-url = <evil>",
        "</pre><script>alert(2)</script>",
        "the agent <timed out>",
        "apt-get install <x>",
    ):
        assert s in text, s  # fmt: skip
    assert "<script>alert" not in doc and "&lt;script&gt;alert(&#x27;x&#x27;)" in doc


def test_the_file_refers_to_nothing_outside_itself() -> None:
    r, events = _report()
    for doc in (session_html(r, events), _suite_doc()):
        p = parse(doc)
        assert not {t for t, _ in p.tags} & {"link", "img", "iframe", "object", "embed", "base"}
        for tag, attrs in p.tags:
            for name in ("src", "href", "action", "data", "poster", "srcset", "xlink:href"):
                value = attrs.get(name)
                if value is not None:
                    assert value.startswith(("#", "data:")), (tag, name, value)
        code = "".join(p.scripts + p.styles)
        assert "http" not in code and "url(" not in code and "@import" not in code
        assert "fetch(" not in code and "XMLHttpRequest" not in code
        # The only URLs are the agent's own words, as text (the claim quotes one).
        outside = re.sub(r"<[^>]*>", "", doc)
        assert doc.count("http://") + doc.count("https://") == outside.count(
            "http://"
        ) + outside.count("https://")


def test_the_policy_lets_only_our_script_run_and_fetches_nothing() -> None:
    r, events = _report()
    doc = session_html(r, events)
    p = parse(doc)
    csp = next(a["content"] for t, a in p.tags if a.get("http-equiv") == "Content-Security-Policy")
    assert csp == CSP and "default-src 'none'" in csp
    digest = base64.b64encode(hashlib.sha256(p.scripts[0].encode()).digest()).decode()
    assert f"'sha256-{digest}'" in csp
    assert "unsafe-inline" not in csp.split("script-src")[1].split(";")[0]


def test_every_section_is_there_and_nothing_is_cut() -> None:
    r, events = _report()
    doc = session_html(r, events)
    text = "".join(parse(doc).text)
    for heading in (
        "timeline of every attempt, by process",
        "attempts over time",
        "verdicts by category",
        "bytes by destination (proxy)",
        "names asked",
        "connection attempts (destinations)",
        "proxy requests and tunnels",
        "the gateway's exact counters",
        "writes outside the work dir",
        "drift (before → after)",
        "privilege attempts",
        "claims in the final answer",
        "the agent's final answer",
        "every attempt (6 events)",
    ):
        assert heading in text, heading  # fmt: skip
    # Full text: the long rule, the reason's label, the whole sha256, the evidence.
    assert LONG_RULE in text and "a deny rule matches" in text and "ab" * 32 in text
    assert "no HTTP request to example.com was allowed" in text and "FLAGGED" in text
    assert "203.0.113.20" in text and "198.51.100.7:22/tcp" in text
    for word in ("inspected", "passthrough", "70000", "9000", "512"):
        assert word in text, word


def test_the_timeline_draws_every_attempt_in_lanes_by_process() -> None:
    r, events = _report()
    doc = session_html(r, events)
    timeline = doc.split("<h2>timeline of every attempt")[1].split("</svg>")[0]
    lanes = re.findall(r"<text x='4' y='\d+'><title>([^<]*)</title>", timeline)
    assert lanes == ["framework:python3 run.py", "tool:curl", "unattributed"]
    marks = re.findall(r"<(circle|rect) [^>]*fill='(#[0-9a-f]+)'", timeline)
    assert len(marks) == 6  # every DNS, connection and proxy event, not the session event
    assert sorted(marks).count(("rect", "#c62828")) == 2  # the two denials, red squares
    assert ("circle", "#2e7d32") in marks


def test_plots_are_inline_svg() -> None:
    r, events = _report()
    doc = session_html(r, events)
    plots = doc.split("<h2>plots</h2>")[1].split("<h2>")[0]
    assert plots.count("<svg ") == 3
    assert "pypi.org:443: down 70000 bytes" in plots and "files.example:443: up 100" in plots


def _suite_doc() -> str:
    r, events = _report()
    rows = [
        Row(task="T13", mode="locked", outcome="fail", session="s1", names=["pypi.org", EVIL],
            names_denied=[EVIL], connections={"TCP": {"deny": 1}},
            strays=["/home/agent/x"], drift=["pip.conf"], sudo_attempts=1,
            flagged_claims=[{"text": "I downloaded <it>"}],
            attribution={"by_role": {"framework": 1, "tool": 2}}),
        Row(task="C00", mode="open", outcome="pass", session="gone"),
    ]  # fmt: skip
    result = SuiteResult(id="20261201-1", name="report-000", agent="scripted", rows=rows)
    return suite_html(result, {"s1": (r, events)})


def test_the_suite_table_opens_each_session_in_the_same_file() -> None:
    doc = _suite_doc()
    p = parse(doc)
    links = [a["href"] for t, a in p.tags if t == "a"]
    assert links == [f"#{anchor('s1')}"]  # the session not in the store gets no dead link
    details = [a.get("id") for t, a in p.tags if t == "details"]
    assert anchor("s1") in details
    text = "".join(p.text)
    for word in ("T13", "locked", "fail", "pass", "I downloaded <it>", "1/2", "pip.conf", EVIL):
        assert word in text, word
    assert "names asked" in text  # the embedded session report
    ids = [a["id"] for _, a in p.tags if a.get("id")]
    assert len(ids) == len(set(ids))


def test_an_empty_session_still_renders() -> None:
    row = SessionRow("s2", T0, None, None, None, None, None, None, None, [], None, {})
    doc = session_html(build_report(row, [], None), [])
    assert "attempts: none" in doc and "names asked: none" in doc
