"""`sandgate doctor`'s plan and judge, without a sandbox: observations in, hops with fixes out.

A healthy observation of the test world passes every hop; each table row below breaks one
observation the way the real fault shows it (a SERVFAIL, a refused connect, a passthrough
certificate, a 9-minute clock) and names the hop that must fail and words its fix must hold.
"""

from __future__ import annotations

import base64
import copy
import email.utils
import ipaddress
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization

from sandgate.doctor.hops import HOPS, Hop, Status
from sandgate.doctor.judge import GatewayFacts, failed, issuer_of, judge
from sandgate.doctor.plan import OFFLINE_NAME, Plan, WorldFacts, plan_for
from sandgate.gateway.proxy.ca import make_ca
from sandgate.policy.load import load_policy
from sandgate.policy.profile import Profile
from sandgate.sandbox.launch import SYSTEM_BUNDLE, ca_env, proxy_env
from sandgate.world import topology

GATEWAY_CA = make_ca("sandgate inspection CA")
WORLD_CA = make_ca("sg world CA")
GW = "10.201.0.1"
PROXY = f"http://{GW}:3128"
BUNDLE = str(SYSTEM_BUNDLE)
NOW = 1_800_000_000.0
WORLD = WorldFacts(model=(topology.MODEL, topology.MODEL_PORT), names=tuple(topology.HOSTS))
TESTWORLD = Path(str(resources.files("sandgate.world").joinpath("testworld.toml")))


def profile_of(path: Path | None, **kw: Any) -> Profile:
    return load_policy(path).profile(
        None,
        public_override=tuple(ipaddress.ip_network(n) for n in topology.PUBLIC),
        gateway_address=ipaddress.ip_address(GW),
        **kw,
    )


def guest() -> dict[str, Any]:
    return {"gateway": GW, "proxy": PROXY, "ca": GATEWAY_CA.cert_pem.decode()}


def make_plan(path: Path | None = TESTWORLD, world: WorldFacts | None = WORLD) -> Plan:
    return plan_for(profile_of(path), guest(), world, "c0ffee", ca_env(), proxy_env(PROXY), BUNDLE)


def der(ca: Any, name: str) -> str:
    cert, _ = ca.issue_cert([name])
    return base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode()


def healthy(plan: Plan) -> dict[str, Any]:
    """What the driver sees in a working test world."""
    web = {"code": "200", "rc": 0, "error": "", "sandgate_reason": None, "at": NOW}
    env = {**ca_env(), **proxy_env(PROXY)}
    return {
        "clock": {"start": NOW, "end": NOW + 2},
        "resolv_conf": {"nameservers": [GW]},
        "libc": {"addresses": ["203.0.113.20"]},
        "env": env,
        "dns_known": {"status": "NOERROR", "answers": 1, "ede": "", "rc": 0},
        "dns_fresh": {"status": "NXDOMAIN", "answers": 0, "ede": "", "rc": 0},
        "doors": {"explicit": dict(web), "transparent": dict(web)},
        "models": [
            {"address": t.address, "port": t.port, "connect": "ok", "paths": {t.url: "200"}}
            for t in plan.models
        ],
        "inspected": [
            {
                "name": n,
                "direct": {"der": der(GATEWAY_CA, n)},
                "proxy": {"der": der(GATEWAY_CA, n)},
            }
            for n in plan.inspected
        ],
        "tools": {
            t: {"installed": True, "trusted": True, "detail": "STATUS 404"}
            for t in ("curl", "pip", "requests", "git", "node")
        },
        "uplink": dict(web),
        "date": {**web, "date": email.utils.formatdate(NOW, usegmt=True)},
        "bundles": {BUNDLE: {"readable": True, "gateway_ca": True}},
    }


FACTS = GatewayFacts(
    upstream=(topology.RESOLVER,), host_start=NOW - 1, host_end=NOW + 3, session="s1"
)


def hop(hops: list[Hop], name: str) -> Hop:
    return next(h for h in hops if h.name == name)


# -- the plan ----------------------------------------------------------------------------------


def test_plan_names_only_what_the_profile_allows() -> None:
    plan = make_plan()
    assert plan.known_name == "pypi.org"  # the first exact allow rule
    assert plan.fresh_name == "sg-doctor-c0ffee.github.com"  # below *.github.com: uncached
    assert plan.door_url == "http://pypi.org/" and plan.door_resolve is None
    assert plan.inspected == ("api.openai.com",)
    assert plan.tls_url == "https://api.openai.com/"
    vias = [(t.address, t.port, t.via, t.rule) for t in plan.models]
    assert vias == [
        ("10.77.0.10", 8000, "direct", "agent.allow[0] (model server)"),
        ("10.77.0.10", 8000, "front models.lan", "agent.allow[0] (model server)"),
    ]


def test_without_the_world_the_doors_ask_a_name_that_never_leaves() -> None:
    plan = make_plan(world=None)
    assert plan.door_url == f"http://{OFFLINE_NAME}/"
    assert plan.door_resolve == f"{OFFLINE_NAME}:80:192.0.2.1"
    assert plan.date_url is None
    assert not plan.world


def test_the_world_model_server_is_checked_even_without_its_rule(tmp_path: Path) -> None:
    policy = tmp_path / "p.toml"
    policy.write_text('[profiles.agent]\ninternet = "open"\nallow = [{ domain = "pypi.org" }]\n')
    plan = make_plan(policy)
    assert [(t.address, t.port, t.rule) for t in plan.models] == [("10.77.0.10", 8000, None)]
    assert plan.fresh_name == "sg-doctor-c0ffee.pypi.org"  # open mode: below the known name


# -- the judge ---------------------------------------------------------------------------------


def test_a_healthy_world_passes_every_hop_in_order() -> None:
    plan = make_plan()
    hops = judge(plan, healthy(plan), FACTS)
    assert not failed(hops), [h for h in hops if h.status is Status.FAIL]
    assert all(h.status is Status.OK for h in hops)
    kinds = [next(k.key for k in HOPS if h.name.startswith(k.key)) for h in hops]
    assert kinds == sorted(kinds, key=[k.key for k in HOPS].index)  # the order traffic goes
    assert "CN=sandgate inspection CA" in hop(hops, "inspection api.openai.com").detail


Breaker = Callable[[dict[str, Any]], None]


def _set(path: str, value: Any) -> Breaker:
    def apply(seen: dict[str, Any]) -> None:
        *head, last = path.split(".")
        target: Any = seen
        for k in head:
            target = target[int(k)] if k.isdigit() else target[k]
        target[last] = value

    return apply


EDE23 = "23 (Network Error): (sandgate: upstream: no upstream resolver answered)"


def _passthrough(seen: dict[str, Any]) -> None:
    seen["inspected"][0]["direct"] = {"der": der(WORLD_CA, "api.openai.com")}


BROKEN: list[tuple[str, Breaker, str, tuple[str, ...]]] = [
    ("resolv.conf", _set("resolv_conf", {"nameservers": ["8.8.8.8"]}), "sandbox resolver",
     ("nameserver 10.201.0.1",)),
    ("resolver down", _set("dns_known", {"status": "none"}), "gateway resolver",
     ("sandgate down", "--watchdog")),
    ("name refused", _set("dns_known.ede", "15 (Blocked): sandgate: deny.rule"),
     "gateway resolver", ("sandgate explain pypi.org",)),
    ("upstream down", _set("dns_fresh.status", "SERVFAIL"), "upstream DNS",
     (topology.RESOLVER, "upstream_dns")),
    ("upstream down, said by the gateway", _set("dns_fresh", {"status": "SERVFAIL", "ede": EDE23}),
     "upstream DNS", (topology.RESOLVER, "Network Error")),
    ("proxy down", _set("doors.explicit", {"code": "000", "error": "refused"}),
     "explicit proxy", ("sandgate down",)),
    ("door refuses", _set("doors.transparent.sandgate_reason", "deny.rule"),
     "transparent proxy :80", ("sandgate log --session s1 --kind http",)),
    ("model unreachable", _set("models.0.connect", "OSError: No route to host"),
     "model server 10.77.0.10:8000", ("agent.allow[0] (model server) allows it",)),
    ("not a model server", _set("models.0.paths", {"http://x/v1/models": "404"}),
     "model server 10.77.0.10:8000", ("/v1/models", "/api/tags")),
    ("passthrough", _passthrough, "inspection api.openai.com",
     ("raw tunnel", "direct", "sandgate explain api.openai.com:443")),
    ("node untrusting", _set("env.NODE_EXTRA_CA_CERTS", ""), "CA wiring: node",
     ("NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt",)),
    ("bundle without CA", _set("bundles", {BUNDLE: {"readable": True, "gateway_ca": False}}),
     "CA wiring: curl", ("point CURL_CA_BUNDLE at",)),
    ("git distrusts", _set("tools.git", {"installed": True, "trusted": False, "detail": "SSL"}),
     "CA wiring: git", ("GIT_SSL_CAINFO",)),
    ("proxy var", _set("env.HTTPS_PROXY", "http://elsewhere:8080"), "proxy variables",
     (PROXY,)),
    ("no_proxy star", _set("env.NO_PROXY", "*"), "proxy variables", ("localhost,127.0.0.1",)),
    ("9 minutes", _set("clock.start", NOW + 540), "clock skew", ("chrony", "9 minutes")),
    ("world date", _set("date.date", email.utils.formatdate(NOW - 600, usegmt=True)),
     "clock skew", ("timedatectl",)),
    ("uplink", _set("uplink", {"code": "000", "error": "timed out"}), "uplink",
     ("sandgate up --world test",)),
]  # fmt: skip


@pytest.mark.parametrize(("what", "breaker", "name", "words"), BROKEN, ids=[b[0] for b in BROKEN])
def test_a_broken_observation_fails_its_hop_with_the_fix(
    what: str, breaker: Breaker, name: str, words: tuple[str, ...]
) -> None:
    plan = make_plan()
    seen = copy.deepcopy(healthy(plan))
    breaker(seen)
    hops = judge(plan, seen, FACTS)
    h = hop(hops, name)
    assert h.status is Status.FAIL, h
    for word in words:
        assert word in h.fix + " " + h.detail, (word, h)
    assert failed(hops)


def test_a_missing_model_rule_fix_names_the_rule_to_add(tmp_path: Path) -> None:
    policy = tmp_path / "p.toml"
    policy.write_text('[profiles.agent]\ninternet = "open"\n')
    plan = make_plan(policy)
    seen = healthy(plan)
    seen["models"] = [{"address": "10.77.0.10", "port": 8000, "connect": "OSError: No route"}]
    h = hop(judge(plan, seen, GatewayFacts(policy=str(policy))), "model server 10.77.0.10:8000")
    assert h.status is Status.FAIL
    assert h.fix == (
        'add { host = "10.77.0.10", port = 8000, name = "model server" } to '
        f"[profiles.agent] allow in {policy}"
    )


def test_the_gateway_facts_decide_the_fix() -> None:
    plan = make_plan()
    seen = healthy(plan)
    seen["dns_known"] = {"status": "none"}
    cut = hop(judge(plan, seen, GatewayFacts(resolver_cut=True)), "gateway resolver")
    assert "cut its guests off" in cut.fix
    h = hop(judge(plan, healthy(plan), GatewayFacts(forwarding=False)), "uplink")
    assert h.status is Status.FAIL and "forwarding is off" in h.detail


def test_an_uninstalled_tool_is_skipped_and_does_not_fail_the_run() -> None:
    plan = make_plan()
    seen = healthy(plan)
    seen["tools"]["requests"] = {"installed": False}
    hops = judge(plan, seen, FACTS)
    assert hop(hops, "CA wiring: requests").status is Status.SKIP
    assert not failed(hops)


def test_offline_doors_pass_only_on_the_gateways_own_refusal() -> None:
    plan = make_plan(world=None)
    seen = healthy(plan)
    seen["doors"]["explicit"]["sandgate_reason"] = "deny.special_name"
    seen["doors"]["transparent"]["sandgate_reason"] = None  # someone else answered
    hops = judge(plan, seen, FACTS)
    assert hop(hops, "explicit proxy").status is Status.OK
    assert hop(hops, "transparent proxy :80").status is Status.FAIL


def test_issuer_of_garbage_is_none() -> None:
    assert issuer_of("bm90IGEgY2VydA==") is None
    assert issuer_of("***") is None


def test_a_failed_hop_always_carries_a_fix() -> None:
    with pytest.raises(ValueError):
        Hop("x", Status.FAIL, "broken")
    with pytest.raises(ValueError):
        Hop("x", Status.OK, "fine", "a fix for nothing")


def test_doctor_help_names_its_options() -> None:
    from typer.testing import CliRunner

    from sandgate.cli import app

    out = CliRunner().invoke(app, ["doctor", "--help"], terminal_width=200).output
    for flag in ("--world", "--policy", "--profile", "--instance", "--json"):
        assert flag in out
