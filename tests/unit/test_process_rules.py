"""Process rules (issue 14, part 3): ``process = ["/usr/bin/git"]`` on a domain allow rule.

decide() with the proxy's identity (``by_process``, ``exe``): only the named executables, an
unidentified process never; the loader's errors; such names go through the proxy (the
resolver's pins, the TLS gate); the table the holds fill for the proxy.
"""

from __future__ import annotations

import ipaddress
import threading

import pytest

from sandgate.errors import PolicyError
from sandgate.gateway.logs.prochold import ProcessTable
from sandgate.gateway.proxy.flow import ProxyGuest, judge
from sandgate.net.compile import GuestLink
from sandgate.policy.decide import Attempt, decide
from sandgate.policy.load import parse_policy
from sandgate.policy.model import Protocol
from sandgate.policy.profile import Profile
from sandgate.policy.requests import gate_verdict

GH = ipaddress.ip_address("203.0.113.30")
TCP = Protocol.TCP
GIT = "/usr/lib/git-core/git-remote-http"
POLICY = f"""\
[profiles.p]
internet = "open"
allow = [
  {{ domain = "github.com", process = ["{GIT}"] }},
  {{ domain = "*.github.com", port = 443, process = ["/usr/bin/gh"] }},
  {{ domain = "api.github.com", port = 443 }},
]
"""


def profile(text: str = POLICY) -> Profile:
    return parse_policy(text.encode(), "p.toml").profile(
        "p", public_override=(ipaddress.ip_network("203.0.113.0/24"),)
    )


def at(name: str, port: int, exe: str | None, by: bool = True) -> Attempt:
    return Attempt(TCP, GH, port, name, by_process=by, exe=exe)


@pytest.mark.parametrize(
    ("attempt", "key"),
    [
        (at("github.com", 443, GIT), "allow.rule"),
        (at("github.com", 80, GIT), "allow.rule"),
        (at("github.com", 443, "/usr/bin/curl"), "deny.process"),
        (at("github.com", 443, None), "deny.process"),  # unidentified: never matches
        (at("github.com", 443, None, by=False), "allow.rule"),  # the kernel, DNS: not asked
        (at("github.com", 22, "/usr/bin/curl"), "allow.open"),  # not the rule's port
        (at("gist.github.com", 443, "/usr/bin/gh"), "allow.rule"),
        (at("gist.github.com", 443, "/usr/bin/curl"), "deny.process"),
        (at("api.github.com", 443, "/usr/bin/curl"), "allow.rule"),  # a rule for every program
        (at("example.com", 443, "/usr/bin/curl"), "allow.open"),
    ],
)
def test_only_the_named_programs(attempt: Attempt, key: str) -> None:
    assert decide(profile(), attempt).key == key


def test_refusal_names_the_program_and_the_rule() -> None:
    d = decide(profile(), at("github.com", 443, "/usr/bin/curl"))
    assert d.rule_ref == "p.allow[0] (github.com:80,443)"
    assert d.detail == f"/usr/bin/curl: p.allow[0] (github.com:80,443) is for {GIT}"
    d = decide(profile(), at("github.com", 443, None))
    assert "could not be identified" in d.detail


def test_request_and_process_rules_together() -> None:
    p = profile(
        '[profiles.p]\ninternet = "open"\nallow = [ { domain = "github.com", '
        f'process = ["{GIT}"], http = ["GET /*"] }} ]\n'
    )
    req = Attempt(TCP, GH, 443, "github.com", "POST", "/x", True, GIT)
    assert decide(p, req).key == "deny.request"
    ok = Attempt(TCP, GH, 443, "github.com", "GET", "/x", True, GIT)
    assert decide(p, ok).allowed
    curl = Attempt(TCP, GH, 443, "github.com", "GET", "/x", True, "/usr/bin/curl")
    assert decide(p, curl).key == "deny.process"


@pytest.mark.parametrize(
    ("rule", "words"),
    [
        ('{ domain = "github.com", process = ["git"] }', "not an absolute path"),
        ('{ domain = "github.com", process = ["/usr/bin/"] }', "not an absolute path"),
        ('{ domain = "github.com", process = [] }', "empty process list"),
        ('{ host = "203.0.113.30", port = 443, process = ["/usr/bin/git"] }', "names a domain"),
        ('{ domain = "github.com", port = 22, process = ["/usr/bin/git"] }', "git over ssh"),
        ('{ domain = "x.org", protocol = "udp", process = ["/usr/bin/git"] }', "for TCP"),
    ],
)
def test_bad_process_rules_are_located(rule: str, words: str) -> None:
    text = f'[profiles.p]\ninternet = "open"\nallow = [\n  {rule},\n]\n'
    with pytest.raises(PolicyError) as caught:
        parse_policy(text.encode(), "p.toml")
    (problem,) = caught.value.problems
    assert problem.line == 4 and words in problem.message, problem


def test_such_names_go_through_the_proxy() -> None:
    p = profile()
    assert p.proxied("github.com") and p.proxied("gist.github.com")
    assert not p.inspects("github.com")  # passed through, not inspected
    assert not p.proxied("example.com")
    # Reached at an address the resolver did not hand out, the kernel's TLS gate refuses it.
    d = decide(p, Attempt(TCP, GH, 443, "github.com"))
    assert d.allowed and not gate_verdict(p, d, "github.com").allowed
    assert gate_verdict(p, decide(p, Attempt(TCP, GH, 443, "example.com")), "example.com").allowed


def test_the_proxy_asks_only_when_a_rule_needs_it() -> None:
    link = GuestLink.from_pool(ipaddress.ip_network("10.201.0.0/16"), 3, "02:00:00:00:00:03")
    asked: list[object] = []

    def identify(key: object) -> tuple[str | None, tuple[str, ...]]:
        asked.append(key)
        return "/usr/bin/curl", ("/usr/bin/dash",)

    guest = ProxyGuest(link, None, profile(), (), identify)
    who = guest.who(("g3", "tcp", 40000, "203.0.113.30", 443))
    assert who == ("/usr/bin/curl", ("/usr/bin/dash",)) and len(asked) == 1
    j = judge(guest.profile, "github.com", None, 443, lambda n: [GH], process=who)
    assert j.decision.key == "deny.process" and j.address is None
    plain = ProxyGuest(link, None, profile('[profiles.p]\ninternet = "open"\n'), (), identify)
    assert plain.who(("g3", "tcp", 40001, "203.0.113.30", 443)) is None and len(asked) == 1
    unknown = ProxyGuest(link, None, profile(), (), None)  # no process hold
    assert unknown.who(("g3", "tcp", 40002, "203.0.113.30", 443)) == (None, ())


def test_process_table_waits_briefly_and_stays_bounded() -> None:
    table = ProcessTable(size=2)
    key = ("g3", "tcp", 1, "203.0.113.30", 443)
    threading.Timer(0.05, table.put, (key, {"exe": GIT})).start()
    assert table.exe(key, wait=5) == GIT
    assert table.exe(("g3", "tcp", 2, "x", 1), wait=0.01) is None
    table.put(("g3", "tcp", 2, "x", 1), None)
    table.put(("g3", "tcp", 3, "x", 1), {"exe": "/usr/bin/curl", "parents": [PY, "/usr/bin/dash"]})
    assert table.exe(key, wait=0) is None  # the oldest went
    assert table.identity(("g3", "tcp", 3, "x", 1)) == ("/usr/bin/curl", (PY, "/usr/bin/dash"))
    assert table.identity(("g3", "tcp", 2, "x", 1)) == (None, ())


def test_a_leaving_guests_flows_are_forgotten() -> None:
    """A later guest given the link (and address) must not find the first one's executable
    for a flow with the same ports."""
    table = ProcessTable()
    mine, other = ("g3", "tcp", 40001, "203.0.113.30", 443), ("g4", "tcp", 40001, "x", 443)
    table.put(mine, {"exe": GIT})
    table.put(other, {"exe": GIT})
    table.forget("g3")
    assert table.identity(mine, wait=0) == (None, ())
    assert table.exe(other, wait=0) == GIT


PY = "/usr/bin/python3.11"
UNDER = f"""\
[profiles.p]
internet = "allowlist"
allow = [
  {{ domain = "pypi.org", port = 443, process = ["/usr/bin/curl"], under = ["{PY}"] }},
  {{ domain = "github.com", process = ["{GIT}"], under = ["/usr/bin/git", "{PY}"] }},
]
"""


@pytest.mark.parametrize(
    ("name", "exe", "parents", "key"),
    [
        ("pypi.org", "/usr/bin/curl", (PY,), "allow.rule"),  # run by the framework itself
        ("pypi.org", "/usr/bin/curl", (PY, "/usr/bin/bash"), "allow.rule"),  # nearest first
        ("pypi.org", "/usr/bin/curl", ("/usr/bin/dash", PY), "deny.process"),  # by a shell
        ("pypi.org", "/usr/bin/curl", (), "deny.process"),  # no parent known
        ("pypi.org", "/usr/bin/wget", (PY,), "deny.process"),
        ("github.com", GIT, ("/usr/bin/git", PY), "allow.rule"),
        ("github.com", GIT, ("/usr/bin/git", "/usr/bin/dash", PY), "deny.process"),
        ("github.com", GIT, ("/usr/bin/git",), "deny.process"),  # the chain is shorter
    ],
)
def test_under_names_the_nearest_parents(
    name: str, exe: str, parents: tuple[str, ...], key: str
) -> None:
    p = profile(UNDER)
    d = decide(p, Attempt(TCP, GH, 443, name, by_process=True, exe=exe, parents=parents))
    assert d.key == key, d
    if key == "deny.process":
        assert "under" in d.detail and (not parents or f"under {parents[0]}" in d.detail)


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ('{ domain = "pypi.org", under = ["/usr/bin/python3"] }', "add process"),
        ('{ domain = "pypi.org", process = ["/usr/bin/curl"], under = [] }', "empty under"),
        ('{ domain = "pypi.org", process = ["/usr/bin/curl"], under = ["python3"] }', "absolute"),
    ],
)
def test_a_wrong_under_names_its_line(rule: str, message: str) -> None:
    text = f'[profiles.p]\ninternet = "allowlist"\nallow = [\n  {rule},\n]\n'
    with pytest.raises(PolicyError) as exc:
        parse_policy(text.encode(), "p.toml")
    assert message in str(exc.value) and "p.toml:4" in str(exc.value), str(exc.value)


def test_a_missing_executable_is_a_warning_with_its_line() -> None:
    text = (
        '[profiles.p]\ninternet = "open"\n'
        'allow = [\n  { domain = "x.org", process = ["/usr/bin/gti"] },\n]\n'
    )
    policy = parse_policy(text.encode(), "p.toml")
    (w,) = policy.warnings(exists=lambda p: p != "/usr/bin/gti")
    assert w.line == 4 and "/usr/bin/gti does not exist" in w.message
    assert policy.warnings(exists=lambda p: True) == []
