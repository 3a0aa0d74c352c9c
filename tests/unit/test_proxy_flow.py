"""The proxy's judge when resolution gives nothing: an allowed name with no address is refused.

(tests/unit/test_proxy_judge.py holds the rest of ``judge``'s cases.)
"""

from __future__ import annotations

from ipaddress import IPv4Address

import pytest

from sandgate.gateway.proxy.flow import judge
from sandgate.policy.load import parse_policy
from sandgate.policy.model import Mode

POLICY = parse_policy(
    b"""
[profiles.p]
allow = [ { domain = "pypi.org" }, { domain = "*.cdn.example", port = 443 } ]
""",
    "t.toml",
)


def nothing(name: str) -> list[IPv4Address]:
    """A resolver whose every answer is empty (NXDOMAIN, NODATA, or an upstream timeout)."""
    return []


@pytest.mark.parametrize("mode", list(Mode))
@pytest.mark.parametrize(("name", "port"), [("pypi.org", 443), ("a.cdn.example", 443)])
def test_allowlisted_name_that_resolves_to_nothing_is_refused(
    mode: Mode, name: str, port: int
) -> None:
    profile = POLICY.profile("p", mode=mode)
    j = judge(profile, name, None, port, nothing)
    assert (j.decision.verdict.value, j.decision.key) == ("deny", "deny.unresolvable")
    assert j.address is None  # nothing to dial
    assert j.addresses == ()
    assert name in j.decision.detail


def test_a_name_refused_before_resolving_keeps_its_own_reason() -> None:
    """Unresolvable is said only of names the policy would have allowed: the name is judged
    before it is looked up."""
    profile = POLICY.profile("p", mode=Mode.ALLOWLIST)
    assert judge(profile, "evil.example", None, 443, nothing).decision.key == "deny.not_allowlisted"
    assert judge(profile, "a.cdn.example", None, 8443, nothing).decision.key == (
        "deny.not_allowlisted"
    )
