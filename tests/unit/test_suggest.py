"""``policy suggest`` (issue 14, part 2) and the overlays it writes (policy/overlay.py).

A session's refused attempts, as events, become an overlay on the session's policy. Each case
checks the text passes the loader, that decide() lets every attempt a rule covers through and
nothing else that was refused, and how names, ports, UDP, the LAN model server, the metadata
endpoint and a shared platform's wildcard are written.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from sandgate.errors import PolicyError
from sandgate.events.schema import Event, Kind
from sandgate.policy.decide import Attempt, decide, decide_name
from sandgate.policy.load import load_policy, parse_policy
from sandgate.policy.model import Mode, Protocol
from sandgate.policy.suggest import suggest

TEST_INTERNET = (ipaddress.ip_network("203.0.113.0/24"), ipaddress.ip_network("198.51.100.0/24"))
BASE = """\
[profiles.dev]
internet = "allowlist"
allow = [ { domain = "files.pythonhosted.org", port = 443 } ]
"""
CURL = {"process": {"exe": "/usr/bin/curl", "pid": 7}}
GIT = {"process": {"exe": "/usr/bin/git", "pid": 8}}


def ev(kind: str, reason: str, **kw: object) -> Event:
    return Event(Kind(kind), verdict="deny", reason=reason, **kw)  # type: ignore[arg-type]


SESSION = [
    ev("dns", "deny.not_allowlisted", name="pypi.org", details=CURL),
    ev("http", "deny.not_allowlisted", name="pypi.org", port=443, protocol="tcp", details=CURL),
    ev("conn", "deny.not_allowlisted", dst="203.0.113.30", port=22, protocol="tcp", details=GIT),
    ev("conn", "deny.not_allowlisted", name="github.com", dst="203.0.113.30", port=9418,
       protocol="tcp", details=GIT),
    ev("conn", "deny.not_allowlisted", dst="198.51.100.10", port=123, protocol="udp"),
    ev("conn", "deny.private", dst="10.77.0.10", port=8000, protocol="tcp", details=CURL),
    ev("http", "deny.metadata", name="169.254.169.254", port=80, protocol="tcp",
       details={**CURL, "method": "GET", "path": "/latest/?…"}),
    ev("dns", "deny.not_allowlisted", name="a.githubusercontent.com", details=CURL),
    ev("dns", "deny.not_allowlisted", name="b.githubusercontent.com", details=CURL),
    ev("conn", "deny.quic", dst="203.0.113.31", port=443, protocol="udp"),
    ev("dns", "deny.rule", name="gist.github.com", rule="dev.deny[0]"),
    ev("dns", "allow.rule", name="files.pythonhosted.org"),  # not a refusal
]


@pytest.fixture
def base(tmp_path: Path) -> Path:
    path = tmp_path / "p.toml"
    path.write_text(BASE)
    return path


def run(base: Path, events: list[Event] = SESSION) -> tuple[str, Path]:
    policy = load_policy(base)
    result = suggest(
        policy, "dev", None, events, session="s1", public_override=TEST_INTERNET,
        extends=str(base),
    )
    out = base.parent / "more.toml"
    out.write_text(result.text)
    return result.text, out


def active(text: str) -> list[str]:
    return [ln.strip().rstrip(",") for ln in text.splitlines() if ln.startswith("  { ")]


def test_names_ports_udp_and_processes(base: Path) -> None:
    text, _ = run(base)
    assert active(text) == [
        '{ domain = "a.githubusercontent.com", port = 443 }',
        '{ domain = "b.githubusercontent.com", port = 443 }',
        '{ domain = "pypi.org", port = 443 }',  # the DNS question and the CONNECT: one rule
        '{ domain = "github.com", port = 9418 }',
        '{ host = "203.0.113.30", port = 22 }',  # no name was asked: by address
        '{ host = "198.51.100.10", port = 123, protocol = "udp" }',
    ]
    # Grouped per process, the unidentified last.
    heads = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("# ---")]
    assert heads == ["# --- /usr/bin/curl ---", "# --- /usr/bin/git ---",
                     "# --- an unidentified process ---"]
    assert "# covers 2 attempt(s): dns pypi.org, tcp pypi.org:443" in text
    assert "port 443 is a guess" in text  # a.githubusercontent.com was only looked up


def test_risky_ones_are_commented_out_with_why(base: Path) -> None:
    text, _ = run(base)
    assert '  # { host = "10.77.0.10", port = 8000 },' in text  # the LAN model server
    assert '  # { host = "169.254.169.254", port = 80 },' in text
    assert "RISKY (the cloud metadata endpoint" in text
    assert "RISKY (10.77.0.10 is private-use network" in text
    assert 'RISKY, not suggested: { domain = "*.githubusercontent.com", port = 443 }' in text
    assert "?…" not in text.split("extends")[1] or "/latest/" in text  # never a query


def test_unliftable_refusals_are_listed_not_suggested(base: Path) -> None:
    text, _ = run(base)
    tail = text.split("# Not suggested", 1)[1]
    assert "deny.quic" in tail and "deny.rule" in tail and "gist.github.com" in tail
    assert "gist.github.com" not in "\n".join(active(text))


def test_output_passes_check_and_lets_through_exactly_what_it_covers(base: Path) -> None:
    text, out = run(base)
    policy = load_policy(out)  # `sandgate policy check more.toml`
    before = load_policy(base).profile("dev", public_override=TEST_INTERNET)
    after = policy.profile("dev", public_override=TEST_INTERNET)
    ip = ipaddress.ip_address

    def attempts(p: object) -> list[bool]:
        return [
            decide_name(p, "pypi.org").allowed,  # type: ignore[arg-type]
            decide(p, Attempt(Protocol.TCP, ip("203.0.113.20"), 443, "pypi.org")).allowed,  # type: ignore[arg-type]
            decide(p, Attempt(Protocol.TCP, ip("203.0.113.30"), 22)).allowed,  # type: ignore[arg-type]
            decide(p, Attempt(Protocol.UDP, ip("198.51.100.10"), 123)).allowed,  # type: ignore[arg-type]
            decide(p, Attempt(Protocol.TCP, ip("10.77.0.10"), 8000)).allowed,  # type: ignore[arg-type]
            decide(p, Attempt(Protocol.TCP, ip("169.254.169.254"), 80)).allowed,  # type: ignore[arg-type]
            decide(p, Attempt(Protocol.UDP, ip("203.0.113.31"), 443)).allowed,  # type: ignore[arg-type]
            decide(p, Attempt(Protocol.TCP, ip("203.0.113.30"), 443)).allowed,  # type: ignore[arg-type]
        ]

    assert attempts(before) == [False] * 8
    assert attempts(after) == [True, True, True, True, False, False, False, False]
    assert "Judged again with these rules: 8 of them pass, 4 stay refused" in text


def test_a_request_rule_refusal_names_the_entry_to_add(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(
        '[profiles.dev]\ninternet = "open"\nallow = [ { host = "10.77.0.10", port = 8000, '
        'name = "model server", http = ["POST /v1/chat/completions"] } ]\n'
    )
    refused = ev("http", "deny.request", name="10.77.0.10", port=8000, protocol="tcp",
                 rule="dev.allow[0] (model server)",
                 details={"method": "POST", "path": "/api/pull?…"})
    text, out = run(path, [refused])
    assert active(text) == []  # never widened silently
    assert 'add "POST /api/pull" to that rule\'s http list' in text
    load_policy(out)


def test_locked_mode_suggests_addresses(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('[profiles.dev]\ninternet = "locked"\n')
    refused = ev("conn", "deny.locked", name="pypi.org", dst="203.0.113.20", port=443,
                 protocol="tcp")
    text, out = run(path, [refused])
    assert active(text) == ['{ host = "203.0.113.20", port = 443 }']
    p = load_policy(out).profile("dev", mode=Mode.LOCKED, public_override=TEST_INTERNET)
    assert decide(p, Attempt(Protocol.TCP, ipaddress.ip_address("203.0.113.20"), 443)).allowed


# -- overlays -----------------------------------------------------------------------------------


def test_overlay_problems_name_the_overlay_line(base: Path) -> None:
    more = base.parent / "more.toml"
    more.write_text(
        'extends = "p.toml"\n[profiles.dev]\nallow = [\n'
        '  { domain = "files.pythonhosted.org", port = 443 },\n'
        '  { domain = "x..org" },\n]\n'
    )
    with pytest.raises(PolicyError) as caught:
        load_policy(more)
    (problem,) = caught.value.problems
    assert (problem.file, problem.line) == (str(more), 5)
    more.write_text(
        'extends = "p.toml"\n[profiles.dev]\nallow = [\n'
        '  { domain = "files.pythonhosted.org", port = 443 },\n]\n'
    )
    with pytest.raises(PolicyError) as caught:
        load_policy(more)
    (problem,) = caught.value.problems
    assert (problem.file, problem.line) == (str(more), 4) and "repeats" in problem.message


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('extends = "p.toml"\ninternet = "open"\n', "holds only extends"),
        ('extends = "p.toml"\n[profiles.other]\nallow = []\n', "no profile 'other'"),
        ('extends = "missing.toml"\n', "does not exist"),
        ('extends = "more.toml"\n', "cannot extend itself"),
        ('extends = "p.toml"\n[profiles.dev]\ninternet = "open"\n', "unknown key"),
    ],
)
def test_overlay_refusals(base: Path, text: str, words: str) -> None:
    more = base.parent / "more.toml"
    more.write_text(text)
    with pytest.raises(PolicyError) as caught:
        load_policy(more)
    assert any(words in p.message for p in caught.value.problems), caught.value


def test_overlay_of_the_builtin_default() -> None:
    policy = parse_policy(
        b'extends = "<built-in default>"\n[profiles.default]\nallow = [ { domain = "x.org" } ]\n',
        "o.toml",
    )
    assert any(r.spec.domain == "x.org" for r in policy.profile().allow)
