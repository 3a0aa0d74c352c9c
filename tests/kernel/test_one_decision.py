"""The holes where a layer judged on its own, as regression tests from inside sandboxes.

1. A custom ``guest_pool`` with an allow rule covering it: guests stay apart (the daemon uses
   the pool of the policy it was started with, and decide() and the ruleset know the guests).
2. A port-scoped deny of an allowed name: the name resolves and its other ports work directly,
   while exactly the denied port is refused at L3 (the name's pin set), in allowlist and open.
3. A user's ``[gateway]`` table reaches the daemon (``upstream_dns``), and a running gateway
   refuses a guest whose policy asks for other wiring instead of ignoring it.
"""

from __future__ import annotations

import ipaddress
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandgate.errors import SandgateError
from sandgate.prove.runner import ProveOptions, prove_on
from sandgate.session.stack import Stack, bring_up

from .conftest import Runner, conns, dns, leftovers

pytestmark = pytest.mark.kernel

POOL = "10.202.0.0/16"
WORLD_RESOLVER = "198.51.100.53"
NOT_A_RESOLVER = "198.51.100.10"  # a web host of the test world: no DNS there


def _write(tmp: Path, name: str, text: str) -> Path:
    path = tmp / name
    path.write_text(textwrap.dedent(text))
    path.chmod(0o644)
    return path


@pytest.fixture(scope="module")
def pool_policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write(
        tmp_path_factory.mktemp("policy"),
        "pool.toml",
        f"""\
        [gateway]
        guest_pool = "{POOL}"
        upstream_dns = ["{WORLD_RESOLVER}", "{NOT_A_RESOLVER}"]

        [profiles.agent]
        internet = "open"
        allow = [ {{ cidr = "10.0.0.0/8" }} ]
        """,
    )


@pytest.fixture(scope="module")
def pool_stack(pool_policy: Path, store_path: Path) -> Iterator[Stack]:
    s = bring_up(world=True, store=str(store_path), policy=str(pool_policy))
    try:
        yield s
    finally:
        s.teardown()
        after = [x for x in leftovers() if s.instance in x]
        assert not after, f"left behind: {after}"


def test_custom_pool_guests_stay_apart_and_prove_sees_it(
    pool_stack: Stack, pool_policy: Path, store_path: Path
) -> None:
    result = prove_on(
        pool_stack, ProveOptions(world="test", policy=str(pool_policy), store=str(store_path))
    )
    assert not result.failed, "\n".join(f"{r.probe}: {r.why}" for r in result.failed)
    lateral = [r for r in result.results if r.group == "lateral"]
    assert lateral and all(r.observed == "deny" for r in lateral), lateral
    assert any(r.reason == "deny.lateral" for r in lateral)


def test_custom_pool_is_the_daemons_and_upstream_dns_reaches_it(
    pool_stack: Stack, pool_policy: Path, store_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    with pool_stack.gateway.client() as ctl:
        snap = ctl.call("snapshot")
    assert snap["resolver"]["upstream"] == [WORLD_RESOLVER, NOT_A_RESOLVER]
    runner = Runner(pool_stack, store_path)
    r = runner.sh("ip -4 -o addr show eth0; getent hosts pypi.org", policy=str(pool_policy))
    output = capfd.readouterr().out
    assert r.exit_code == 0, output
    address = output.split("inet ")[1].split("/")[0]
    assert ipaddress.ip_address(address) in ipaddress.ip_network(POOL)
    assert "203.0.113.20" in output


def test_a_running_gateway_refuses_a_policy_with_other_wiring(
    sandbox: Runner, pool_policy: Path
) -> None:
    with pytest.raises(SandgateError) as caught:
        sandbox("true", policy=str(pool_policy))
    text = str(caught.value)
    assert "pool.toml:2:1: guest_pool = 10.202.0.0/16 differs from the running gateway" in text
    assert "sandgate up --policy" in text


@pytest.mark.parametrize("mode", ["allowlist", "open"])
def test_a_port_scoped_deny_refuses_that_port_only(
    sandbox: Runner, tmp_path: Path, mode: str, capfd: pytest.CaptureFixture[str]
) -> None:
    tmp_path.chmod(0o755)
    policy = _write(
        tmp_path,
        "gist.toml",
        f"""\
        [profiles.agent]
        internet = "{mode}"
        allow = [ {{ domain = "*.github.com" }} ]
        deny = [ {{ domain = "gist.github.com", port = 22 }} ]
        """,
    )
    r = sandbox.sh(
        "getent hosts gist.github.com || echo no-name; "
        "curl --noproxy '*' -sS -m 5 -o /dev/null -w 'https=%{http_code}\\n' "
        "https://gist.github.com/; "
        "curl --noproxy '*' -sS -m 5 telnet://gist.github.com:22 </dev/null; echo ssh=$?",
        policy=str(policy),
    )
    output = capfd.readouterr().out
    assert "203.0.113.33" in output and "no-name" not in output, output
    assert "https=" in output and "https=000" not in output, output  # the server answered
    assert "ssh=7" in output, output  # refused at once (ICMP admin-prohibited)
    events = sandbox.events(r)
    assert any(e.verdict == "allow" for e in dns(events, "gist.github.com"))
    ssh = conns(events, "203.0.113.33", 22)
    assert ssh and all(e.verdict == "deny" and e.reason == "deny.rule" for e in ssh), ssh
    assert "agent.deny[0]" in (ssh[0].rule or "")
    web = conns(events, "203.0.113.33", 443)
    assert web and web[0].verdict == "allow", web
