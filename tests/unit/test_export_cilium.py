"""The Cilium and NetworkPolicy exports: the translation, the schema check, the warnings, and a
simulation of Cilium's semantics (tests/cilium_sim.py) against ``decide()`` on random attempts."""

from __future__ import annotations

import copy
import ipaddress
import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from sandgate.cli import app
from sandgate.errors import PolicyError
from sandgate.export import cilium, k8s
from sandgate.export.unexpressed import strict_error
from sandgate.policy.decide import Attempt, decide, decide_name
from sandgate.policy.load import Policy, parse_policy
from sandgate.policy.model import Mode, Protocol
from tests import cilium_sim as sim

ROOT = Path(__file__).resolve().parents[2]
# Hand-written for the subset the export writes, from Cilium 1.16's CRD (tests/data/cilium/).
SCHEMA = ROOT / "tests/data/cilium/cnp-v1.16-subset.schema.json"
HOMELAB = ROOT / "examples/homelab.toml"

# Every rule kind and mode; line numbers matter to the warning tests.
RICH = b"""\
[profiles.allow]
internet = "allowlist"
allow = [
  { host = "192.168.1.53", port = 8000 },
  { domain = "pypi.org" },
  { domain = "*.github.com", port = 443 },
  { domain = "api.example.com", port = 443 },
  { domain = "git.example.com", port = [22, "9000-9100"], protocol = "any" },
  { cidr = "203.0.113.0/24", port = 443 },
  { cidr = "198.18.0.0/15" },
  { domain = "ping.example.net", protocol = "icmp" },
]
deny = [
  { domain = "gist.github.com" },
  { domain = "pypi.org", port = 22 },
  { host = "8.8.4.4" },
  { cidr = "1.2.3.0/24", port = 80 },
]

[profiles.open]
internet = "open"
allow = [ { cidr = "10.77.0.0/24", port = [8000, 8443] }, { host = "169.254.169.254" } ]
deny = [ { domain = "evil.example.org" }, { cidr = "5.0.0.0/8" } ]

[profiles.locked]
internet = "locked"
inspect = ["api.example.com"]
allow = [ { host = "10.77.0.10", port = 8000 }, { domain = "*.pkg.example.com" } ]

[profiles.locked.tunnels]
idle_seconds = 30
"""


@cache
def rich() -> Policy:
    return parse_policy(RICH, "rich.toml")


CIDR_FORMAT = jsonschema.FormatChecker()


@CIDR_FORMAT.checks("cidr", raises=ValueError)
def _cidr(value: object) -> bool:
    """Kubernetes' ``cidr`` format (Go's net.ParseCIDR): an address, a slash, a prefix length
    in range; host bits may be set."""
    if not isinstance(value, str):
        return True
    address, sep, length = value.partition("/")
    if not sep or not length.isdigit():
        raise ValueError(f"{value!r} is not address/prefix-length")
    ipaddress.ip_network(f"{address}/{length}", strict=False)
    return True


@cache
def validator() -> jsonschema.protocols.Validator:
    schema = json.loads(SCHEMA.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=CIDR_FORMAT)


def check(doc: Any) -> None:
    """Raise jsonschema.ValidationError unless ``doc`` is in the subset the schema allows."""
    validator().validate(doc)


def exports() -> list[tuple[Policy, str]]:
    from sandgate.policy.load import load_policy

    home = load_policy(HOMELAB)
    return [(rich(), n) for n in ("allow", "open", "locked")] + [
        (home, n) for n in sorted(home.file.profiles)
    ]


@pytest.mark.parametrize(("pol", "name"), exports(), ids=lambda v: getattr(v, "source", v))
def test_every_export_is_valid_against_the_schema(pol: Policy, name: str) -> None:
    doc = cilium.export_profile(pol, name, namespace="agents").document
    # Through YAML and back: what a cluster would be given.
    check(yaml.safe_load(yaml.safe_dump(doc)))


def _spoil_deny_fqdn(doc: dict[str, Any]) -> None:
    doc["spec"]["egressDeny"].append({"toFQDNs": [{"matchName": "gist.github.com"}]})


def _spoil_unknown_field(doc: dict[str, Any]) -> None:
    doc["spec"]["egress"][0]["toPort"] = doc["spec"]["egress"][0].pop("toPorts")  # a typo


def _spoil_protocol(doc: dict[str, Any]) -> None:
    doc["spec"]["egress"][0]["toPorts"][0]["ports"][0]["protocol"] = "ICMP"


def _spoil_port(doc: dict[str, Any]) -> None:
    doc["spec"]["egress"][0]["toPorts"][0]["ports"][0]["port"] = "65536"


def _spoil_cidr(doc: dict[str, Any]) -> None:
    doc["spec"]["egressDeny"][0]["toCIDRSet"][0]["cidr"] = "10.0.0.0/33"


def _spoil_both_selectors(doc: dict[str, Any]) -> None:
    doc["spec"]["egress"][0]["toPorts"][0]["rules"]["dns"][0]["matchPattern"] = "*.pypi.org"


def _spoil_deny_server_names(doc: dict[str, Any]) -> None:
    doc["spec"]["egressDeny"].append(
        {"toCIDRSet": [{"cidr": "1.2.3.0/24"}], "toPorts": [{"serverNames": ["pypi.org"]}]}
    )


def _spoil_icmp_family(doc: dict[str, Any]) -> None:
    deny = next(e for e in doc["spec"]["egressDeny"] if "icmps" in e)
    deny["icmps"][0]["fields"][0]["family"] = "IPv5"


def _spoil_label(doc: dict[str, Any]) -> None:
    doc["metadata"]["labels"]["sandgate.io/profile"] = "not a label value"


SPOILED = {
    "toFQDNs-in-egressDeny": _spoil_deny_fqdn,  # EgressDenyRule has no toFQDNs
    "unknown-field": _spoil_unknown_field,  # strict field validation, as kubectl apply
    "bad-protocol": _spoil_protocol,
    "port-out-of-range": _spoil_port,
    "bad-cidr": _spoil_cidr,  # only the format check catches this one
    "matchName-and-matchPattern": _spoil_both_selectors,
    "serverNames-in-egressDeny": _spoil_deny_server_names,
    "bad-icmp-family": _spoil_icmp_family,
    "bad-label-value": _spoil_label,
}


@pytest.mark.parametrize("spoil", SPOILED.values(), ids=SPOILED.keys())
def test_the_schema_check_can_fail(spoil: Any) -> None:
    # A copy: the document shares lists with the module (ICMP_ALL, KUBE_DNS).
    doc = copy.deepcopy(cilium.export_profile(rich(), "allow").document)
    check(doc)  # valid before
    spoil(doc)
    with pytest.raises(jsonschema.ValidationError):
        check(doc)


def _entries(doc: dict[str, Any], key: str) -> list[dict[str, Any]]:
    return list(doc["spec"][key])


def test_exemption_is_an_except_of_the_special_deny_and_refused_on_other_ports() -> None:
    doc = cilium.export_profile(rich(), "allow").document
    deny = _entries(doc, "egressDeny")
    whole = [e for e in deny if "toPorts" not in e and "icmps" not in e]
    cidrs = {c["cidr"]: c.get("except", []) for e in whole for c in e["toCIDRSet"]}
    assert cidrs["192.168.0.0/16"] == ["192.168.1.53/32"]
    assert "::/0" in cidrs
    others = [e for e in deny if any(c["cidr"] == "192.168.1.53/32" for c in e["toCIDRSet"])]
    ports = [p for e in others for r in e.get("toPorts", []) for p in r["ports"]]
    assert {"port": "1", "endPort": 7999, "protocol": "TCP"} in ports
    assert any("icmps" in e for e in others)  # ICMP to the model server is refused too
    allow = [e for e in _entries(doc, "egress") if "toCIDRSet" in e]
    assert any(
        e["toCIDRSet"] == [{"cidr": "192.168.1.53/32"}]
        and e["toPorts"] == [{"ports": [{"port": "8000", "protocol": "TCP"}]}]
        for e in allow
    )


def test_modes() -> None:
    op = cilium.export_profile(rich(), "open").document
    dns = op["spec"]["egress"][0]["toPorts"][0]["rules"]["dns"]
    assert dns == [{"matchPattern": "*"}]
    world = [
        e for e in op["spec"]["egress"] if e.get("toCIDRSet", [{}])[0].get("cidr") == "0.0.0.0/0"
    ]
    assert world and "10.0.0.0/8" in world[0]["toCIDRSet"][0]["except"]
    assert not any("toFQDNs" in e for e in op["spec"]["egress"])
    locked = cilium.export_profile(rich(), "locked").document
    assert not any("toFQDNs" in e for e in locked["spec"]["egress"])
    ldns = locked["spec"]["egress"][0]["toPorts"][0]["rules"]["dns"]
    assert ldns == [{"matchPattern": "*.pkg.example.com"}]  # names resolve: visibility only
    al = cilium.export_profile(rich(), "allow").document
    fqdn = [e for e in al["spec"]["egress"] if "toFQDNs" in e]
    api = next(e for e in fqdn if e["toFQDNs"] == [{"matchName": "api.example.com"}])
    assert api["toPorts"][0]["serverNames"] == ["api.example.com"]
    assert not any(e["toFQDNs"] == [{"matchPattern": "*.github.com"}] for e in fqdn)


def test_port_scoped_domain_deny_removes_its_ports_exactly() -> None:
    al = cilium.export_profile(rich(), "allow")
    pypi = [
        e for e in al.document["spec"]["egress"] if e.get("toFQDNs") == [{"matchName": "pypi.org"}]
    ]
    ports = [p for e in pypi for r in e.get("toPorts", []) for p in r["ports"]]
    assert {"port": "1", "endPort": 21, "protocol": "TCP"} in ports
    assert {"port": "23", "endPort": 65535, "protocol": "TCP"} in ports
    # Said exactly by name; only where an address rule allows the address would it be reached.
    assert {(w.feature, w.effect) for w in al.warnings if w.rule == "allow.deny[1]"} == {
        ("domain-deny", "widened")
    }


def line_of(text: str) -> int:
    return next(i for i, line in enumerate(RICH.decode().splitlines(), 1) if text in line)


def test_warnings_name_rule_and_line() -> None:
    got = {
        (w.feature, w.effect, w.rule, w.line)
        for w in cilium.export_profile(rich(), "allow").warnings
    }
    assert ("domain-deny", "narrowed", "allow.deny[0]", line_of('"gist.github.com"')) in got
    assert not any(w[2] == "allow.allow[2]" and w[0] == "wildcard-depth" for w in got)
    op = {
        (w.feature, w.effect, w.rule, w.line)
        for w in cilium.export_profile(rich(), "open").warnings
    }
    assert ("domain-deny", "widened", "open.deny[0]", line_of("evil.example.org")) in op
    lk = {
        (w.feature, w.effect, w.rule, w.line)
        for w in cilium.export_profile(rich(), "locked").warnings
    }
    assert ("wildcard-depth", "narrowed", "locked.allow[1]", line_of("*.pkg.example.com")) in lk
    assert ("inspect", "dropped", None, line_of("inspect =")) in lk
    assert ("tunnel-limits", "dropped", None, line_of("[profiles.locked.tunnels]")) in lk


def test_strict_makes_warnings_errors() -> None:
    warnings = list(cilium.export_profile(rich(), "allow").warnings)
    err = strict_error(warnings)
    assert isinstance(err, PolicyError)
    gist = line_of('"gist.github.com"')
    assert any(p.line == gist and "gist.github.com" in p.message for p in err.problems)


def test_cilium_wildcards_are_one_label_and_never_the_apex() -> None:
    one = {"matchPattern": "*.github.com"}
    assert sim.pattern_matches(one, "api.github.com")
    assert not sim.pattern_matches(one, "github.com")
    assert not sim.pattern_matches(one, "a.b.github.com")
    assert sim.pattern_matches({"matchPattern": "*"}, "anything.example")


def test_k8s_networkpolicy_cidrs_only() -> None:
    e = k8s.export_profile(rich(), "allow", namespace="agents")
    doc = e.document
    assert doc["kind"] == "NetworkPolicy" and doc["metadata"]["namespace"] == "agents"
    peers = [p for r in doc["spec"]["egress"] for p in r["to"]]
    assert {"ipBlock": {"cidr": "192.168.1.53/32"}} in peers
    assert not any("fqdn" in str(p).lower() for p in peers)
    assert {(w.feature, w.rule) for w in e.warnings} >= {("names", "allow.allow[1]")}
    assert any(w.feature == "dns-visibility" and w.effect == "widened" for w in e.warnings)


# --- the simulation: the export in Cilium's semantics against decide() ---------------------

NAMES = [
    "pypi.org", "api.github.com", "gist.github.com", "a.b.github.com", "github.com",
    "api.example.com", "git.example.com", "ping.example.net", "evil.example.org",
    "x.pkg.example.com", "pkg.example.com", "files.pythonhosted.org", "registry.npmjs.org",
    "raw.githubusercontent.com", "a.b.githubusercontent.com", "other.example",
]  # fmt: skip
ADDRESSES = [
    "192.168.1.53", "192.168.1.54", "10.77.0.10", "10.77.0.255", "10.78.0.1", "169.254.169.254",
    "169.254.169.253", "203.0.113.7", "198.18.5.5", "198.19.255.255", "8.8.4.4", "8.8.8.8",
    "1.2.3.4", "5.6.7.8", "127.0.0.1", "100.64.0.1", "93.184.216.34", "::ffff:192.168.1.53",
    "2001:db8::1", "2606:4700::1111", "0.0.0.0", "255.255.255.255", "224.0.0.1",
]  # fmt: skip
PORTS = [None, 1, 21, 22, 23, 53, 80, 443, 853, 7999, 8000, 8001, 8443, 9000, 9100, 9101, 65535]

addresses = st.one_of(
    st.sampled_from(ADDRESSES).map(ipaddress.ip_address),
    st.integers(0, 2**32 - 1).map(ipaddress.IPv4Address),
)
attempts = st.builds(
    sim.Try,
    protocol=st.sampled_from(["tcp", "udp", "icmp"]),
    address=st.one_of(st.none(), addresses),
    port=st.one_of(st.sampled_from(PORTS), st.integers(1, 65535)),
    name=st.one_of(st.none(), st.sampled_from(NAMES)),
)


def sandgate_says(pol: Policy, profile_name: str, t: sim.Try) -> bool:
    """The whole gateway: a name is resolved first (decide_name), then the connection judged."""
    profile = pol.profile(profile_name)
    if t.name is not None and not decide_name(profile, t.name).allowed:
        return False
    if t.address is None:
        return True
    port = None if t.protocol == "icmp" else t.port
    return decide(profile, Attempt(Protocol(t.protocol), t.address, port, t.name)).allowed


def explained(
    pol: Policy, name: str, export: cilium.Export, t: sim.Try, cilium_allows: bool
) -> bool:
    """Is this disagreement one a warning of the export announced?"""
    profile = pol.profile(name)
    rules = {r.ref: r for r in profile.rules()}
    for w in export.warnings:
        rule = rules.get(w.rule or "")
        if rule is None or rule.spec.pattern is None or t.name is None:
            continue
        if w.feature == "wildcard-depth" and not cilium_allows:
            base = rule.spec.pattern.base
            if rule.spec.pattern.matches(t.name) and "." in t.name[: -len(base) - 1]:
                return True
        if w.feature == "domain-deny" and w.effect == "narrowed" and not cilium_allows:
            for allow in profile.allow:
                p = allow.spec.pattern
                if (
                    p
                    and p.matches(t.name)
                    and (p.covers(rule.spec.pattern) or rule.spec.pattern.covers(p))
                ):
                    return True
        if w.feature == "domain-deny" and w.effect == "widened" and cilium_allows:
            by_address = profile.mode is Mode.OPEN or (
                t.address is not None
                and sim.verdict(export.document, sim.Try(t.protocol, t.address, t.port))[0]
            )
            if rule.spec.pattern.matches(t.name) and by_address:
                return True
    return False


SIM_CASES = [(rich(), "allow"), (rich(), "open"), (rich(), "locked")]


@pytest.mark.parametrize("case", range(len(SIM_CASES)), ids=["allowlist", "open", "locked"])
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_simulated_cilium_agrees_with_decide(case: int, data: st.DataObject) -> None:
    pol, name = SIM_CASES[case]
    export = _export(case)
    t = data.draw(attempts)
    if (t.address is None and t.name is None) or (t.port is None and t.protocol != "icmp"):
        return
    ours = sandgate_says(pol, name, t)
    theirs, _ = sim.verdict(export.document, t)
    if ours != theirs:
        assert explained(pol, name, export, t, theirs), (t, ours, theirs, export.warnings)


@cache
def _export(case: int) -> cilium.Export:
    pol, name = SIM_CASES[case]
    return cilium.export_profile(pol, name)


@pytest.mark.parametrize(("pol", "name"), exports(), ids=lambda v: getattr(v, "source", v))
def test_every_address_cell_agrees(pol: Policy, name: str) -> None:
    # Address-only attempts, exhaustively over the table of edges: no warning excuses these.
    doc = cilium.export_profile(pol, name).document
    for a in ADDRESSES:
        for proto in ("tcp", "udp", "icmp"):
            for port in PORTS if proto != "icmp" else [None]:
                t = sim.Try(proto, ipaddress.ip_address(a), port)
                if port is None and proto != "icmp":
                    continue
                assert sandgate_says(pol, name, t) == sim.verdict(doc, t)[0], t


# --- the CLI -------------------------------------------------------------------------------


def test_cli_exports_one_profile_all_profiles_and_networkpolicy(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "coder-cnp.yaml"
    res = runner.invoke(
        app,
        ["export", "cilium", "--policy", str(HOMELAB), "--profile", "coder", "--out", str(out),
         "--namespace", "agents", "--selector", "sandgate.io/profile=coder"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    doc = yaml.safe_load(out.read_text())
    check(doc)
    assert doc["metadata"]["namespace"] == "agents"
    assert "homelab.toml:28" in res.output  # the deny rule it could not say
    folder = tmp_path / "cnp"
    res = runner.invoke(
        app, ["export", "cilium", "--policy", str(HOMELAB), "--all-profiles", "--out", str(folder)]
    )
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in folder.iterdir()) == [
        "sandgate-coder.yaml", "sandgate-offline.yaml", "sandgate-orchestrator.yaml",
    ]  # fmt: skip
    res = runner.invoke(
        app, ["export", "k8s-networkpolicy", "--policy", str(HOMELAB), "--profile", "offline"]
    )
    assert res.exit_code == 0, res.output
    assert yaml.safe_load(res.stdout)["kind"] == "NetworkPolicy"


def test_cli_strict_fails_with_the_line() -> None:
    res = CliRunner().invoke(
        app, ["export", "cilium", "--policy", str(HOMELAB), "--profile", "coder", "--strict"]
    )
    assert res.exit_code == 2
    assert "homelab.toml:28" in res.output
    ok = CliRunner().invoke(
        app, ["export", "cilium", "--policy", str(HOMELAB), "--profile", "offline", "--strict"]
    )
    assert ok.exit_code == 0, ok.output


CELLS = [
    ("udp", None), ("icmp", None), ("tcp", 22), ("tcp", 443), ("udp", 443), ("tcp", 8000),
    ("udp", 9050), ("tcp", 853),
]  # fmt: skip


@pytest.mark.parametrize("case", range(len(SIM_CASES)), ids=["allowlist", "open", "locked"])
def test_every_name_cell_agrees_or_is_warned(case: int) -> None:
    # Each name at each address of the table (a name may resolve anywhere: rebinding, IPv6).
    pol, name = SIM_CASES[case]
    export = _export(case)
    for n in NAMES:
        for a in [None, *ADDRESSES]:
            for proto, port in CELLS:
                if a is not None and port is None and proto != "icmp":
                    continue
                t = sim.Try(proto, ipaddress.ip_address(a) if a else None, port, n)
                ours, theirs = sandgate_says(pol, name, t), sim.verdict(export.document, t)[0]
                if ours != theirs:
                    assert explained(pol, name, export, t, theirs), (t, ours, theirs)
