"""``sandgate log --format ocsf`` after a real session in the test world: every line an OCSF
1.8.0 record valid for its class, the session's names and connections there with the verdict
the gateway gave them, and no query string or userinfo anywhere."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from sandgate.session.stack import Stack

from .test_cli import sg

pytestmark = pytest.mark.kernel

SCHEMA = json.loads(
    (Path(__file__).parents[1] / "ocsf_schema" / "ocsf-1.8.0-network.schema.json").read_text()
)
VALIDATOR = Draft202012Validator(SCHEMA, format_checker=Draft202012Validator.FORMAT_CHECKER)

SCRIPT = (
    # An allowed name over plain HTTP (the transparent proxy sees the request) and over TLS
    # (a tunnel), both with secrets in the URL; a name the allowlist refuses; a LAN tripwire.
    "curl --noproxy '*' -sS -m 5 -o /dev/null 'http://pypi.org/simple/?token=QS-SECRET'; "
    "curl --noproxy '*' -sS -m 5 -o /dev/null 'https://bob:UI-SECRET@pypi.org/?token=QS-SECRET';"
    " curl --noproxy '*' -sS -m 5 -o /dev/null https://evil.example/; "
    "curl --noproxy '*' -sS -m 3 telnet://10.77.0.20:22 </dev/null; true"
)


@pytest.fixture
def home(store_path: Path) -> Path:
    return store_path.parent


def records(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        rec = json.loads(line)
        errors = [f"{list(e.absolute_path)}: {e.message}" for e in VALIDATOR.iter_errors(rec)]
        assert not errors, (errors, rec)
        assert rec["type_uid"] == rec["class_uid"] * 100 + rec["activity_id"]
        out.append(rec)
    return out


def test_a_session_as_ocsf(stack: Stack, home: Path) -> None:
    r = sg(
        "run", "--world", "test", "--instance", stack.instance, "--mode", "allowlist", "--json",
        "--", "sh", "-c", SCRIPT, home=home,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    sid = json.loads(r.stdout.strip().splitlines()[-1])["session"]
    log = sg("log", "--session", "last", "--format", "ocsf", home=home)
    assert log.returncode == 0, log.stderr
    assert "left out of OCSF: " in log.stderr and "guest" in log.stderr  # joined, left
    recs = records(log.stdout)
    assert recs and all(rec["metadata"]["correlation_uid"] == sid for rec in recs)
    assert all(rec["metadata"]["product"]["name"] == "sandgate" for rec in recs)

    def dns(name: str) -> list[dict[str, Any]]:
        """Questions for the name's address (AAAA gets deny.ipv6: the gateway routes IPv4)."""
        question = {"hostname": name, "type": "A", "class": "IN"}
        return [x for x in recs if x["class_uid"] == 4003 and x["query"] == question]

    allowed, refused = dns("pypi.org"), dns("evil.example")
    assert allowed and all(x["action_id"] == 1 and x["disposition_id"] == 1 for x in allowed)
    assert any("rdata" in a and a["rdata"] == "203.0.113.20" for x in allowed for a in x["answers"])
    assert refused and all(x["action_id"] == 2 and x["disposition_id"] == 2 for x in refused)
    assert all("rcode_id" in x for x in allowed + refused)

    network = [x for x in recs if x["class_uid"] == 4001]
    tripwire = [x for x in network if x["dst_endpoint"].get("ip") == "10.77.0.20"]
    assert tripwire and all(
        x["action_id"] == 2 and x["disposition_id"] == 6 and x["firewall_rule"]["uid"]
        for x in tripwire
    ), tripwire
    tunnel = [x for x in network if x["dst_endpoint"].get("ip") == "203.0.113.20"]
    assert tunnel and any(x["action_id"] == 1 for x in tunnel), network

    requests = [x for x in recs if x["class_uid"] == 4002]
    get = [x for x in requests if x["http_request"]["url"].get("hostname") == "pypi.org"]
    assert get and get[0]["http_request"]["url"]["path"] == "/simple/", requests
    assert get[0]["activity_id"] == 3 and get[0]["http_response"]["code"] == 200
    # curl's process is known for at least some of its flows; its command line is redacted.
    curls = [x["actor"]["process"] for x in recs if "process" in x.get("actor", {})]
    assert any(p["name"] == "curl" and "pypi.org" in p.get("cmd_line", "") for p in curls), curls
    leaks = [line for line in log.stdout.splitlines() if "SECRET" in line]
    assert not leaks, leaks

    # The session's own export file: the same records, written when the session ended.
    kept = (home / "sessions" / sid / "events.ocsf.jsonl").read_text().splitlines()
    assert kept and kept == log.stdout.splitlines()[: len(kept)]
    by_id = sg("log", "--session", sid, "--format", "ocsf", home=home)
    assert by_id.stdout == log.stdout


def test_bad_format_and_unknown_session(home: Path) -> None:
    r = sg("log", "--format", "xml", home=home)
    assert r.returncode == 2 and "text, json, ocsf" in r.stderr
    r = sg("log", "--json", "--format", "ocsf", home=home)
    assert r.returncode == 2 and "--json means --format json" in r.stderr
    r = sg("log", "--session", "no-such-session", "--format", "ocsf", home=home)
    assert r.returncode != 0 and "no session 'no-such-session'" in r.stderr
    assert r.stdout == ""
