"""OCSF export (events/ocsf.py): one record per attempt, each valid against the OCSF 1.8.0
schema for its class (tests/ocsf_schema, see its NOTICE), with the Decision inside.

The events are built as the enforcers build them: ``Event.attempt`` with a real ``decide()``.
"""

from __future__ import annotations

import io
import json
from ipaddress import IPv4Address, ip_address
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from sandgate.events import ocsf
from sandgate.events.schema import Event, Kind
from sandgate.policy.decide import Attempt, decide, decide_name
from sandgate.policy.load import parse_policy
from sandgate.policy.model import Protocol

SCHEMA_PATH = Path(__file__).parents[1] / "ocsf_schema" / "ocsf-1.8.0-network.schema.json"
SCHEMA = json.loads(SCHEMA_PATH.read_text())
VALIDATOR = Draft202012Validator(SCHEMA, format_checker=Draft202012Validator.FORMAT_CHECKER)

POLICY = parse_policy(
    b"""
[gateway]
guest_pool = "10.201.0.0/16"

[profiles.coder]
internet = "allowlist"
allow = [
  { host = "10.77.0.10", port = 8000, name = "model server" },
  { domain = "pypi.org" },
]
""",
    "policy.toml",
)
PROFILE = POLICY.profile("coder", gateway_address=IPv4Address("10.201.0.1"))  # type: ignore[arg-type]
TS = 1_790_000_000.25
PROCESS = {
    "pid": 4242,
    "exe": "/usr/bin/curl",
    "cmdline": ["curl", "-sS", "https://bob:hunter2@pypi.org/simple/?token=s3cret#frag"],
    "chain": [[4242, "curl"], [4200, "bash"]],
    "role": "tool",
}


def check(event: Event) -> dict[str, Any]:
    """The event's record, valid against its class's schema, with the fields every record has."""
    rec = ocsf.record(event, uid=7)
    assert rec is not None
    errors = sorted(VALIDATOR.iter_errors(rec), key=lambda e: list(e.absolute_path))
    assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors]
    assert rec["type_uid"] == rec["class_uid"] * 100 + rec["activity_id"]
    assert rec["category_uid"] == 4
    assert rec["time"] == 1_790_000_000_250  # milliseconds
    assert rec["metadata"]["product"]["name"] == "sandgate"
    assert rec["metadata"]["product"]["version"]
    assert rec["metadata"]["version"] == ocsf.OCSF_VERSION == "1.8.0"
    assert rec["metadata"]["uid"] == "7"
    return rec


def test_dns_question_answered() -> None:
    d = decide_name(PROFILE, "pypi.org")
    event = Event.attempt(
        Kind.DNS,
        d,
        ts=TS,
        session="s-1",
        guest="sg-l1",
        src="10.201.0.2",
        dst="10.201.0.1",
        port=53,
        protocol="udp",
        name="pypi.org",
        details={"qtype": "A", "rcode": 0, "answers": ["203.0.113.5", "203.0.113.6"]},
    )
    rec = check(event)
    assert rec["class_uid"] == 4003 and rec["activity_id"] == 6
    assert rec["query"] == {"hostname": "pypi.org", "type": "A", "class": "IN"}
    assert [a["rdata"] for a in rec["answers"]] == ["203.0.113.5", "203.0.113.6"]
    assert rec["rcode_id"] == 0 and rec["rcode"] == "NoError"
    assert rec["action_id"] == 1 and rec["disposition_id"] == 1
    assert rec["firewall_rule"]["uid"] == "coder.allow[1]"
    assert rec["src_endpoint"] == {"ip": "10.201.0.2"}
    assert rec["dst_endpoint"] == {"ip": "10.201.0.1", "port": 53}
    assert rec["metadata"]["correlation_uid"] == "s-1"
    assert rec["unmapped"]["reason"] == "allow.rule" and rec["unmapped"]["guest"] == "sg-l1"


def test_dns_question_refused() -> None:
    d = decide_name(PROFILE, "evil.example")
    event = Event.attempt(
        Kind.DNS,
        d,
        ts=TS,
        src="10.201.0.2",
        dst="10.201.0.1",
        port=53,
        protocol="udp",
        name="evil.example",
        details={"qtype": "AAAA", "rcode": 5},
    )
    rec = check(event)
    assert rec["rcode_id"] == 5 and rec["rcode"] == "Refused"
    assert "answers" not in rec
    assert rec["action_id"] == 2 and rec["disposition_id"] == 2  # Denied, Blocked
    assert rec["severity_id"] == 3
    assert rec["firewall_rule"]["uid"] == "deny.not_allowlisted"
    assert "not on the allowlist" in rec["firewall_rule"]["desc"]


@pytest.mark.parametrize(
    ("rcode", "expected"), [(0, 0), (3, 3), (11, 11), (12, 24), (16, 16), (23, 23), (24, 24),
                            (3840, 24), (3841, 25), (4095, 25), (4096, 24), (65535, 25)]
)  # fmt: skip
def test_rcode_ids_fold_unassigned_and_reserved(rcode: int, expected: int) -> None:
    assert ocsf.rcode_id(rcode) == expected


def conn(address: str, port: int, **kw: Any) -> Event:
    d = decide(PROFILE, Attempt(Protocol.TCP, ip_address(address), port))
    return Event.attempt(
        Kind.CONN,
        d,
        ts=TS,
        session="s-1",
        guest="sg-l1",
        src="10.201.0.2",
        dst=address,
        port=port,
        protocol="tcp",
        details={"site": "fwd", "sport": 40000},
        **kw,
    )


def test_connection_allowed() -> None:
    rec = check(conn("10.77.0.10", 8000, uid=61000))
    assert rec["class_uid"] == 4001 and rec["activity_id"] == 1  # Open
    assert rec["action_id"] == 1 and rec["disposition_id"] == 1
    assert rec["firewall_rule"] == {
        "uid": "coder.allow[0]",
        "name": "model server",
        "desc": "allow.exempt: special-purpose address exempted by an allow rule",
    }
    assert rec["src_endpoint"] == {"ip": "10.201.0.2", "port": 40000}
    assert rec["dst_endpoint"] == {"ip": "10.77.0.10", "port": 8000}
    assert rec["connection_info"]["protocol_num"] == 6
    assert rec["connection_info"]["direction_id"] == 2
    assert rec["actor"] == {"user": {"uid": "61000"}}


def test_connection_denied_is_dropped() -> None:
    rec = check(conn("10.0.0.9", 22, count=3))
    assert rec["activity_id"] == 5  # Refuse
    assert rec["action_id"] == 2 and rec["disposition_id"] == 6  # Denied, Dropped
    assert rec["firewall_rule"]["uid"] == "deny.private"
    assert rec["count"] == 3 and rec["traffic"]["packets"] == 3


def test_http_request_with_its_process() -> None:
    d = decide(PROFILE, Attempt(Protocol.TCP, None, 443, "pypi.org"))
    event = Event.attempt(
        Kind.HTTP,
        d,
        ts=TS,
        guest="sg-l1",
        src="10.201.0.2",
        dst="203.0.113.5",
        port=443,
        protocol="tcp",
        name="pypi.org",
        uid=61000,
        pid=4242,
        details={
            "door": "explicit",
            "tls": "inspected",
            "method": "GET",
            "path": "/simple/?…",
            "status": 200,
            "bytes_up": 120,
            "bytes_down": 3400,
            "duration_ms": 12.6,
            "sport": 40002,
            "process": PROCESS,
        },
    )
    rec = check(event)
    assert rec["class_uid"] == 4002 and rec["activity_id"] == 3  # Get
    assert rec["action_id"] == 1 and rec["firewall_rule"]["uid"] == "coder.allow[1]"
    assert rec["http_request"]["http_method"] == "GET"
    assert rec["http_request"]["url"]["path"] == "/simple/"
    assert rec["http_request"]["url"]["url_string"] == "https://pypi.org/simple/"
    assert rec["http_response"] == {"code": 200}
    assert rec["traffic"] == {"bytes_out": 120, "bytes_in": 3400, "bytes": 3520}
    assert rec["duration"] == 13
    process = rec["actor"]["process"]
    assert process["pid"] == 4242 and process["name"] == "curl"
    assert process["cmd_line"] == "curl -sS 'https://…@pypi.org/simple/?…'"
    assert process["parent_process"] == {"pid": 4200, "name": "bash"}
    assert rec["unmapped"]["process_role"] == "tool"
    text = json.dumps(rec)
    assert "hunter2" not in text and "bob" not in text
    assert "s3cret" not in text and "token" not in text and "frag" not in text


def test_tunnel_is_network_activity() -> None:
    d = decide(PROFILE, Attempt(Protocol.TCP, None, 443, "pypi.org"))
    event = Event.attempt(
        Kind.HTTP,
        d,
        ts=TS,
        src="10.201.0.2",
        dst="203.0.113.5",
        port=443,
        protocol="tcp",
        name="pypi.org",
        details={"door": "explicit", "tls": "passthrough", "method": "CONNECT", "sni": "pypi.org",
                 "bytes_up": 500, "bytes_down": 9000, "sport": 40003},
    )  # fmt: skip
    rec = check(event)
    assert rec["class_uid"] == 4001 and rec["activity_id"] == 1
    assert rec["dst_endpoint"] == {"ip": "203.0.113.5", "hostname": "pypi.org", "port": 443}
    assert rec["app_protocol_name"] == "tls"
    assert rec["traffic"]["bytes"] == 9500


def test_refused_request_without_an_address() -> None:
    d = decide(PROFILE, Attempt(Protocol.TCP, None, 80, "evil.example"))
    event = Event.attempt(
        Kind.HTTP,
        d,
        ts=TS,
        src="10.201.0.2",
        port=80,
        protocol="tcp",
        name="evil.example",
        details={"door": "transparent", "tls": "plain", "method": "POST", "path": "/up",
                 "status": 403, "bytes_up": 0, "bytes_down": 0, "sport": 40004},
    )  # fmt: skip
    rec = check(event)
    assert rec["activity_id"] == 6 and rec["action_id"] == 2 and rec["disposition_id"] == 2
    assert rec["dst_endpoint"] == {"hostname": "evil.example", "port": 80}
    assert rec["http_request"]["url"]["url_string"] == "http://evil.example/up"


def test_an_endpoint_that_is_no_address_is_a_name() -> None:
    rec = check(Event.attempt(Kind.CONN, None, ts=TS, src="sg-l1?", dst="fe80::1", protocol="ipv6"))
    assert rec["src_endpoint"] == {"name": "sg-l1?"}
    assert rec["dst_endpoint"] == {"ip": "fe80::1"}
    assert rec["action_id"] == 0 and rec["activity_id"] == 6 and "firewall_rule" not in rec


def test_findings_are_left_out() -> None:
    for kind in ocsf.SKIPPED_KINDS:
        assert ocsf.record(Event(kind=kind, ts=TS)) is None
    out = io.StringIO()
    rows = [(1, Event(kind=Kind.SESSION, ts=TS)), (2, conn("10.77.0.10", 8000))]
    skipped = ocsf.write_jsonl(rows, out)
    assert skipped == {"session": 1}
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["metadata"]["uid"] == "2"


def test_the_schema_refuses_what_ocsf_does_not_allow() -> None:
    """The schema bites: a query string, a wrong class, a missing requirement all fail."""
    good = ocsf.record(conn("10.77.0.10", 8000))
    assert good is not None and VALIDATOR.is_valid(good)
    for broken in (
        {**good, "class_uid": 4009},
        {**good, "activity_id": 8},
        {**good, "metadata": {"product": {"name": "sandgate"}}},
        {**good, "time": TS},
        {**good, "dst_endpoint": {"ip": "not-an-ip"}},
        {**good, "disposition_id": 28},
        {**good, "made_up": 1},
        {k: v for k, v in good.items() if k not in ("src_endpoint", "dst_endpoint")},
    ):
        assert not VALIDATOR.is_valid(broken), broken
    http = {
        **good,
        "class_uid": 4002,
        "activity_id": 3,
        "http_request": {"url": {"path": "/", "query_string": "token=x"}},
    }
    assert not VALIDATOR.is_valid(http)
    http["http_request"] = {"url": {"path": "/"}}
    assert VALIDATOR.is_valid(http)


@pytest.mark.parametrize(
    ("word", "shown"),
    [
        ("https://u:p@host/a?b=c#d", "https://…@host/a?…"),
        ("http://host:8080/x", "http://host:8080/x"),
        ("git+ssh://git@host/repo.git", "git+ssh://…@host/repo.git"),
        ("-H", "-H"),
        ("a?b", "a?b"),  # not a URL: shell words are left alone
    ],
)
def test_command_line_urls_lose_userinfo_and_query(word: str, shown: str) -> None:
    assert ocsf.redact_arg(word) == shown
