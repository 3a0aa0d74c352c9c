"""Loading policy files: every mistake is a ``PolicyError`` naming its line, column and a fix.

Each case is a small policy file and the problems it must produce, in file order, as
``(line, column, words of the message, words of the fix)``. A column of ``None`` means the
loader cannot know one (the file ends too early, a rule problem found across rules).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandgate.errors import PolicyError, PolicyProblem
from sandgate.policy.load import BUILTIN, load_policy, parse_policy, parse_rule_text
from sandgate.policy.model import Mode, Protocol

TCP, UDP, ICMP = Protocol.TCP, Protocol.UDP, Protocol.ICMP


@dataclass(frozen=True)
class Want:
    line: int | None
    column: int | None
    message: str  # a part of the message
    fix: str = ""  # a part of the fix


def problems(text: str | bytes, source: str = "policy.toml") -> list[PolicyProblem]:
    data = textwrap.dedent(text).encode() if isinstance(text, str) else text
    with pytest.raises(PolicyError) as caught:
        parse_policy(data, source)
    return caught.value.problems


def check(found: list[PolicyProblem], wanted: list[Want]) -> None:
    shown = "\n".join(str(p) for p in found)
    assert [(p.line, p.column) for p in found] == [(w.line, w.column) for w in wanted], shown
    for p, w in zip(found, wanted, strict=True):
        assert w.message in p.message, shown
        assert w.fix in (p.fix or ""), shown
        assert p.file == "policy.toml"


CASES = [
    pytest.param(
        """\
        [profiles.coder]
        internet = "open"
        allow = [ { domain = "pypi.org" } }
        """,
        [Want(3, 35, "TOML syntax: Unclosed array", "fix the syntax")],
        id="toml-syntax",
    ),
    pytest.param(
        """\
        [profiles.coder]
        allow = [
          { domain = "pypi.org" },

        """,
        [Want(3, None, "the file ends too early", "fix the syntax")],
        id="toml-unclosed-array-at-end",
    ),
    pytest.param(
        """\
        [profiles.coder]
        internet = "open"
        [profiles.coder]
        """,
        [Want(3, 16, "Cannot declare ('profiles', 'coder') twice")],
        id="toml-table-twice",
    ),
    pytest.param(
        """\
        alow = [ { domain = "pypi.org" } ]
        [profiles.coder]
        """,
        [Want(1, 1, "unknown key 'alow'", "known keys here: expose, gateway, profiles, version")],
        id="unknown-top-level",
    ),
    pytest.param(
        """\
        [profiles.coder]
        internet = "open"
        alow = [ { domain = "pypi.org" } ]
        """,
        [Want(3, 1, "unknown key 'profiles.coder.alow'", "did you mean 'allow'?")],
        id="unknown-in-profile",
    ),
    pytest.param(
        """\
        [profiles.coder]
        allow = [
          { host = "10.77.0.10", prot = 8000 },
        ]
        """,
        [Want(3, 26, "unknown key 'profiles.coder.allow.0.prot'", "did you mean 'port'?")],
        id="unknown-in-rule",
    ),
    pytest.param(
        """\
        [gateway]
        defualt_profile = "coder"
        [profiles.coder]
        """,
        [Want(2, 1, "unknown key 'gateway.defualt_profile'", "did you mean 'default_profile'?")],
        id="unknown-in-gateway",
    ),
    pytest.param(
        """\
        [profiles.coder]
        [[profiles.coder.secret]]
        name = "openai"
        hosts = ["api.openai.com"]
        value = "env:OPENAI_API_KEY"
        placholder_env = "OPENAI_API_KEY"
        """,
        [Want(6, 1, "unknown key", "did you mean 'placeholder_env'?")],
        id="unknown-in-secret",
    ),
    pytest.param(
        """\
        [profiles.coder]
        allow = [
          { domain = "a.example.com", port = "abc" },
          { domain = "b.example.com", port = 0 },
          { domain = "c.example.com", port = 70000 },
          { domain = "d.example.com", port = "9000-8000" },
          { domain = "e.example.com", port = "9000-" },
          { domain = "f.example.com", port = [] },
          { domain = "g.example.com", port = [443, 0] },
        ]
        """,
        [
            Want(3, 31, "port 'abc' is not a number", "a rule is"),
            Want(4, 31, "port 0 is outside 1-65535", "a rule is"),
            Want(5, 31, "port 70000 is outside 1-65535", "a rule is"),
            Want(6, 31, "port '9000-8000' is outside 1-65535 (or the range is reversed)"),
            Want(7, 31, "must look like '8000-8100'"),
            Want(8, 31, "an empty port list matches nothing; drop 'port'"),
            Want(9, 31, "port 0 is outside"),
        ],
        id="ports",
    ),
    pytest.param(
        # One wrong value is one problem, not one per member of the type union; `true` is
        # not port 1.
        """\
        [profiles.coder]
        allow = [
          { domain = "a.example.com", port = true },
          { domain = "b.example.com", port = 80.5 },
          { domain = "c.example.com", port = [[80]] },
        ]
        """,
        [
            Want(3, 31, "port True must be a number from 1 to 65535"),
            Want(4, 31, "port 80.5 must be a number"),
            Want(5, 31, "port [[80]] must be a number"),
        ],
        id="port-types",
    ),
    pytest.param(
        """\
        [profiles.coder]
        allow = [
          { cidr = "10.0.0.0/33" },
          { cidr = "10.0.0.1/24" },
          { cidr = "10.77.0.0" },
          { host = "10.0.0.0/8" },
        ]
        """,
        [
            Want(3, 5, "'10.0.0.0/33' is not a network", "a rule is"),
            Want(4, 5, "'10.0.0.1/24' has host bits set; did you mean 10.0.0.0/24?"),
            Want(6, 5, 'is a network, not one address; write cidr = "10.0.0.0/8"'),
        ],
        id="cidrs",
    ),
    pytest.param(
        """\
        [profiles.coder]
        allow = [
          { host = "10.77.0.10", cidr = "10.77.0.0/24", port = 8000 },
          { port = 8000, name = "model server" },
          { domain = "pypi.org", host = "151.101.0.223" },
        ]
        """,
        [
            Want(3, 3, "exactly one of host, cidr or domain (it has host, cidr)", "a rule is"),
            Want(4, 3, "a rule needs exactly one of host, cidr or domain", "a rule is"),
            Want(5, 3, "(it has host, domain)"),
        ],
        id="targets",
    ),
    pytest.param(
        """\
        [profiles.coder]
        allow = [
          { domain = "*.com" },
          { domain = "a.*.com" },
          { domain = "api.*" },
          { host = "pypi.org" },
          { domain = "151.101.0.223" },
          { domain = "pypi..org" },
        ]
        inspect = ["*.org"]
        """,
        [
            Want(3, 5, "'*.com' would match a whole top-level domain", "a rule is"),
            Want(4, 5, "a wildcard may only be the whole leftmost label"),
            Want(5, 5, "a wildcard may only be the whole leftmost label"),
            Want(6, 5, "'pypi.org' is a name, not an address; write domain = \"pypi.org\""),
            Want(7, 5, "'151.101.0.223' is an IP address; write it as host = \"151.101.0.223\""),
            Want(8, 5, "'pypi..org' is not a domain name"),
            Want(10, 1, "'*.org' would match a whole top-level domain"),
        ],
        id="patterns-and-kinds",
    ),
    pytest.param(
        """\
        [profiles.coder]
        internet = "opne"
        allow = [ { domain = "pypi.org", protocol = "tpc" } ]
        """,
        [
            Want(2, 1, "internet = 'opne' is not allowed", "'locked', 'open' or 'allowlist'"),
            Want(3, 34, "protocol = 'tpc' is not allowed", "'tcp', 'udp', 'icmp' or 'any'"),
        ],
        id="enums",
    ),
    pytest.param(
        """\
        [profiles.coder]
        allow = [ { domain = "pypi.org", port = 443, protocol = "icmp" } ]
        """,
        [Want(2, 11, "ICMP has no ports")],
        id="icmp-with-port",
    ),
    pytest.param(
        """\
        [profiles.coder]
        allow = [
          { domain = "pypi.org" },
          { domain = "PyPI.org.", name = "same name, other spelling" },
          { host = "10.77.0.10", port = 8000 },
          { host = "0x0a.77.0.10", port = [8000] },
          { host = "::ffff:10.77.0.10", port = "8000-8000" },
        ]
        deny = [ { cidr = "169.254.0.0/16" }, { cidr = "169.254.0.0/16", port = 80 } ]
        """,
        [
            Want(4, 3, "coder.allow[1] (same name, other spelling) repeats coder.allow[0]"),
            Want(6, 3, "coder.allow[3] (10.77.0.10:8000) repeats coder.allow[2]", "delete one"),
            Want(7, 3, "coder.allow[4] (10.77.0.10:8000) repeats coder.allow[2]"),
        ],
        id="duplicates",
    ),
    pytest.param(
        """\
        [profiles.coder]
        allow = [
          { domain = "api.github.com" },
          { domain = "*.api.github.com", port = 443 },
          { domain = "github.com" },
          { cidr = "10.77.0.0/24" },
          { host = "10.77.0.10", port = 8000 },
          { host = "192.168.1.5", port = 443 },
          { host = "192.168.2.6", port = 443 },
          { host = "192.168.2.7", port = 22, protocol = "udp" },
        ]
        deny = [
          { domain = "*.github.com" },
          { cidr = "10.0.0.0/8" },
          { cidr = "192.168.1.0/24", port = "1-1024" },
          { cidr = "192.168.2.0/24", port = 22 },
        ]
        """,
        [
            Want(3, 3, "coder.allow[0] (api.github.com) can never match: coder.deny[0]", "remove"),
            Want(4, 3, "coder.allow[1] (*.api.github.com:443) can never match: coder.deny[0]"),
            # github.com itself is not under *.github.com: allow[2] stays.
            Want(6, 3, "coder.allow[3] (10.77.0.0/24) can never match: coder.deny[1]"),
            Want(7, 3, "coder.allow[4] (10.77.0.10:8000) can never match: coder.deny[1]"),
            Want(8, 3, "coder.allow[5] (192.168.1.5:443) can never match: coder.deny[2]"),
            # allow[6] is port 443, the deny only 22; allow[7] is udp, the deny only tcp.
        ],
        id="dead-allow-rules",
    ),
    pytest.param(
        """\
        public_override = ["203.0.113.0/24"]
        [profiles.coder]
        test_internet = true
        allow = [ { cidr = "203.0.113.0/24", public_override = true } ]
        """,
        [
            Want(1, 1, "'public_override' is set by sandgate's test world only", "allow rule"),
            Want(3, 1, "'test_internet' is set by sandgate's test world only"),
            Want(4, 38, "'public_override' is set by sandgate's test world only"),
        ],
        id="world-only-keys",
    ),
    pytest.param(
        """\
        [gateway]
        default_profile = "codr"
        [profiles.coder]
        [profiles.reviewer]
        """,
        [Want(2, 1, "'codr' is not a profile here; choose one of coder, reviewer", "profiles")],
        id="unknown-default-profile",
    ),
    pytest.param(
        """\
        [profiles]
        """,
        [Want(1, 2, "a policy needs at least one profile", "[profiles.default]")],
        id="no-profiles",
    ),
    pytest.param(
        """\
        [profiles.coder]
        [[profiles.coder.secret]]
        name = "openai"
        hosts = ["api.openai.com"]
        value = "sk-proj-abc123"
        """,
        [Want(5, 1, "a secret's value must say where the gateway reads it", 'value = "env:')],
        id="secret-value-inline",
    ),
    pytest.param(
        """\
        version = 2
        [gateway]
        guest_pool = "10.201.0.0/33"
        upstream_dns = ["dns.google"]
        uplink_subnet = "fd00::/64"
        [profiles.coder]
        """,
        [
            Want(1, 1, "version = 2 is not allowed", "use one of 1"),
            Want(3, 1, "gateway.guest_pool: '10.201.0.0/33' is not a network"),
            Want(4, 1, "'dns.google' is not an IP address of a DNS server"),
            Want(5, 1, "uplink_subnet is not used", "delete this line"),
        ],
        id="gateway",
    ),
    pytest.param(
        """\
        [gateway]
        guest_pool = "fd00::/64"
        [profiles.coder]
        """,
        [Want(2, 1, "sandgate routes IPv4 only")],
        id="gateway-pool-v6",
    ),
    pytest.param(
        """\
        [gateway]
        guest_pool = "10.202.0.0/29"
        [profiles.coder]
        """,
        [Want(2, 1, "has room for 2 /30s; each guest takes one", "10.201.0.0/16")],
        id="gateway-pool-too-small",
    ),
    pytest.param(
        """\
        [gateway]
        guest_pool = "10.202.0.0/16"
        [profiles.coder]
        allow = [
          { cidr = "10.0.0.0/8" },
          { host = "10.202.0.6", port = 8080 },
          { cidr = "10.202.3.0/24" },
        ]
        """,
        [
            Want(6, 3, "names addresses in the guest pool 10.202.0.0/16", "move the pool"),
            Want(7, 3, "names addresses in the guest pool"),
        ],
        id="gateway-pool-exempted",
    ),
]


@pytest.mark.parametrize(("text", "wanted"), CASES)
def test_mistakes_are_located(text: str, wanted: list[Want]) -> None:
    check(problems(text), wanted)


def test_every_problem_at_once_in_file_order() -> None:
    found = problems(
        """\
        [gateway]
        upstream_dns = ["not-an-address"]
        guest_pool = "10.0.0.1/16"

        [profiles.coder]
        internet = "opne"
        allow = [
          { domain = "*.com" },
          { host = "10.77.0.10", port = 0 },
        ]

        [profiles.reviewer]
        alow = []
        deny = [ { cidr = "10.0.0.0/33" } ]
        """
    )
    check(
        found,
        [
            Want(2, 1, "'not-an-address' is not an IP address"),
            Want(3, 1, "has host bits set; did you mean 10.0.0.0/16?"),
            Want(6, 1, "internet = 'opne'"),
            Want(8, 5, "'*.com'"),
            Want(9, 26, "port 0"),
            Want(13, 1, "unknown key 'profiles.reviewer.alow'", "did you mean 'allow'?"),
            Want(14, 12, "'10.0.0.0/33' is not a network"),
        ],
    )
    assert str(found[0]).startswith("policy.toml:2:1: ")


def test_rule_problems_of_every_profile_at_once() -> None:
    found = problems(
        """\
        [profiles.a]
        allow = [ { domain = "x.example.com" }, { domain = "x.example.com" } ]
        [profiles.b]
        allow = [ { domain = "api.github.com" } ]
        deny = [ { domain = "*.github.com" } ]
        """
    )
    check(found, [Want(2, 41, "a.allow[1]"), Want(4, 11, "b.allow[0] (api.github.com)")])


# Where keys are written in unusual ways: quoted, dotted, arrays of tables, comments.
LOCATION_CASES = [
    pytest.param(
        """\
        [profiles."my coder"]
        allow = [ { domain = "pypi..org" } ]
        """,
        Want(2, 13, "profiles.my coder.allow.0.domain"),
        id="quoted-profile-name",
    ),
    pytest.param(
        """\
        [profiles.'a.b']
        allow = [ { domain = "x.example.com" }, { domain = "x.example.com" } ]
        """,
        Want(2, 41, "a.b.allow[1] (x.example.com) repeats a.b.allow[0]"),
        id="profile-name-with-a-dot",
    ),
    pytest.param(
        """\
        profiles.coder.internet = "open"
        profiles.coder.allow = [ { domain = "pypi.org", "port" = "x" } ]
        """,
        Want(2, 49, "port 'x' is not a number"),
        id="dotted-keys",
    ),
    pytest.param(
        """\
        [profiles]
        coder.allow = [ { domain = "pypi.org" }, { host = "10.0.0.1/8" } ]
        """,
        Want(2, 44, 'is a network, not one address; write cidr = "10.0.0.1/8"'),
        id="dotted-key-inside-table",
    ),
    pytest.param(
        """\
        [profiles.coder]
        allow = [
          # the model server on the LAN
          { host = "10.77.0.10", port = 8000 },
          # a comment is not an element: the next rule is allow[1], on line 6
          { domain = "pypi..org" },
        ]
        """,
        Want(6, 5, "profiles.coder.allow.1.domain"),
        id="comments-inside-an-array",
    ),
    pytest.param(
        """\
        [[profiles.coder.allow]]
        domain = "pypi.org"

        [[profiles.coder.allow]]
        domain = "files.pythonhosted.org"
        prot = 443
        """,
        Want(6, 1, "unknown key 'profiles.coder.allow.1.prot'", "did you mean 'port'?"),
        id="array-of-tables-rules",
    ),
    pytest.param(
        """\
        [profiles.coder]  # comment
        [[profiles.coder.secret]]
        name = "a"
        hosts = ["api.openai.com"]
        value = "env:A"
        [profiles.reviewer]
        [[profiles.coder.secret]]   # the second secret of coder, after another table
        name = "b"
        hosts = ["api.anthropic.com"]
        value = "plain-text"
        """,
        Want(10, 1, "profiles.coder.secret.1.value"),
        id="array-of-tables-secret-resumed",
    ),
    pytest.param(
        """\
        [[profiles.coder.allow]]
        domain = "a.example.com"
        [[profiles.coder.allow]]
        domain = "b.example.com"
        [[profiles.coder.allow]]
        domain = "a.example.com"
        """,
        Want(5, 3, "coder.allow[2] (a.example.com) repeats coder.allow[0]"),
        id="array-of-tables-duplicate",
    ),
]


@pytest.mark.parametrize(("text", "wanted"), LOCATION_CASES)
def test_unusual_key_spellings_are_located(text: str, wanted: Want) -> None:
    check(problems(text), [wanted])


def test_not_utf8_names_the_spot() -> None:
    found = problems(b'[profiles.coder]\ndescription = "caf\xe9"\n')
    assert [(p.line, p.column) for p in found] == [(2, 19)]
    assert "not UTF-8" in found[0].message
    assert found[0].fix == "save the file as UTF-8"


def test_missing_file_is_an_error_never_the_open_default(tmp_path: Path) -> None:
    missing = tmp_path / "polcy.toml"
    with pytest.raises(PolicyError) as caught:
        load_policy(missing)
    [problem] = caught.value.problems
    assert problem.file == str(missing)
    assert problem.message == "the policy file does not exist"
    assert "never falls back" in (problem.fix or "")


def test_unreadable_path_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(PolicyError) as caught:
        load_policy(tmp_path)  # a directory
    assert "cannot read the policy file" in caught.value.problems[0].message


def test_a_broken_named_file_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('[profiles.coder]\ninternet = "open"\nallow = [ { domain = "*.com" } ]\n')
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    assert [(p.file, p.line) for p in caught.value.problems] == [(str(path), 3)]


def test_only_no_file_at_all_means_the_builtin_default() -> None:
    policy = load_policy(None)
    assert policy.builtin and policy.source == BUILTIN
    profile = policy.profile()
    assert (profile.name, profile.mode, profile.allow, profile.deny) == (
        "default",
        Mode.OPEN,
        (),
        (),
    )


def test_the_test_world_policy_loads() -> None:
    path = Path(__file__).parents[2] / "src/sandgate/world/testworld.toml"
    profile = load_policy(path).profile()
    assert profile.name == "agent"
    assert [str(r) for r in profile.deny] == ["agent.deny[0] (no pastebins)"]
    assert str(profile.allow[0]) == "agent.allow[0] (model server)"


# --- the CLI's --allow/--deny syntax ------------------------------------------------------

ALL = {TCP, UDP, ICMP}
RULE_TEXTS = [
    # text, (kind, target), ports, protocols
    ("pypi.org", ("domain", "pypi.org"), (), ALL),
    ("PyPI.org.", ("domain", "pypi.org"), (), ALL),
    ("*.github.com:443", ("domain", "*.github.com"), ((443, 443),), {TCP}),
    ("10.77.0.10:8000", ("host", "10.77.0.10/32"), ((8000, 8000),), {TCP}),
    ("0x0a.77.0.10:8000", ("host", "10.77.0.10/32"), ((8000, 8000),), {TCP}),
    ("10.77.0.0/24", ("cidr", "10.77.0.0/24"), (), ALL),
    ("10.77.0.0/24:22", ("cidr", "10.77.0.0/24"), ((22, 22),), {TCP}),
    ("10.77.0.0/24/udp", ("cidr", "10.77.0.0/24"), (), {UDP}),
    ("[fd00::1]:53/udp", ("host", "fd00::1/128"), ((53, 53),), {UDP}),
    ("fd00::1", ("host", "fd00::1/128"), (), ALL),
    ("[::ffff:10.77.0.10]:8000", ("host", "10.77.0.10/32"), ((8000, 8000),), {TCP}),
    ("api.example.com:80,443", ("domain", "api.example.com"), ((80, 80), (443, 443)), {TCP}),
    ("api.example.com:8000-8100", ("domain", "api.example.com"), ((8000, 8100),), {TCP}),
    (
        "api.example.com:80,8000-8100",
        ("domain", "api.example.com"),
        ((80, 80), (8000, 8100)),
        {TCP},
    ),
    ("10.0.0.1:53/any", ("host", "10.0.0.1/32"), ((53, 53),), {TCP, UDP}),
    ("10.0.0.1/icmp", ("host", "10.0.0.1/32"), (), {ICMP}),
]


@pytest.mark.parametrize(("text", "target", "ports", "protocols"), RULE_TEXTS)
def test_parse_rule_text(
    text: str, target: tuple[str, str], ports: tuple[tuple[int, int], ...], protocols: set[Protocol]
) -> None:
    spec = parse_rule_text(text)
    kind, value = target
    assert getattr(spec, kind) is not None
    assert str(spec.pattern if kind == "domain" else spec.network) == value
    assert spec.ports == ports
    assert spec.protocols == protocols


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("*.com", "whole top-level domain"),
        ("a.*.example.com", "wildcard may only be"),
        ("pypi.org:", "port '' is not a number"),
        ("pypi.org:abc", "port 'abc' is not a number"),
        ("pypi.org:0", "outside 1-65535"),
        ("pypi.org:80,", "port '' is not a number"),
        ("pypi.org:9000-8000", "reversed"),
        ("pypi.org:443/icmp", "ICMP has no ports"),
        ("10.0.0.1/24", "host bits set; did you mean 10.0.0.0/24?"),
        ("[fd00::1]x", "after ']' only ':PORT' may follow"),
        ("10.0.0.1:80:90", "IPv6"),
        ("pypi..org", "empty label"),
    ],
)
def test_parse_rule_text_refuses(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=None) as caught:
        parse_rule_text(text)
    assert words in str(caught.value)


# --- Policy.profile: the run's overrides ---------------------------------------------------

CODER = """\
[profiles.coder]
internet = "open"
allow = [
  { host = "10.77.0.10", port = 8000, name = "model server" },
  { domain = "*.github.com" },
]
deny = [ { domain = "gist.github.com", name = "no pastebins" } ]
[profiles.reviewer]
internet = "locked"
"""


def test_profile_overrides_mode_and_adds_rules_with_cli_refs() -> None:
    policy = parse_policy(CODER.encode(), "policy.toml")
    profile = policy.profile(
        "coder",
        mode=Mode.ALLOWLIST,
        extra_allow=["pypi.org", "10.0.0.5:22"],
        extra_deny=["*.pypi.org"],
    )
    assert profile.mode is Mode.ALLOWLIST
    assert [str(r) for r in profile.allow] == [
        "coder.allow[0] (model server)",
        "coder.allow[1] (*.github.com)",
        "--allow[0] (pypi.org)",
        "--allow[1] (10.0.0.5:22)",
    ]
    assert [str(r) for r in profile.deny] == [
        "coder.deny[0] (no pastebins)",
        "--deny[0] (*.pypi.org)",
    ]
    assert policy.profile("coder").mode is Mode.OPEN  # the file's mode without --mode


def test_profile_without_default_needs_a_name() -> None:
    policy = parse_policy(CODER.encode(), "policy.toml")
    with pytest.raises(PolicyError) as caught:
        policy.profile()
    assert "several profiles (coder, reviewer) and no default" in str(caught.value)
    with pytest.raises(PolicyError) as caught:
        policy.profile("codr")
    [problem] = caught.value.problems
    assert (problem.message, problem.fix) == ("no profile named 'codr'", "did you mean 'coder'?")


@pytest.mark.parametrize(
    ("kw", "wanted"),
    [
        (
            {"extra_allow": ["gist.github.com"]},
            [("--allow", None, "--allow[0] (gist.github.com) can never match: coder.deny[0]")],
        ),
        (
            # A --deny that kills a rule of the file points at that rule's line.
            {"extra_deny": ["*.github.com"]},
            [("policy.toml", 5, "coder.allow[1] (*.github.com) can never match: --deny[0]")],
        ),
        (
            {"extra_allow": ["10.77.0.10:8000"]},
            [("--allow", None, "--allow[0] (10.77.0.10:8000) repeats coder.allow[0]")],
        ),
        (
            {"extra_allow": ["ok.example.com", "*.com", "bad..name"]},
            [
                ("--allow '*.com'", None, "whole top-level domain"),
                ("--allow 'bad..name'", None, "empty label"),
            ],
        ),
        (
            {"extra_deny": ["example.com:http"]},
            [("--deny 'example.com:http'", None, "port 'http' is not a number")],
        ),
    ],
)
def test_profile_override_problems(
    kw: dict[str, list[str]], wanted: list[tuple[str, int | None, str]]
) -> None:
    policy = parse_policy(CODER.encode(), "policy.toml")
    with pytest.raises(PolicyError) as caught:
        policy.profile("coder", **kw)  # type: ignore[arg-type]
    found = caught.value.problems
    assert [(p.file, p.line) for p in found] == [(f, line) for f, line, _ in wanted]
    for p, (_, _, words) in zip(found, wanted, strict=True):
        assert words in p.message
        assert p.fix
