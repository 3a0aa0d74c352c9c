"""The plain-entry shortcut (policy/plainrules.py) reads a rule exactly as pydantic does, and
leaves every entry it cannot read that way, and so every error message, to pydantic."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sandgate.errors import PolicyError
from sandgate.policy import load
from sandgate.policy.model import RuleSpec
from sandgate.policy.plainrules import plain_rule

TARGETS = [
    "pypi.org", "*.github.com", "PyPI.Org.", "*.com", "a*.b.com", "10.0.0.1", "bücher.de",
    "xn--bcher-kva.de", " pypi.org", "", "-bad-.com", "11.1.2.0/24", "11.1.2.1/24",
    "011.1.2.0/24", "0.0.0.0/0", "fd00::/64", "::ffff:1.2.3.0/120", "::ffff:1.2.3.4",
    "1.2.3.4", "0x7f.1", "fe80::1%eth0", "[::1]", "256.1.1.1", "1.2.3.4/32", "10.201.0.4/30",
]  # fmt: skip
VALUES: Any = st.one_of(
    st.sampled_from(TARGETS),
    st.integers(-2, 70000),
    st.booleans(),
    st.none(),
    st.sampled_from(["tcp", "udp", "icmp", "any", "TCP", "sctp", "443", "80-90", "x"]),
    st.lists(st.sampled_from([443, "80", "1-2", True]), max_size=2),
)
KEYS = st.sampled_from(
    ["domain", "cidr", "host", "port", "protocol", "name", "http", "process", "host_loopback", "x"]
)
ENTRIES: Any = st.one_of(
    st.dictionaries(KEYS, VALUES, max_size=4),
    # Mostly the shapes a large file has: one target, perhaps a port, protocol, name.
    st.fixed_dictionaries(
        {st.sampled_from(["domain", "cidr", "host"]): st.sampled_from(TARGETS)},  # type: ignore[dict-item]
        optional={
            "port": st.one_of(st.integers(0, 65536), st.just(True), st.just("443")),
            "protocol": st.sampled_from(["tcp", "udp", "icmp", "any", "quic"]),
            "name": st.one_of(st.just("model server"), st.just(7)),
        },
    ),
    st.just([]),
    st.just("pypi.org"),
)

DERIVED = ("network", "pattern", "ports", "protocols", "requests")


@settings(max_examples=600, deadline=None)
@given(ENTRIES)
@example({"domain": "pypi.org", "port": 443})
@example({"cidr": "::ffff:1.2.3.0/120"})
@example({"host": "::ffff:1.2.3.4", "protocol": "any"})
@example({"domain": "pypi.org", "port": 443, "protocol": "icmp"})
@example({"domain": "pypi.org", "port": True})
@example({"cidr": "11.1.2.1/24"})
def test_a_plain_entry_reads_as_pydantic_reads_it(entry: Any) -> None:
    fast = plain_rule(entry)
    try:
        slow = RuleSpec.model_validate(entry)
    except Exception:
        assert fast is None, (entry, fast)
        return
    if fast is None:
        return  # pydantic's to read: nothing to compare
    assert fast.model_dump() == slow.model_dump(), entry
    assert fast.model_fields_set == slow.model_fields_set, entry
    assert fast == slow, entry
    for name in DERIVED:
        assert getattr(fast, name) == getattr(slow, name), (entry, name)
    assert fast.target_text() == slow.target_text()


def test_the_shortcut_reads_the_plain_shapes() -> None:
    """It must read what large files hold, or it saves nothing."""
    for entry in (
        {"domain": "d1.rules.example", "port": 443},
        {"cidr": "11.0.3.0/24"},
        {"host": "10.77.0.10", "port": 8000, "name": "model server"},
        {"domain": "*.github.com", "protocol": "any"},
    ):
        assert plain_rule(entry) is not None, entry


def _file(entries: list[str]) -> bytes:
    body = ",\n  ".join(entries)
    return (
        '[profiles.coder]\ninternet = "allowlist"\n'
        f'allow = [\n  {body}\n]\ndeny = [{{ domain = "gist.github.com", port = 22 }}]\n'
    ).encode()


FILE_ENTRIES = st.lists(
    st.sampled_from(
        [
            '{ domain = "pypi.org" }',
            '{ domain = "PyPI.org", port = 443 }',
            '{ domain = "*.github.com", port = 22 }',
            '{ domain = "gist.github.com", port = 22 }',
            '{ cidr = "11.1.2.0/24" }',
            '{ cidr = "11.1.2.1/24" }',
            '{ cidr = "10.201.0.0/30" }',
            '{ host = "10.77.0.10", port = 8000, name = "model" }',
            '{ host = "10.77.0.10/8" }',
            '{ domain = "x.example", port = 0 }',
            '{ domain = "x.example", port = "443" }',
            '{ domain = "x.example", protocol = "icmp", port = 1 }',
            '{ domain = "x.example", cidr = "1.2.3.0/24" }',
            '{ domain = "*.com" }',
            '{ domain = "y.example", colour = "red" }',
            "{ host_loopback = 11434 }",
        ]
    ),
    min_size=1,
    max_size=6,
)


def _outcome(text: bytes) -> object:
    try:
        policy = load.parse_policy(text, "p.toml")
    except PolicyError as exc:
        return ("error", str(exc))
    return policy.file.model_dump()


@settings(max_examples=150, deadline=None)
@given(FILE_ENTRIES)
def test_a_file_loads_as_it_did_without_the_shortcut(entries: list[str]) -> None:
    """The same file gives the same policy, or the same error text, either way."""
    text = _file(entries)
    fast = _outcome(text)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(load, "read_plain_rules", lambda raw: (raw, {}))
        slow = _outcome(text)
    assert fast == slow, entries
