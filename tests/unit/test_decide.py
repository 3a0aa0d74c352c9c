"""``decide()``: one table of attempts per profile, and the properties every profile keeps.

Each row reads ``attempt -> (locked, open, allowlist)``; an expectation is the reason key,
followed by the rule reference when a rule decided: ``"allow.exempt coder.allow[0]"``.
The rows follow the order of judgement in ``decide()``'s docstring, step by step.
"""

from __future__ import annotations

import ipaddress
from dataclasses import replace
from ipaddress import IPv4Address, IPv6Address

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sandgate.policy.decide import Attempt, Decision, Reason, Verdict, decide, decide_name
from sandgate.policy.load import parse_policy, parse_rule_text
from sandgate.policy.model import IPAddress, Mode, Protocol, RuleSpec
from sandgate.policy.profile import Profile, Rule

TCP, UDP, ICMP = Protocol.TCP, Protocol.UDP, Protocol.ICMP
GATEWAY = IPv4Address("10.201.0.21")  # guest 5's gateway in the pool 10.201.0.0/16

POLICY = parse_policy(
    b"""
[gateway]
guest_pool = "10.201.0.0/16"

[profiles.coder]
internet = "open"
allow = [
  { host = "10.77.0.10", port = 8000, name = "model server" },   # allow[0]
  { domain = "pypi.org" },                                        # allow[1]
  { domain = "*.github.com", port = 443 },                        # allow[2]
  { host = "151.101.0.223", port = 443, name = "pypi cdn" },      # allow[3]
  { host = "9.9.9.9", port = 853, name = "quad9 dot" },           # allow[4]
  { host = "1.0.0.1", port = 443, protocol = "udp" },             # allow[5]
  { cidr = "140.82.112.0/20", port = 22 },                        # allow[6]
]
# The gateway offers the LAN model server over TLS as models.lan on its own address.
front = [ { name = "models.lan", upstream = "http://10.77.0.10:8000" } ]
deny = [
  { domain = "gist.github.com", name = "no pastebins" },          # deny[0]
  { cidr = "10.77.0.0/24", port = 22, name = "no ssh on the lan" },  # deny[1]
  { cidr = "140.82.121.0/24", name = "not this part" },           # deny[2]
]

[profiles.exemptions]
internet = "locked"
allow = [
  { cidr = "10.77.0.0/24" },                                      # allow[0]
  { cidr = "0.0.0.0/0", port = 9418 },                            # allow[1]
  { cidr = "169.254.0.0/16", port = 123, protocol = "udp" },      # allow[2]
  { host = "169.254.170.2", port = 80, name = "ecs metadata" },   # allow[3]
  { cidr = "100.64.0.0/10" },                                     # allow[4]
  { cidr = "10.200.0.0/15", port = 8080 },                        # allow[5]
  { host = "fd00::1" },                                           # allow[6]
  { cidr = "2001:db8::/32" },                                     # allow[7]
  { host = "2606:4700::1111" },                                   # allow[8]
  { host = "::ffff:192.168.1.20", port = 631, name = "printer" }, # allow[9]
]
""",
    "policy.toml",
)


def coder(mode: Mode, **kw: object) -> Profile:
    return POLICY.profile("coder", mode=mode, gateway_address=GATEWAY, **kw)  # type: ignore[arg-type]


def ip(text: str) -> IPAddress:
    return ipaddress.ip_address(text)


def nat64(v4: str) -> IPv6Address:
    return IPv6Address(f"64:ff9b::{v4}")


def six_to_four(v4: str) -> IPv6Address:
    return IPv6Address((0x2002 << 112) | (int(IPv4Address(v4)) << 80) | 1)


def teredo(server: str, client: str) -> IPv6Address:
    """RFC 4380: the server's IPv4 in bits 32-63, the client's inverted in bits 96-127."""
    return IPv6Address(
        (0x20010000 << 96)
        | (int(IPv4Address(server)) << 64)
        | (int(IPv4Address(client)) ^ 0xFFFFFFFF)
    )


def mapped(v4: str | IPv4Address) -> IPv6Address:
    return IPv6Address(f"::ffff:{v4}")


def att(
    proto: Protocol,
    address: str | IPAddress | None,
    port: int | None = None,
    name: str | None = None,
) -> Attempt:
    addr = ip(address) if isinstance(address, str) else address
    return Attempt(proto, addr, port, name)


def outcome(d: Decision) -> str:
    return d.key if d.rule is None else f"{d.key} {d.rule.ref}"


def same(x: str) -> tuple[str, str, str]:
    return (x, x, x)


def by_mode(locked: str, open_: str, allowlist: str) -> tuple[str, str, str]:
    return (locked, open_, allowlist)


MODE_ONLY = by_mode("deny.locked", "allow.open", "deny.not_allowlisted")
assert tuple(Mode) == (Mode.LOCKED, Mode.OPEN, Mode.ALLOWLIST)  # the order of every row

# attempt -> (locked, open, allowlist), in decide()'s order of judgement.
CODER_TABLE = [
    # 1. DNS goes to the own gateway's resolver, never elsewhere (even with a rule for the address).
    ("dns-own-gateway-udp", att(UDP, "10.201.0.21", 53), same("allow.gateway_dns")),
    ("dns-own-gateway-tcp", att(TCP, "10.201.0.21", 53), same("allow.gateway_dns")),
    ("dns-own-gateway-mapped", att(UDP, mapped("10.201.0.21"), 53), same("allow.gateway_dns")),
    ("dns-public", att(UDP, "8.8.8.8", 53), same("deny.dns_redirect")),
    ("dns-public-tcp", att(TCP, "1.1.1.1", 53), same("deny.dns_redirect")),
    ("dns-lan", att(UDP, "10.77.0.10", 53), same("deny.dns_redirect")),
    ("dns-other-guest", att(UDP, "10.201.0.25", 53), same("deny.dns_redirect")),
    ("dns-mapped-public", att(UDP, mapped("8.8.8.8"), 53), same("deny.dns_redirect")),
    ("icmp-is-not-dns", att(ICMP, "8.8.8.8"), MODE_ONLY),
    ("udp-5353-is-not-dns", att(UDP, "8.8.8.8", 5353), MODE_ONLY),
    # 2. deny rules, before anything that could allow.
    ("deny-on-lan-before-exempt", att(TCP, "10.77.0.10", 22), same("deny.rule coder.deny[1]")),
    ("deny-inside-allow-cidr", att(TCP, "140.82.121.4", 22), same("deny.rule coder.deny[2]")),
    (
        "deny-by-name",
        att(TCP, "140.82.112.4", 443, "gist.github.com"),
        same("deny.rule coder.deny[0]"),
    ),
    (
        "deny-by-name-lookup",
        att(UDP, None, None, "gist.github.com"),
        same("deny.rule coder.deny[0]"),
    ),
    # 3. the guest pool: the own gateway's other ports, other guests.
    ("gateway-ssh", att(TCP, "10.201.0.21", 22), same("deny.gateway")),
    ("gateway-ping", att(ICMP, "10.201.0.21"), same("deny.gateway")),
    ("gateway-mapped", att(TCP, mapped("10.201.0.21"), 80), same("deny.gateway")),
    # ... but for its proxy, on TCP only: nothing listens on UDP there.
    ("gateway-proxy-explicit", att(TCP, "10.201.0.21", 3128), same("allow.gateway_proxy")),
    ("gateway-proxy-http", att(TCP, "10.201.0.21", 15080), same("allow.gateway_proxy")),
    ("gateway-proxy-tls", att(TCP, "10.201.0.21", 15443), same("allow.gateway_proxy")),
    ("gateway-proxy-mapped", att(TCP, mapped("10.201.0.21"), 3128), same("allow.gateway_proxy")),
    ("gateway-next-to-proxy", att(TCP, "10.201.0.21", 3129), same("deny.gateway")),
    ("gateway-proxy-port-udp", att(UDP, "10.201.0.21", 3128), same("deny.gateway")),
    ("gateway-proxy-tls-udp", att(UDP, "10.201.0.21", 15443), same("deny.gateway")),
    ("other-guests-proxy", att(TCP, "10.201.0.25", 3128), same("deny.lateral")),
    ("other-guest", att(TCP, "10.201.0.26", 8080), same("deny.lateral")),
    ("other-guests-gateway", att(TCP, "10.201.0.25", 80), same("deny.lateral")),
    ("pool-edge-low", att(TCP, "10.201.0.0", 80), same("deny.lateral")),
    ("pool-edge-high", att(TCP, "10.201.255.255", 80), same("deny.lateral")),
    ("just-outside-pool", att(TCP, "10.202.0.0", 80), same("deny.private")),
    # 4. special-purpose addresses: denied by class unless an allow rule names the block or a part.
    ("model-server", att(TCP, "10.77.0.10", 8000), same("allow.exempt coder.allow[0]")),
    (
        "model-server-mapped",
        att(TCP, mapped("10.77.0.10"), 8000),
        same("allow.exempt coder.allow[0]"),
    ),
    ("model-server-other-port", att(TCP, "10.77.0.10", 8001), same("deny.private")),
    ("model-server-udp", att(UDP, "10.77.0.10", 8000), same("deny.private")),
    ("model-server-ping", att(ICMP, "10.77.0.10"), same("deny.private")),
    ("lan-neighbour", att(TCP, "10.77.0.11", 8000), same("deny.private")),
    ("home-router", att(TCP, "192.168.1.1", 80), same("deny.private")),
    ("loopback", att(TCP, "127.0.0.1", 8000), same("deny.loopback")),
    ("loopback-mapped", att(TCP, mapped("127.0.0.1"), 8000), same("deny.loopback")),
    ("metadata", att(TCP, "169.254.169.254", 80), same("deny.metadata")),
    ("metadata-mapped", att(TCP, mapped("169.254.169.254"), 80), same("deny.metadata")),
    ("metadata-alibaba", att(TCP, "100.100.100.200", 80), same("deny.metadata")),
    ("link-local", att(TCP, "169.254.1.1", 80), same("deny.link_local")),
    ("cgnat", att(TCP, "100.64.0.1", 443), same("deny.shared_cgnat")),
    ("this-host", att(TCP, "0.0.0.0", 80), same("deny.unspecified")),
    ("this-network", att(TCP, "0.1.2.3", 80), same("deny.this_network")),
    ("broadcast", att(UDP, "255.255.255.255", 67), same("deny.broadcast")),
    ("multicast", att(UDP, "224.0.0.251", 5353), same("deny.multicast")),
    ("class-e", att(TCP, "240.0.0.1", 80), same("deny.reserved")),
    ("documentation", att(TCP, "203.0.113.10", 443), same("deny.documentation")),
    ("benchmarking", att(TCP, "198.18.0.1", 443), same("deny.benchmarking")),
    # embedded IPv4 in IPv6: judged by the IPv4 inside; a private one denied by its class,
    # and never exempted (the gateway cannot route it), a public one denied as IPv6.
    ("nat64-model-server", att(TCP, nat64("10.77.0.10"), 8000), same("deny.private")),
    ("nat64-metadata", att(TCP, nat64("169.254.169.254"), 80), same("deny.metadata")),
    ("nat64-public", att(TCP, nat64("8.8.8.8"), 443), same("deny.ipv6")),
    ("6to4-private", att(TCP, six_to_four("10.0.0.1"), 80), same("deny.private")),
    ("6to4-loopback", att(TCP, six_to_four("127.0.0.1"), 80), same("deny.loopback")),
    ("6to4-public", att(TCP, six_to_four("8.8.8.8"), 443), same("deny.ipv6")),
    ("teredo-private-client", att(TCP, teredo("8.8.4.4", "10.0.0.1"), 80), same("deny.private")),
    ("teredo-private-server", att(TCP, teredo("192.168.0.1", "8.8.8.8"), 80), same("deny.private")),
    ("teredo-public", att(TCP, teredo("8.8.4.4", "8.8.8.8"), 443), same("deny.ipv6")),
    ("v4-compatible-loopback", att(TCP, ip("::127.0.0.1"), 80), same("deny.loopback")),
    ("ipv6-loopback", att(TCP, "::1", 80), same("deny.loopback")),
    ("ipv6-ula", att(TCP, "fd00::1", 80), same("deny.unique_local")),
    ("ipv6-link-local", att(TCP, "fe80::1", 80), same("deny.link_local")),
    ("ipv6-metadata", att(TCP, "fd00:ec2::254", 80), same("deny.metadata")),
    # 5. IPv6 that is not IPv4-mapped.
    ("ipv6-public", att(TCP, "2606:4700::1111", 443), same("deny.ipv6")),
    ("ipv6-public-by-name", att(TCP, "2a04:4e42::223", 443, "pypi.org"), same("deny.ipv6")),
    # 6. an allow rule for the address (it opens a path in every mode, locked included).
    ("host-rule", att(TCP, "151.101.0.223", 443), same("allow.rule coder.allow[3]")),
    ("host-rule-mapped", att(TCP, mapped("151.101.0.223"), 443), same("allow.rule coder.allow[3]")),
    ("host-rule-other-port", att(TCP, "151.101.0.223", 8443), MODE_ONLY),
    ("cidr-rule-edge-low", att(TCP, "140.82.112.0", 22), same("allow.rule coder.allow[6]")),
    ("cidr-rule-edge-high", att(TCP, "140.82.127.255", 22), same("allow.rule coder.allow[6]")),
    ("cidr-rule-just-outside", att(TCP, "140.82.128.0", 22), MODE_ONLY),
    # 7. QUIC and DNS-over-TLS, unless an address rule covers them.
    ("quic", att(UDP, "1.1.1.1", 443), same("deny.quic")),
    ("quic-by-name", att(UDP, "140.82.112.4", 443, "api.github.com"), same("deny.quic")),
    ("quic-allowed-by-address-rule", att(UDP, "1.0.0.1", 443), same("allow.rule coder.allow[5]")),
    ("https-same-address", att(TCP, "1.1.1.1", 443), MODE_ONLY),
    ("dot", att(TCP, "1.1.1.1", 853), same("deny.dns_bypass")),
    ("doq", att(UDP, "1.1.1.1", 853), same("deny.dns_bypass")),
    ("dot-allowed-by-address-rule", att(TCP, "9.9.9.9", 853), same("allow.rule coder.allow[4]")),
    ("doq-not-covered-by-tcp-rule", att(UDP, "9.9.9.9", 853), same("deny.dns_bypass")),
    # 8. names: a lookup (no address, no port) resolves through any allow rule for the name.
    ("lookup-allowed", att(UDP, None, None, "pypi.org"), same("allow.rule coder.allow[1]")),
    (
        "lookup-port-scoped-rule",
        att(UDP, None, None, "api.github.com"),
        same("allow.rule coder.allow[2]"),
    ),
    ("lookup-wildcard-not-base", att(UDP, None, None, "github.com"), MODE_ONLY),
    ("lookup-other", att(UDP, None, None, "example.org"), MODE_ONLY),
    # ... a connection by an allowed name: in locked mode only an address rule opens a path.
    (
        "connect-allowed-name",
        att(TCP, "140.82.112.4", 443, "api.github.com"),
        by_mode("deny.locked", "allow.rule coder.allow[2]", "allow.rule coder.allow[2]"),
    ),
    ("connect-name-port-not-in-rule", att(TCP, "140.82.113.4", 8443, "api.github.com"), MODE_ONLY),
    (
        "connect-name-and-host-rule",
        att(TCP, "151.101.0.223", 443, "pypi.org"),
        same("allow.rule coder.allow[3]"),
    ),
    ("connect-other-name", att(TCP, "93.184.215.14", 443, "example.org"), MODE_ONLY),
    ("name-only-connect", att(TCP, None, 443, "pypi.org"), same("allow.rule coder.allow[1]")),
    # ... rebinding: a name that resolves to a special address.
    ("rebinding-allowed-name", att(TCP, "10.0.0.5", 443, "pypi.org"), same("deny.rebinding")),
    ("rebinding-open-name", att(TCP, "192.168.1.1", 443, "example.org"), same("deny.rebinding")),
    ("rebinding-metadata", att(TCP, "169.254.169.254", 80, "pypi.org"), same("deny.rebinding")),
    ("rebinding-mapped", att(TCP, mapped("127.0.0.1"), 443, "pypi.org"), same("deny.rebinding")),
    ("rebinding-nat64", att(TCP, nat64("10.0.0.5"), 443, "pypi.org"), same("deny.rebinding")),
    (
        "name-to-exempt-address",
        att(TCP, "10.77.0.10", 8000, "models.lan"),
        same("allow.exempt coder.allow[0]"),
    ),
    ("name-to-guest-pool", att(TCP, "10.201.0.26", 443, "pypi.org"), same("deny.lateral")),
    # ... a front: the gateway answers the name itself, on its own address and TLS port only.
    ("front-lookup", att(UDP, None, None, "models.lan"), same("allow.front")),
    ("front-on-gateway-443", att(TCP, "10.201.0.21", 443, "models.lan"), same("allow.front")),
    ("front-on-gateway-no-port", att(TCP, "10.201.0.21", None, "models.lan"), same("allow.front")),
    ("front-on-gateway-ssh", att(TCP, "10.201.0.21", 22, "models.lan"), same("deny.gateway")),
    ("front-on-gateway-80", att(TCP, "10.201.0.21", 80, "models.lan"), same("deny.gateway")),
    ("front-on-gateway-quic", att(UDP, "10.201.0.21", 443, "models.lan"), same("deny.gateway")),
    ("front-on-gateway-ping", att(ICMP, "10.201.0.21", None, "models.lan"), same("deny.gateway")),
    ("front-name-elsewhere", att(TCP, "93.184.215.14", 443, "models.lan"), MODE_ONLY),
    ("front-name-other-guest", att(TCP, "10.201.0.25", 443, "models.lan"), same("deny.lateral")),
    # 9. the mode: covered by MODE_ONLY rows above.
]


@pytest.mark.parametrize(
    ("attempt", "expected"),
    [pytest.param(a, e, id=i) for i, a, e in CODER_TABLE],
)
def test_coder_table(attempt: Attempt, expected: tuple[str, str, str]) -> None:
    got = tuple(outcome(decide(coder(mode), attempt)) for mode in Mode)
    assert got == expected


def exemptions(**kw: object) -> Profile:
    return POLICY.profile("exemptions", gateway_address=GATEWAY, **kw)  # type: ignore[arg-type]


# The same in every mode: exemptions are settled before the mode is asked.
EXEMPTION_TABLE = [
    (
        "cidr-exempts-a-part-of-10/8",
        att(TCP, "10.77.0.5", 1234),
        "allow.exempt exemptions.allow[0]",
    ),
    ("cidr-edge-low", att(UDP, "10.77.0.0", 1), "allow.exempt exemptions.allow[0]"),
    ("cidr-edge-high", att(ICMP, "10.77.0.255"), "allow.exempt exemptions.allow[0]"),
    ("just-outside-cidr", att(TCP, "10.77.1.0", 1234), "deny.private"),
    ("mapped-exempt", att(TCP, mapped("10.77.0.5"), 1234), "allow.exempt exemptions.allow[0]"),
    ("nat64-never-exempt", att(TCP, nat64("10.77.0.5"), 1234), "deny.private"),
    ("6to4-never-exempt", att(TCP, six_to_four("10.77.0.5"), 1234), "deny.private"),
    ("world-rule-opens-public", att(TCP, "8.8.8.8", 9418), "allow.rule exemptions.allow[1]"),
    ("world-rule-never-opens-10/8", att(TCP, "10.1.2.3", 9418), "deny.private"),
    ("world-rule-never-opens-loopback", att(TCP, "127.0.0.1", 9418), "deny.loopback"),
    ("world-rule-never-opens-metadata", att(TCP, "169.254.169.254", 9418), "deny.metadata"),
    ("link-local-rule", att(UDP, "169.254.1.1", 123), "allow.exempt exemptions.allow[2]"),
    ("link-local-rule-not-metadata", att(UDP, "169.254.169.254", 123), "deny.metadata"),
    ("link-local-rule-not-aws-ntp", att(UDP, "169.254.169.123", 123), "deny.metadata"),
    ("exact-metadata-rule", att(TCP, "169.254.170.2", 80), "allow.exempt exemptions.allow[3]"),
    ("exact-metadata-rule-other-port", att(TCP, "169.254.170.2", 81), "deny.metadata"),
    ("exact-metadata-rule-not-imds", att(TCP, "169.254.169.254", 80), "deny.metadata"),
    ("cgnat-rule", att(TCP, "100.101.1.1", 443), "allow.exempt exemptions.allow[4]"),
    ("cgnat-rule-not-alibaba-metadata", att(TCP, "100.100.100.200", 80), "deny.metadata"),
    ("pool-rule-never-opens-lateral", att(TCP, "10.201.0.26", 8080), "deny.lateral"),
    ("pool-rule-never-opens-gateway", att(TCP, "10.201.0.21", 8080), "deny.gateway"),
    # IPv6 rules: the gateway routes IPv4 only, so they open nothing, special or not.
    ("ipv6-ula-rule", att(TCP, "fd00::1", 80), "deny.ipv6"),
    ("ipv6-documentation-rule", att(TCP, "2001:db8::1", 80), "deny.ipv6"),
    ("ipv6-public-rule", att(TCP, "2606:4700::1111", 443), "deny.ipv6"),
    # A rule written as an IPv4-mapped address is that IPv4 rule.
    ("mapped-rule", att(TCP, "192.168.1.20", 631), "allow.exempt exemptions.allow[9]"),
    (
        "mapped-rule-mapped-attempt",
        att(TCP, mapped("192.168.1.20"), 631),
        "allow.exempt exemptions.allow[9]",
    ),
]


@pytest.mark.parametrize(
    ("attempt", "expected"), [pytest.param(a, e, id=i) for i, a, e in EXEMPTION_TABLE]
)
def test_exemption_table(attempt: Attempt, expected: str) -> None:
    assert [outcome(decide(exemptions(mode=m), attempt)) for m in Mode] == [expected] * 3


def test_without_a_known_gateway_its_address_is_just_the_pool() -> None:
    profile = POLICY.profile("coder")  # gateway_address None, as `explain` without a gateway
    assert outcome(decide(profile, att(TCP, "10.201.0.21", 22))) == "deny.lateral"
    assert outcome(decide(profile, att(UDP, "10.201.0.21", 53))) == "deny.dns_redirect"


TEST_INTERNET = (ipaddress.ip_network("203.0.113.0/24"),)


@pytest.mark.parametrize(
    ("override", "attempt", "expected"),
    [
        ((), att(TCP, "203.0.113.10", 443), same("deny.documentation")),
        (TEST_INTERNET, att(TCP, "203.0.113.10", 443), MODE_ONLY),
        (TEST_INTERNET, att(UDP, "203.0.113.10", 443), same("deny.quic")),
        (TEST_INTERNET, att(TCP, "198.51.100.10", 443), same("deny.documentation")),
        (TEST_INTERNET, att(TCP, "203.0.114.0", 443), MODE_ONLY),  # public anyway
        ((), att(TCP, "203.0.113.10", 443, "example.org"), same("deny.rebinding")),
        (TEST_INTERNET, att(TCP, "203.0.113.10", 443, "example.org"), MODE_ONLY),
        (
            TEST_INTERNET,
            att(TCP, "203.0.113.10", 443, "api.github.com"),
            by_mode("deny.locked", "allow.rule coder.allow[2]", "allow.rule coder.allow[2]"),
        ),
        # The override makes addresses public, nothing more: NAT64 forms stay special.
        (TEST_INTERNET, att(TCP, nat64("203.0.113.10"), 443), same("deny.documentation")),
        (TEST_INTERNET, att(TCP, mapped("203.0.113.10"), 443), MODE_ONLY),
    ],
)
def test_public_override(
    override: tuple[ipaddress.IPv4Network, ...], attempt: Attempt, expected: tuple[str, str, str]
) -> None:
    got = tuple(outcome(decide(coder(m, public_override=override), attempt)) for m in Mode)
    assert got == expected


def rules_profile(mode: Mode, allow: list[str], deny: list[str]) -> Profile:
    """A profile from --allow/--deny texts, built by hand (load would refuse dead rules)."""
    return Profile(
        "p",
        mode,
        allow=tuple(
            Rule("allow", parse_rule_text(t), f"--allow[{i}]") for i, t in enumerate(allow)
        ),
        deny=tuple(Rule("deny", parse_rule_text(t), f"--deny[{i}]") for i, t in enumerate(deny)),
    )


@pytest.mark.parametrize(
    ("allow", "deny", "name", "expected"),
    [
        # An allow rule lets its name resolve whatever ports or protocol it is scoped to ...
        ("pypi.org:443", "", "pypi.org", "allow.rule --allow[0]"),
        ("pypi.org:443/udp", "", "pypi.org", "allow.rule --allow[0]"),
        ("*.github.com/tcp", "", "api.github.com", "allow.rule --allow[0]"),
        ("pypi.org:443", "", "files.pypi.org", "deny.not_allowlisted"),
        # ... and a deny rule refuses a lookup only when it denies the name on every port and
        # protocol: "no ssh to github.com" must not make github.com unresolvable.
        ("github.com:443", "github.com", "github.com", "deny.rule --deny[0]"),
        ("github.com:443", "github.com:22", "github.com", "allow.rule --allow[0]"),
        ("github.com:443", "github.com:22/any", "github.com", "allow.rule --allow[0]"),
        ("github.com:443", "github.com/udp", "github.com", "allow.rule --allow[0]"),
    ],
)
def test_lookups_in_allowlist_mode(allow: str, deny: str, name: str, expected: str) -> None:
    profile = rules_profile(Mode.ALLOWLIST, [allow], [deny] if deny else [])
    assert outcome(decide_name(profile, name)) == expected
    # The connection is judged again with its port.
    if expected.startswith("allow") and ":443" in allow and "/udp" not in allow:
        conn = decide(profile, att(TCP, "140.82.112.4", 22, name))
        assert not conn.allowed


def test_decision_builders_and_keys() -> None:
    d = decide(coder(Mode.OPEN), att(TCP, "10.0.0.1", 80))
    assert (d.verdict, d.reason, d.key, d.allowed) == (
        Verdict.DENY,
        Reason.SPECIAL,
        "deny.private",
        False,
    )
    block = d.classification.block if d.classification is not None else None
    assert block is not None and str(block.network) == "10.0.0.0/8"
    assert "Private-use network" in d.explain()
    nothing = decide(coder(Mode.OPEN), Attempt(TCP))
    assert (nothing.verdict, nothing.key) == (Verdict.DENY, "deny.unparseable")
    allowed = decide(coder(Mode.LOCKED), att(TCP, "10.77.0.10", 8000))
    assert allowed.rule_ref == "coder.allow[0] (model server)"


# --- properties ----------------------------------------------------------------------------

PROFILES = [coder(m) for m in Mode] + [coder(m, public_override=TEST_INTERNET) for m in Mode]
PROFILES += [exemptions(mode=m) for m in Mode]


def _looks_numeric(last_label: str) -> bool:
    """A last label the URL host parser reads as a number (decimal, octal, 0x hex)."""
    text = last_label.lower()
    return text.isdigit() or (
        text.startswith("0x") and all(c in "0123456789abcdef" for c in text[2:])
    )


label = st.from_regex(r"[a-z0-9_]([a-z0-9_-]{0,14}[a-z0-9_])?", fullmatch=True)
dns_names = (
    st.lists(label, min_size=1, max_size=4)
    .map(".".join)
    .filter(lambda n: not _looks_numeric(n.rsplit(".", 1)[-1]))
)
interesting_names = st.sampled_from(
    ["pypi.org", "api.github.com", "gist.github.com", "github.com", "a.b.github.com", "models.lan"]
)
names = st.one_of(st.none(), interesting_names, dns_names)
v4 = st.ip_addresses(v=4)
v6 = st.ip_addresses(v=6)
edge_v4 = st.sampled_from(
    [
        IPv4Address(a)
        for a in (
            "10.77.0.10",
            "10.201.0.21",
            "10.201.0.22",
            "169.254.169.254",
            "127.0.0.1",
            "151.101.0.223",
            "1.0.0.1",
            "9.9.9.9",
            "140.82.112.0",
            "203.0.113.10",
            "0.0.0.0",
            "255.255.255.255",
            "100.100.100.200",
            "192.168.1.20",
        )
    ]
)
addresses = st.one_of(
    st.none(),
    v4,
    v6,
    edge_v4,
    edge_v4.map(mapped),
    v4.map(mapped),
    edge_v4.map(lambda a: nat64(str(a))),
)
ports = st.one_of(
    st.none(), st.sampled_from([22, 53, 80, 443, 631, 853, 8000, 8080, 9418]), st.integers(0, 65535)
)
protocols = st.sampled_from(list(Protocol))
attempts = st.builds(Attempt, protocols, addresses, ports, names)
profiles = st.sampled_from(PROFILES)


# The reasons that name the rule that decided; every other decision names none.
RULE_REASONS = {Reason.RULE_ALLOW, Reason.RULE_DENY, Reason.EXEMPT}
# The reasons whose key is refined by the address's class (``deny.private``).
CLASS_REASONS = {Reason.SPECIAL, Reason.REBINDING, Reason.EXEMPT}
# What the mode alone refuses: an allow rule for the name may still open it.
MODE_DENIALS = {Reason.LOCKED, Reason.NOT_ALLOWLISTED}


@settings(max_examples=1500)
@given(profiles, attempts)
def test_decide_is_total(profile: Profile, attempt: Attempt) -> None:
    d = decide(profile, attempt)
    assert d.key.startswith(d.verdict.value + ".")
    # A log line names a rule exactly when one decided, and it is a rule of this profile.
    assert (d.rule is not None) == (d.reason in RULE_REASONS), outcome(d)
    if d.rule is not None:
        assert d.rule in profile.rules() and d.rule.action == d.verdict.value, outcome(d)
    if d.reason in CLASS_REASONS:
        assert d.classification is not None and d.classification.special, outcome(d)


@given(profiles, attempts, st.text(max_size=40))
def test_any_name_text_never_reopens_what_the_address_closes(
    profile: Profile, attempt: Attempt, text: str
) -> None:
    """Whatever text a client puts in SNI or Host, the address-level steps still hold, and a
    name no rule speaks to is judged by the mode alone."""
    named = decide(profile, replace(attempt, name=text))
    bare = decide(profile, replace(attempt, name=None))
    closed = not bare.allowed and bare.reason not in MODE_DENIALS
    if attempt.address is not None and closed and profile.front(text) is None:
        assert not named.allowed, (outcome(bare), outcome(named))
    looked = decide_name(profile, text)
    if profile.front(text) is None and not any(r.matches_lookup(text) for r in profile.rules()):
        by_mode = {Mode.OPEN: "allow.open", Mode.LOCKED: "deny.locked"}
        assert looked.key == by_mode.get(profile.mode, "deny.not_allowlisted"), outcome(looked)


def matching_deny_rule(attempt: Attempt, by_name: bool) -> Rule:
    """A deny rule made from the attempt itself (its address or its name), so it matches it."""
    fields: dict[str, object] = {}
    if attempt.name is not None and (by_name or attempt.address is None):
        fields["domain"] = attempt.name
    else:
        fields["host"] = str(attempt.address)
    if attempt.address is not None or attempt.port is not None:  # not a lookup
        fields["protocol"] = attempt.protocol.value
        if attempt.port and attempt.protocol is not ICMP:
            fields["port"] = attempt.port
    return Rule("deny", RuleSpec.model_validate(fields), "--deny[9]")


def dns_to_own_gateway(profile: Profile, attempt: Attempt) -> bool:
    a = attempt.address
    a = a.ipv4_mapped if isinstance(a, IPv6Address) and a.ipv4_mapped is not None else a
    return attempt.port == 53 and attempt.protocol is not ICMP and a == profile.gateway_address


@settings(max_examples=1000)
@given(profiles, attempts, st.booleans())
def test_deny_rules_always_win(profile: Profile, attempt: Attempt, by_name: bool) -> None:
    assume(attempt.address is not None or attempt.name is not None)
    rule = matching_deny_rule(attempt, by_name)
    denied = replace(profile, deny=(*profile.deny, rule))
    d = decide(denied, attempt)
    if dns_to_own_gateway(profile, attempt):
        # Step 1 comes first: the own resolver is always reachable (it judges names itself).
        assert d.allowed and d.reason is Reason.GATEWAY_DNS
    else:
        assert d.verdict is Verdict.DENY, (str(rule), outcome(d))


@settings(max_examples=1000)
@given(
    st.sampled_from(["coder", "exemptions"]),
    st.booleans(),
    protocols,
    st.one_of(v4, v6, edge_v4, edge_v4.map(mapped)),
    ports,
)
def test_modes_are_monotone_for_addresses(
    name: str, override: bool, proto: Protocol, address: IPAddress, port: int | None
) -> None:
    attempt = Attempt(proto, address, port)
    verdicts = {}
    for m in Mode:
        profile = POLICY.profile(
            name, mode=m, gateway_address=GATEWAY, public_override=TEST_INTERNET if override else ()
        )
        verdicts[m] = decide(profile, attempt).allowed
    if verdicts[Mode.LOCKED]:
        assert verdicts[Mode.ALLOWLIST] and verdicts[Mode.OPEN]
    if verdicts[Mode.ALLOWLIST]:
        assert verdicts[Mode.OPEN]


@settings(max_examples=1000)
@given(profiles, st.one_of(v4, edge_v4), protocols, ports, names)
def test_mapped_is_judged_as_plain_ipv4(
    profile: Profile, address: IPv4Address, proto: Protocol, port: int | None, name: str | None
) -> None:
    assert decide(profile, Attempt(proto, mapped(address), port, name)) == decide(
        profile, Attempt(proto, address, port, name)
    )


@given(profiles, v6.filter(lambda a: a.ipv4_mapped is None), protocols, ports, names)
def test_ipv6_is_never_allowed_unless_mapped(
    profile: Profile, address: IPv6Address, proto: Protocol, port: int | None, name: str | None
) -> None:
    assert not decide(profile, Attempt(proto, address, port, name)).allowed
