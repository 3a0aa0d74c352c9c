"""DNS answers that would leak, asked for by a real ``dig`` inside a sandbox.

The test world's upstream server answers ANY with every record of the name and does not refuse
AXFR/IXFR questions; its zone holds aliases to ``localhost.``, to
``metadata.google.internal.``, to themselves and round in a chain (world/topology.py CNAMES).
Each test checks what dig saw, what the gateway logged, and, from the upstream's own log, what
left the gateway.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandgate.events.schema import Event, Kind
from sandgate.session.runner import RunResult

from .conftest import Runner, dns

pytestmark = pytest.mark.kernel

DIG = "dig +time=2 +tries=1"


@pytest.fixture
def work() -> Iterator[Path]:
    """A work dir the sandbox's uid can reach (pytest's tmp_path sits below a 0700 folder)."""
    with tempfile.TemporaryDirectory() as d:
        Path(d).chmod(0o777)
        yield Path(d)
        subprocess.run(["rm", "-rf", d + "/out.txt"], check=False)  # written by the guest's uid


def _run(sandbox: Runner, work: Path, script: str) -> tuple[str, list[Event]]:
    """Run ``script`` in an open-mode sandbox; its output and the session's events."""
    result: RunResult = sandbox.sh(f"({script}) > /work/out.txt 2>&1", mode="open", workdir=work)
    return (work / "out.txt").read_text(), sandbox.events(result, Kind.DNS)


def _upstream_since(sandbox: Runner, before: int) -> list[dict[str, Any]]:
    time.sleep(0.2)  # the world's server writes its log line after answering
    return [x for x in sandbox.world_log("dns")[before:] if x.get("event") == "query"]


def test_any_axfr_ixfr_get_no_dump_and_never_go_upstream(sandbox: Runner, work: Path) -> None:
    before = len(sandbox.world_log("dns"))
    out, events = _run(
        sandbox,
        work,
        f"{DIG} ANY example.com; {DIG} AXFR example.com; {DIG} IXFR=1 example.com; "
        f"{DIG} +notcp IXFR=1 example.com; {DIG} +tcp ANY pypi.org; {DIG} +short A example.com",
    )
    # ANY: RFC 8482's one HINFO, with the reason, and none of the records the upstream has.
    assert 'HINFO\t"RFC8482" ""' in out, out
    assert "sandgate: deny.dns_any" in out, out
    assert "SOA" not in out and "\tNS\t" not in out and "ns1.example.com" not in out, out
    assert out.count("203.0.113.10") == 1, out  # only the plain A question's answer
    # AXFR/IXFR: refused, whatever the transport.
    assert "Transfer failed" in out, out
    assert out.count("Transfer failed") == 2, out  # dig prints no header for IXFR over UDP
    got = {(e.details.get("qtype"), e.verdict, e.reason) for e in dns(events, "example.com")}
    assert ("ANY", "deny", "deny.dns_any") in got, got
    assert ("AXFR", "deny", "deny.zone_transfer") in got, got
    assert ("IXFR", "deny", "deny.zone_transfer") in got, got
    assert ("A", "allow", "allow.open") in got, got
    assert {(e.details.get("qtype"), e.reason) for e in dns(events, "pypi.org")} == {
        ("ANY", "deny.dns_any")
    }
    upstream = _upstream_since(sandbox, before)
    asked = {(x["qname"], x["qtype"]) for x in upstream}
    assert ("example.com.", "A") in asked, asked  # the log is read, and it shows the gateway
    assert not {t for _, t in asked} & {"ANY", "AXFR", "IXFR"}, asked


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("cname-localhost.example.com", "deny.cname_target"),
        ("cname-metadata.example.com", "deny.cname_target"),
        ("cname-self.example.com", "deny.cname_loop"),
        ("cname-loop-a.example.com", "deny.cname_loop"),
    ],
)
def test_alias_to_a_forbidden_target_is_refused(
    sandbox: Runner, work: Path, name: str, reason: str
) -> None:
    before = len(sandbox.world_log("dns"))
    # A CNAME question gets the one record: a chain shows only when A is asked for.
    cname_too = name != "cname-loop-a.example.com"
    out, events = _run(sandbox, work, f"{DIG} A {name}; {DIG} CNAME {name}")
    refused = 2 if cname_too else 1
    assert out.count("status: NXDOMAIN") == refused, out
    assert out.count(f"sandgate: {reason}") == refused, out
    if cname_too:
        assert out.count("ANSWER: 0,") == 2 and "IN\tCNAME\t" not in out, out  # no bare alias
    asked = {(e.details.get("qtype"), e.verdict, e.reason) for e in dns(events, name)}
    assert ("A", "deny", reason) in asked, asked
    assert (("CNAME", "deny", reason) in asked) is cname_too, asked
    # It was the upstream's answer that was refused: the question did go out.
    assert any(x["qname"] == name + "." for x in _upstream_since(sandbox, before))


def test_special_use_names_never_leave_the_gateway(sandbox: Runner, work: Path) -> None:
    before = len(sandbox.world_log("dns"))
    names = ("metadata.google.internal", "printer.local", "nas.home.arpa", "_dns.resolver.arpa")
    out, events = _run(sandbox, work, "; ".join(f"{DIG} {n}" for n in names))
    assert out.count("sandgate: deny.special_name") == len(names), out
    for n in names:
        assert [e.reason for e in dns(events, n)] == ["deny.special_name"], n
    assert not [x for x in _upstream_since(sandbox, before) if x["qname"].rstrip(".") in names]


def test_private_reverse_names_answered_by_policy(sandbox: Runner, work: Path) -> None:
    before = len(sandbox.world_log("dns"))
    out, events = _run(sandbox, work, f"{DIG} -x 10.77.0.20; {DIG} -x 169.254.169.254")
    assert "sandgate: deny.private" in out and "sandgate: deny.metadata" in out, out
    assert [e.reason for e in dns(events, "20.0.77.10.in-addr.arpa")] == ["deny.private"]
    assert not [x for x in _upstream_since(sandbox, before) if "in-addr" in str(x["qname"])]
