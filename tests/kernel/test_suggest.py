"""``policy suggest`` end to end (issue 14, part 2): a session's refusals become an overlay;
the same commands run with it pass where a rule was suggested and nothing else that was
refused does (the LAN model server's rule is risky, so it stays commented out and refused).
"""

from __future__ import annotations

import ipaddress
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandgate.events.store import Store
from sandgate.policy.load import load_policy
from sandgate.policy.model import Mode
from sandgate.policy.suggest import suggest
from sandgate.world import topology

from .conftest import Runner

pytestmark = pytest.mark.kernel

BASE = '[profiles.dev]\ninternet = "allowlist"\n'
SCRIPT = (
    "curl -sS -m 5 -o /dev/null https://pypi.org/simple/; "
    'curl -sS -m 5 --noproxy "*" -o /dev/null https://github.com/; '
    "/opt/sandgate/venv/bin/python -c 'import socket; "
    "s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
    's.sendto(b\"x\", (\"198.51.100.10\", 123))\'; '
    'curl -sS -m 5 --noproxy "*" -o /dev/null http://10.77.0.10:8000/v1/models; true'
)


@pytest.fixture
def work() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="sg-suggest-") as d:
        path = Path(d)
        path.chmod(0o777)
        (path / "p.toml").write_text(BASE)
        yield path


def refused(sandbox: Runner, session: str) -> set[tuple[str | None, int | None, str | None]]:
    store = Store(sandbox.store_path)
    try:
        events = store.events(session=session)
    finally:
        store.close()
    return {
        (e.name if e.kind.value != "conn" else e.dst, e.port if e.kind.value != "dns" else None,
         e.reason)
        for e in events
        if e.verdict == "deny" and e.kind.value in ("dns", "conn", "http")
        and e.reason != "deny.ipv6"  # AAAA questions: IPv4 only (issue 14, part 5)
    }


def test_suggested_overlay_lets_through_what_it_covers_and_nothing_else(
    sandbox: Runner, work: Path
) -> None:
    first = sandbox.sh(SCRIPT, workdir=work, policy=str(work / "p.toml"))
    store = Store(sandbox.store_path)
    try:
        row = store.session(first.session)
        events = store.events(session=first.session)
    finally:
        store.close()
    assert row is not None
    override = tuple(ipaddress.ip_network(n) for n in topology.PUBLIC)
    result = suggest(
        load_policy(row.policy), row.profile, Mode(row.mode) if row.mode else None, events,
        session=row.id, public_override=override, extends=row.policy,
    )
    (work / "more.toml").write_text(result.text)
    load_policy(work / "more.toml")  # passes `policy check`
    assert '{ domain = "pypi.org", port = 443 }' in result.text
    assert '{ domain = "github.com", port = 443 }' in result.text
    assert '{ host = "198.51.100.10", port = 123, protocol = "udp" }' in result.text
    assert '# { host = "10.77.0.10", port = 8000 },' in result.text  # risky: commented out

    second = sandbox.sh(SCRIPT, workdir=work, policy=str(work / "more.toml"))
    before, after = refused(sandbox, first.session), refused(sandbox, second.session)
    assert ("10.77.0.10", 8000, "deny.private") in before
    assert after == {("10.77.0.10", 8000, "deny.private")}, (before, after)
