"""The real uplink (this host's own network, through pasta): brought up and torn down only.

No traffic is sent: behaviour is proven in the test world. What is checked here is that the
gateway gets an uplink like the host's, that the host's namespace is left exactly as it was,
and that nothing remains afterwards.
"""

from __future__ import annotations

import subprocess

import pytest

from sandgate.session.stack import bring_up

from .conftest import leftovers

pytestmark = pytest.mark.kernel


def _host_state() -> tuple[str, ...]:
    cmds = (
        ["ip", "-o", "addr"],
        ["ip", "route"],
        ["ip", "-o", "link"],
        ["nft", "list", "ruleset"],
        ["sysctl", "-n", "net.ipv4.ip_forward"],
    )
    return tuple(
        subprocess.run(c, capture_output=True, text=True, check=False).stdout for c in cmds
    )


def test_real_uplink_up_and_down_touches_nothing_on_the_host() -> None:
    before = _host_state()
    stack = bring_up(world=False)
    try:
        pid = stack.gateway.pid
        inside = subprocess.run(
            ["nsenter", f"--net=/proc/{pid}/ns/net", "ip", "-o", "-4", "route"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "default via" in inside and "dev up0" in inside
        assert stack.gateway.pasta is not None and stack.gateway.pasta.poll() is None
        with stack.gateway.client() as ctl:
            assert ctl.call("ping")["guests"] == 0
        assert _host_state() == before
    finally:
        stack.teardown()
    assert _host_state() == before
    assert not [x for x in leftovers() if stack.instance in x]
    assert stack.gateway.pasta is not None and stack.gateway.pasta.poll() is not None
