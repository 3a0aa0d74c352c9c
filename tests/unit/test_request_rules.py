"""Request rules (issue 14, part 1): ``http = ["METHOD /path"]`` on allow rules.

Parsing and matching (policy/httprules.py), the loader's line-precise errors, ``decide()``'s
step 10 (a request to a destination an allow rule with request rules matches), the proxy's
judge with a request, raw tunnels, forced inspection, and the kernel's interception of a
host:port whose requests are judged (tests/nfteval.py).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import textwrap

import pytest

from sandgate.errors import PolicyError
from sandgate.gateway.proxy.flow import judge
from sandgate.net.compile import GuestLink, base_ruleset, guest_add, guest_remove
from sandgate.policy.decide import Attempt, decide
from sandgate.policy.httprules import RequestRuleError, parse_request_rule
from sandgate.policy.load import parse_policy
from sandgate.policy.model import Protocol, RuleSpec
from sandgate.policy.profile import Profile, Rule
from sandgate.policy.requests import raw_relay, tls_mode
from tests.nfteval import Nft, Packet

A = ipaddress.ip_address
MODEL = A("10.77.0.10")
TCP = Protocol.TCP
TEST_INTERNET = (ipaddress.ip_network("203.0.113.0/24"),)

POLICY = """\
[profiles.p]
internet = "open"
allow = [
  { host = "10.77.0.10", port = 8000, name = "model server", http = ["POST /v1/chat/completions",
    "GET /v1/models"] },
  { domain = "github.com", http = ["GET /*", "HEAD /*"] },
  { domain = "api.github.com", port = 443, http = ["* /repos/*"] },
  { domain = "*.github.com", port = 443 },
]
"""


def profile(text: str = POLICY, **kw: object) -> Profile:
    return parse_policy(textwrap.dedent(text).encode(), "p.toml").profile(
        "p", public_override=TEST_INTERNET, **kw
    )


# -- parsing and matching --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "method", "path", "yes"),
    [
        ("POST /v1/chat/completions", "POST", "/v1/chat/completions", True),
        ("POST /v1/chat/completions", "POST", "/v1/chat/completions?stream=1", True),
        ("POST /v1/chat/completions", "POST", "/v1/chat/completions/x", False),
        ("POST /v1/chat/completions", "GET", "/v1/chat/completions", False),
        ("POST /v1/chat/completions", "post", "/v1/chat/completions", False),  # case matters
        ("GET /v1/*", "GET", "/v1/models", True),
        ("GET /v1/*", "GET", "/v1/", True),
        ("GET /v1/*", "GET", "/v1", False),
        ("GET /v1/*", "GET", "/v1/../api/pull", False),  # dot segments match nothing
        ("GET /v1/*", "GET", "/v1/%2e%2e/api/pull", False),
        ("GET /v1/*", "GET", "/v1/x%2Fy", False),
        ("GET /v1/*", "GET", "/v1\\..\\api", False),
        ("GET /*", "GET", "/anything/at/all?q=1", True),
        ("* /repos/*", "DELETE", "/repos/a/b", True),
        ("GET /", "GET", "/", True),
        ("GET /", "GET", "?x", True),  # an empty path is /
    ],
)
def test_entries_match(text: str, method: str, path: str, yes: bool) -> None:
    assert parse_request_rule(text).matches(method, path) is yes


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("POST/v1/chat", "not METHOD /path"),
        ("POST  /v1", "not METHOD /path"),
        ("POST", "not METHOD /path"),
        ("get /", "did you mean 'GET'"),
        ("FETCH /", "not an HTTP method"),
        ("GET v1/models", "not a path"),
        ("GET /v1/*/x", "not a path"),
        ("GET /a b", "not METHOD /path"),
        ("GET /v1?x=1", "drop everything from ?"),
        ("GET /v1/../api", "dot segment"),
    ],
)
def test_bad_entries_say_how_to_write_them(text: str, words: str) -> None:
    with pytest.raises(RequestRuleError, match=None) as caught:
        parse_request_rule(text)
    assert words in str(caught.value)


# -- loading: line-precise errors ------------------------------------------------------------

BAD = """\
[profiles.p]
internet = "open"
allow = [
  { host = "10.77.0.10", port = 8000, http = ["POST/v1/chat"] },
  { host = "10.77.0.11", port = 53, protocol = "udp", http = ["GET /"] },
  { cidr = "10.77.0.0/24", port = 80, http = ["GET /"] },
  { domain = "y.org", port = 8080, http = ["GET /"] },
  { host = "10.77.0.12", port = 443, http = ["GET /"] },
  { host = "10.77.0.13", port = "8000-8010", http = ["GET /"] },
  { domain = "z.org", http = [] },
]
"""


def test_bad_request_rules_are_located_with_a_fix() -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(BAD.encode(), "bad.toml")
    found = [(p.line, p.message) for p in caught.value.problems]
    assert [line for line, _ in found] == [4, 5, 6, 7, 8, 9, 10], found
    words = [
        "not METHOD /path",
        "HTTP over TCP, but this rule is protocol 'udp'",
        "not a network",
        "HTTP (80) and HTTPS (443) only",
        "HTTPS to a bare address cannot be inspected",
        "one by one",
        "empty http list",
    ]
    for (_, message), w in zip(found, words, strict=True):
        assert w in message, found
    assert "METHOD /path" in (caught.value.problems[0].fix or "")


def test_a_deny_rule_cannot_judge_requests() -> None:
    text = '[profiles.p]\ninternet = "open"\ndeny = [ { domain = "x.org", http = ["GET /"] } ]\n'
    with pytest.raises(PolicyError) as caught:
        parse_policy(text.encode(), "d.toml")
    (problem,) = caught.value.problems
    assert problem.line == 3 and "only an allow rule" in problem.message


def test_default_ports_of_a_request_rule() -> None:
    p = profile(
        '[profiles.p]\nallow = [ { host = "10.77.0.10", http = ["GET /"] },'
        ' { domain = "x.org", http = ["GET /"] } ]\n'
    )
    assert p.allow[0].spec.ports == ((80, 80),)
    assert p.allow[1].spec.ports == ((80, 80), (443, 443))
    assert p.allow[1].spec.protocols == frozenset({TCP})


# -- decide(): step 10 -----------------------------------------------------------------------


def req(address: str | None, port: int, name: str | None, method: str, path: str) -> Attempt:
    return Attempt(TCP, A(address) if address else None, port, name, method, path)


@pytest.mark.parametrize(
    ("attempt", "key"),
    [
        (Attempt(TCP, MODEL, 8000), "allow.exempt"),  # the connection itself
        (req("10.77.0.10", 8000, None, "POST", "/v1/chat/completions"), "allow.exempt"),
        (req("10.77.0.10", 8000, None, "GET", "/v1/models?x=1"), "allow.exempt"),
        (req("10.77.0.10", 8000, None, "POST", "/api/pull"), "deny.request"),
        (req("10.77.0.10", 8000, None, "DELETE", "/api/delete"), "deny.request"),
        (req("10.77.0.10", 8001, None, "POST", "/v1/chat/completions"), "deny.private"),
        # Open mode: a name whose rule judges requests is not opened wider by the mode.
        (req("203.0.113.30", 443, "github.com", "GET", "/x/y.git/info/refs"), "allow.rule"),
        (req("203.0.113.30", 443, "github.com", "POST", "/x/git-receive-pack"), "deny.request"),
        (req(None, 80, "github.com", "PUT", "/"), "deny.request"),
        (req("203.0.113.30", 22, "github.com", "POST", "/"), "allow.open"),  # not its port
        # Two rules for one destination: the one without http allows every request.
        (req("203.0.113.31", 443, "api.github.com", "POST", "/graphql"), "allow.rule"),
        # A destination no request rule speaks to: requests are not judged.
        (req("203.0.113.40", 443, "example.com", "POST", "/"), "allow.open"),
    ],
)
def test_requests_are_judged_by_the_destinations_rules(attempt: Attempt, key: str) -> None:
    assert decide(profile(), attempt).key == key


def test_refusal_names_the_rule_and_never_the_query() -> None:
    d = decide(profile(), req("10.77.0.10", 8000, None, "POST", "/api/pull?token=SECRET"))
    assert d.rule_ref == "p.allow[0] (model server)"
    assert "POST /api/pull" in d.detail and "allows only POST /v1/chat/completions" in d.detail
    assert "SECRET" not in d.explain() and "?" not in d.detail


def test_an_allowed_request_says_which_entry() -> None:
    d = decide(profile(), req("10.77.0.10", 8000, None, "GET", "/v1/models"))
    assert d.allowed and d.detail.endswith(": GET /v1/models")


def with_deny(p: Profile, host: str) -> Profile:
    """A deny rule the loader would call dead (it covers an allow rule), added after it."""
    return dataclasses.replace(p, deny=(Rule("deny", RuleSpec(host=host), "x.deny[0]"),))


def test_a_deny_rule_still_wins_over_a_request_rule() -> None:
    p = with_deny(profile(), "10.77.0.10")
    d = decide(p, req("10.77.0.10", 8000, None, "POST", "/v1/chat/completions"))
    assert d.key == "deny.rule"


# -- the proxy ---------------------------------------------------------------------------------


def test_the_proxy_judges_the_request() -> None:
    p = profile()
    resolve = {"github.com": [A("203.0.113.30")]}.__getitem__
    ok = judge(p, "10.77.0.10", None, 8000, resolve, ("POST", "/v1/chat/completions"))
    assert ok.decision.allowed and ok.address == MODEL
    pull = judge(p, "10.77.0.10", None, 8000, resolve, ("POST", "/api/pull"))
    assert pull.decision.key == "deny.request" and pull.address is None
    push = judge(p, "github.com", None, 443, resolve, ("POST", "/git-receive-pack"))
    assert push.decision.key == "deny.request" and push.address is None
    assert judge(p, "github.com", None, 443, resolve, ("GET", "/")).decision.allowed


def test_a_raw_tunnel_would_hide_requests_and_is_refused() -> None:
    p = profile()
    conn = decide(p, Attempt(TCP, MODEL, 8000))
    assert conn.allowed
    refused = raw_relay(p, conn, None, MODEL, 8000)
    assert refused.key == "deny.request" and "raw tunnel" in refused.detail
    # Where another rule allows every request, or none judges them, the tunnel is fine.
    api = decide(p, Attempt(TCP, A("203.0.113.31"), 443, "api.github.com"))
    assert raw_relay(p, api, "api.github.com", A("203.0.113.31"), 443).allowed
    other = decide(p, Attempt(TCP, A("203.0.113.40"), 443, "example.com"))
    assert raw_relay(p, other, "example.com", A("203.0.113.40"), 443).allowed


def test_https_to_a_name_with_request_rules_is_inspected() -> None:
    p = profile()
    assert p.inspects("github.com") and p.forced_inspection("github.com") is p.allow[1]
    assert not p.inspects("gist.github.com")
    d = decide(p, Attempt(TCP, A("203.0.113.30"), 443, "github.com"))
    assert tls_mode(p, d, "github.com") == "inspect"
    port80 = profile(
        '[profiles.p]\ninternet = "open"\n'
        'allow = [ { domain = "x.org", port = 80, http = ["GET /"] } ]\n'
    )
    assert not port80.inspects("x.org")  # its HTTPS is not judged by the rule


# -- the kernel: the host:port goes to the proxy's HTTP door ------------------------------------

LINK = GuestLink.from_pool(ipaddress.ip_network("10.201.0.0/16"), 3, "02:00:00:00:00:03")


def nft(p: Profile) -> Nft:
    base, base_sites = base_ruleset("up0", p.guest_pool, public_override=TEST_INTERNET)
    cmds, sites = guest_add(LINK, p)
    return Nft(base + cmds, {**base_sites, **sites}, LINK)


def test_the_judged_port_is_intercepted_and_only_it() -> None:
    p = profile(gateway_address=LINK.gateway)
    ruleset = nft(p)
    assert ruleset.evaluate(Packet(MODEL, "tcp", 8000)) == ("proxy", None)
    assert ruleset.evaluate(Packet(MODEL, "tcp", 8001))[0] == "deny"
    assert ruleset.evaluate(Packet(MODEL, "udp", 8000))[0] == "deny"


def test_no_interception_where_requests_are_not_judged() -> None:
    # Another rule allows every request to the same host:port; and a denied host is dropped.
    both = profile(
        '[profiles.p]\nallow = [ { host = "10.77.0.10", port = 8000, http = ["GET /"] },'
        ' { cidr = "10.77.0.0/24", port = 8000 } ]\n',
        gateway_address=LINK.gateway,
    )
    assert nft(both).evaluate(Packet(MODEL, "tcp", 8000)) == ("accept", "allow.exempt")
    denied = with_deny(profile(gateway_address=LINK.gateway), "10.77.0.10")
    assert nft(denied).evaluate(Packet(MODEL, "tcp", 8000)) == ("deny", "deny.rule")


def test_removing_the_guest_removes_its_interception() -> None:
    p = profile(gateway_address=LINK.gateway)
    cmds, sites = guest_add(LINK, p)
    removed = guest_remove(LINK, sites.values(), p)
    added = [c["add"]["element"] for c in cmds if "element" in c.get("add", {})]
    gone = [c["delete"]["element"] for c in removed if "element" in c.get("delete", {})]
    intercept = [e for e in added if e["name"] == "intercept4"]
    assert intercept and intercept[0]["elem"] == [{"concat": ["g3", "10.77.0.10", 8000]}]
    assert [e for e in gone if e["name"] == "intercept4"] == intercept


def test_explain_names_the_request_rules_and_the_forced_inspection() -> None:
    from sandgate.explain import explain

    p = profile()
    resolve = {"github.com": [A("203.0.113.30")], "api.github.com": [A("203.0.113.31")]}
    model = explain(p, "10.77.0.10:8000", resolve=resolve.__getitem__).as_json()
    assert model["requests"] == ["POST /v1/chat/completions", "GET /v1/models"]
    assert model["inspected"] is None
    gh = explain(p, "github.com:443", resolve=resolve.__getitem__).as_json()
    assert gh["requests"] == ["GET /*", "HEAD /*"] and "forced by p.allow[1]" in gh["inspected"]
    # Another rule allows every request to api.github.com: nothing judges them.
    assert explain(p, "api.github.com:443", resolve=resolve.__getitem__).requests == []


@pytest.mark.parametrize("exporter", ["cilium", "k8s"])
def test_the_exports_say_they_widen_request_and_process_rules(exporter: str) -> None:
    import importlib

    export_profile = importlib.import_module(f"sandgate.export.{exporter}").export_profile
    text = (
        '[profiles.p]\ninternet = "allowlist"\nallow = [\n'
        '  { domain = "github.com", http = ["GET /*"] },\n'
        '  { domain = "pypi.org", process = ["/usr/bin/pip"] },\n]\n'
    )
    export = export_profile(parse_policy(text.encode(), "p.toml"), "p")
    got = {(w.feature, w.effect, w.line) for w in export.warnings}
    assert {("request-rules", "widened", 4), ("process-rules", "widened", 5)} <= got
