"""The policy model: what a policy file may say, validated by pydantic.

A file holds named profiles. Each profile sets how open the internet is and lists ``allow``
and ``deny`` rules by host, CIDR or domain pattern, optionally scoped to ports and a protocol.
Values are normalised while validating (odd host spellings, IDNA, port ranges), so the rest
of sandgate only ever sees one spelling of each thing.
"""

from __future__ import annotations

import enum
import functools
import ipaddress
import re
from functools import cached_property
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from sandgate.policy.hostparse import HostParseError, IPHost, parse_host
from sandgate.policy.httprules import RequestRule, RequestRuleError, parse_request_rule
from sandgate.policy.limits import Limits, parse_cpus, parse_pids, parse_size
from sandgate.policy.patterns import DomainPattern, PatternError, parse_pattern

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class Mode(enum.StrEnum):
    """How much of the public internet a profile opens."""

    LOCKED = "locked"  # nothing but the exemptions its rules name
    OPEN = "open"  # every public address; private and special ranges still denied
    ALLOWLIST = "allowlist"  # only addresses that allowed names resolve to, and allowed hosts


class Protocol(enum.StrEnum):
    TCP = "tcp"
    UDP = "udp"
    ICMP = "icmp"


ALL_PROTOCOLS = frozenset(Protocol)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# Ports of a guest's gateway address the gateway keeps for itself: DNS, the proxy's three doors,
# and 80/443, which it redirects to the proxy. A host-loopback port must not hide one.
GATEWAY_SERVICE_PORTS = frozenset({53, 80, 443, 3128, 15080, 15443})


class RuleSpec(_Strict):
    """One allow or deny rule as written: exactly one of host, cidr, domain, host_loopback."""

    host: str | None = Field(default=None, description="one IP address (any common spelling)")
    cidr: str | None = Field(default=None, description="a network such as 10.77.0.0/24")
    domain: str | None = Field(default=None, description="a name or *.name pattern")
    host_loopback: int | None = Field(
        default=None,
        description="a TCP port of the host's own 127.0.0.1 (a model server), reached by guests "
        "on their gateway address",
    )
    port: int | list[int | str] | str | None = Field(
        default=None, description="a port, a list of ports, or a range '8000-8100'"
    )
    protocol: Literal["tcp", "udp", "icmp", "any"] | None = None
    name: str | None = Field(default=None, description="a label shown in logs")
    http: list[str] | None = Field(
        default=None, description='request rules: "METHOD /path" ("/prefix/*"), allow only'
    )
    process: list[str] | None = Field(
        default=None, description="only these executables (absolute paths), allow only"
    )
    under: list[str] | None = Field(
        default=None,
        description="with process: the executable's parents, nearest first (absolute paths), "
        "e.g. git run by the framework itself rather than by a shell",
    )

    @model_validator(mode="after")
    def _one_target(self) -> RuleSpec:
        given = [
            k for k in ("host", "cidr", "domain", "host_loopback") if getattr(self, k) is not None
        ]
        if len(given) != 1:
            raise ValueError(
                "a rule needs exactly one of host, cidr or domain"
                + (f" (it has {', '.join(given)})" if given else "")
                + (" or host_loopback alone" if "host_loopback" in given else "")
            )
        if self.host_loopback is not None and self.port is not None:
            raise ValueError(
                f"host_loopback = {self.host_loopback} is the port already; drop 'port'"
            )
        if self.host_loopback is not None and self.protocol not in (None, "tcp"):
            raise ValueError("host_loopback forwards TCP only; drop 'protocol'")
        if self.ports and self.protocols == frozenset({Protocol.ICMP}):
            raise ValueError("ICMP has no ports; drop 'port' or choose protocol tcp or udp")
        if self.http is not None:
            _check_request_scope(self)
        if self.process is not None:
            _check_process_scope(self)
        if self.under is not None and self.process is None:
            raise ValueError(
                "'under' names the parents of a process rule's executable; add "
                'process = ["/usr/bin/..."] or drop \'under\''
            )
        return self

    @cached_property
    def requests(self) -> tuple[RequestRule, ...]:
        """The request rules; empty means the rule does not look at requests."""
        return tuple(parse_request_rule(t) for t in self.http or ())

    @cached_property
    def network(self) -> IPNetwork | None:
        if self.host is not None:
            return _unmapped(_host_network(self.host))
        return _unmapped(_cidr_network(self.cidr)) if self.cidr is not None else None

    @cached_property
    def pattern(self) -> DomainPattern | None:
        if self.domain is None:
            return None
        try:
            return parse_pattern(self.domain)
        except PatternError as exc:
            raise ValueError(str(exc)) from exc

    @cached_property
    def ports(self) -> tuple[tuple[int, int], ...]:
        """Inclusive port ranges; empty means every port. A request rule without a port is
        for the ports its requests are judged on: 80 and 443 for a name, 80 for a host."""
        if self.host_loopback is not None:
            return ((self.host_loopback, self.host_loopback),)
        if (self.http is not None or self.process is not None) and self.port is None:
            return ((80, 80),) if self.host is not None else ((80, 80), (443, 443))
        return _port_ranges(self.port)

    @cached_property
    def protocols(self) -> frozenset[Protocol]:
        return _protocols(self.protocol, has_ports=bool(self.ports))

    # Field validators check each value where it is written, so errors point at that key.
    @field_validator("host")
    @classmethod
    def _check_host(cls, v: str | None) -> str | None:
        if v is not None:
            _host_network(v)
        return v

    @field_validator("cidr")
    @classmethod
    def _check_cidr(cls, v: str | None) -> str | None:
        if v is not None:
            _cidr_network(v)
        return v

    @field_validator("domain")
    @classmethod
    def _check_domain(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                parse_pattern(v)
            except PatternError as exc:
                raise ValueError(str(exc)) from exc
        return v

    @field_validator("host_loopback", mode="before")
    @classmethod
    def _check_host_loopback(cls, v: object) -> object:
        if v is None:
            return v
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 65535:
            raise ValueError(
                f"host_loopback = {v!r} must be one TCP port from 1 to 65535 "
                "(the port the server listens on at the host's 127.0.0.1)"
            )
        if v in GATEWAY_SERVICE_PORTS:
            raise ValueError(
                f"port {v} of the gateway address is the gateway's own "
                f"({', '.join(map(str, sorted(GATEWAY_SERVICE_PORTS)))}: DNS and the proxy); "
                "run the server on another port"
            )
        return v

    @field_validator("http")
    @classmethod
    def _check_http(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        if not v:
            raise ValueError(
                "an empty http list would refuse every request; drop 'http' to allow them all"
            )
        for item in v:
            try:
                parse_request_rule(item)
            except RequestRuleError as exc:
                raise ValueError(str(exc)) from exc
        return v

    @field_validator("process", "under")
    @classmethod
    def _check_process(cls, v: list[str] | None, info: ValidationInfo) -> list[str] | None:
        if v is None:
            return v
        if not v:
            raise ValueError(
                f"an empty {info.field_name} list would match nothing; drop '{info.field_name}'"
            )
        for item in v:
            if not item.startswith("/") or "/../" in item or item.endswith("/"):
                raise ValueError(
                    f"{item!r} is not an absolute path to an executable; write it as the "
                    "kernel names it, e.g. /usr/bin/git (see `sandgate log` details.process.exe)"
                )
        return v

    @field_validator("port", mode="before")
    @classmethod
    def _check_port(cls, v: object) -> object:
        # Before pydantic's own coercion, which would read `true` as port 1 and report one
        # wrong value three times (once per member of the union).
        items = v if isinstance(v, list) else [v]
        if v is not None and not all(
            isinstance(i, int | str) and not isinstance(i, bool) for i in items
        ):
            raise ValueError(
                f"port {v!r} must be a number from 1 to 65535, a list of them, "
                "or a range like '8000-8100'"
            )
        _port_ranges(v)  # type: ignore[arg-type]
        return v

    def target_text(self) -> str:
        """The rule's target as the CLI writes it: host, cidr or pattern[:port][/proto]."""
        if self.host_loopback is not None:
            return f"host-loopback:{self.host_loopback}"
        if self.pattern is not None:
            text = str(self.pattern)
        else:
            assert self.network is not None
            net = self.network
            single = net.num_addresses == 1
            addr = str(net.network_address) if single else str(net)
            text = f"[{addr}]" if single and net.version == 6 and self.ports else addr
        if self.ports:
            text += ":" + ",".join(str(a) if a == b else f"{a}-{b}" for a, b in self.ports)
        if self.protocols != ALL_PROTOCOLS and not (
            self.ports and self.protocols == frozenset({Protocol.TCP})
        ):
            text += "/" + "+".join(sorted(p.value for p in self.protocols))
        return text


def _check_request_scope(spec: RuleSpec) -> None:
    """Where request rules can be enforced: HTTP over TCP, on a port the proxy judges."""
    if spec.protocol is not None and spec.protocol != "tcp":
        raise ValueError(
            f"request rules (http) are for HTTP over TCP, but this rule is protocol "
            f"{spec.protocol!r}; drop 'protocol' or put the {spec.protocol} part in a rule "
            "of its own"
        )
    if spec.cidr is not None:
        raise ValueError(
            "request rules (http) name one host or a domain, not a network; write "
            'host = "ADDRESS" with a port'
        )
    ports = _port_ranges(spec.port)
    if any(low != high for low, high in ports):
        raise ValueError("a request rule's ports are given one by one, not as a range")
    numbers = {low for low, _ in ports}
    if spec.domain is not None and not numbers <= {80, 443}:
        raise ValueError(
            "a request rule on a domain is judged on HTTP (80) and HTTPS (443) only; for "
            "another port name the server by host (its plain HTTP is then intercepted)"
        )
    if spec.host is not None and 443 in numbers:
        raise ValueError(
            "a request rule on a host judges plain HTTP only (HTTPS to a bare address cannot "
            "be inspected); name the server by domain for HTTPS"
        )


def _check_process_scope(spec: RuleSpec) -> None:
    """Process rules are matched by the proxy, which knows each flow's process: HTTP and
    HTTPS by name (the kernel sends those names' flows to it)."""
    if spec.domain is None:
        raise ValueError(
            "a process rule names a domain (its HTTP and HTTPS go through the proxy, which "
            "knows the process); by address the kernel passes flows it cannot attribute"
        )
    if spec.protocol is not None and spec.protocol != "tcp":
        raise ValueError(f"a process rule is for TCP (HTTP, HTTPS), not {spec.protocol!r}")
    ports = {low for low, _ in _port_ranges(spec.port)}
    if not ports <= {80, 443} or any(lo != hi for lo, hi in _port_ranges(spec.port)):
        raise ValueError(
            "a process rule is matched on HTTP (80) and HTTPS (443) only; for git over ssh "
            "use its https:// URL"
        )


def _host_network(text: str) -> IPNetwork:
    if "/" in text:
        raise ValueError(f'{text!r} is a network, not one address; write cidr = "{text.strip()}"')
    try:
        host = parse_host(text)
    except HostParseError as exc:
        raise ValueError(str(exc)) from exc
    if not isinstance(host, IPHost):
        raise ValueError(f'{text!r} is a name, not an address; write domain = "{text}"')
    return ipaddress.ip_network(host.address)


def _unmapped(net: IPNetwork) -> IPNetwork:
    """An IPv4-mapped IPv6 host or network as the IPv4 it stands for.

    ``decide()`` judges ``::ffff:a.b.c.d`` as ``a.b.c.d`` and the ruleset holds IPv4 only, so
    a rule written in the mapped form must be that IPv4 rule, not a rule that never matches.
    """
    mapped = net.network_address.ipv4_mapped if isinstance(net, ipaddress.IPv6Network) else None
    if mapped is None or net.prefixlen < 96:
        return net
    return ipaddress.IPv4Network((mapped, net.prefixlen - 96))


# A plain dotted quad and prefix (no leading zeros, ASCII digits): read by numbers, a quarter
# of ip_network's time for 50,000 rules; anything else, and host bits set, the slow way.
_OCTET = "(0|[1-9][0-9]{0,2})"
_PLAIN_CIDR = re.compile(rf"{_OCTET}\.{_OCTET}\.{_OCTET}\.{_OCTET}/([0-9]|[12][0-9]|3[0-2])")


@functools.lru_cache(maxsize=1 << 17)  # read twice per rule, as parse_pattern (patterns.py)
def _cidr_network(text: str) -> IPNetwork:
    plain = _PLAIN_CIDR.fullmatch(text)
    if plain is not None:
        *octets, length = map(int, plain.groups())
        value = octets[0] << 24 | octets[1] << 16 | octets[2] << 8 | octets[3]
        if max(octets) <= 255 and not value & ((1 << (32 - length)) - 1):
            return ipaddress.IPv4Network((value, length))
    return _cidr_network_slow(text)


def _cidr_network_slow(text: str) -> IPNetwork:
    try:
        return ipaddress.ip_network(text.strip(), strict=True)
    except ValueError as exc:
        try:
            loose = ipaddress.ip_network(text.strip(), strict=False)
        except ValueError:
            raise ValueError(
                f"{text!r} is not a network; write it as address/prefix, e.g. 10.77.0.0/24"
            ) from exc
        raise ValueError(f"{text!r} has host bits set; did you mean {loose}?") from exc


def _port_ranges(spec: int | list[int | str] | str | None) -> tuple[tuple[int, int], ...]:
    if spec is None:
        return ()
    items: list[int | str] = list(spec) if isinstance(spec, list) else [spec]
    if not items:
        raise ValueError("an empty port list matches nothing; drop 'port' to mean every port")
    ranges: list[tuple[int, int]] = []
    for item in items:
        if isinstance(item, str) and "-" in item:
            low_s, _, high_s = item.partition("-")
            try:
                low, high = int(low_s), int(high_s)
            except ValueError as exc:
                raise ValueError(f"port range {item!r} must look like '8000-8100'") from exc
        else:
            try:
                low = high = int(item)
            except ValueError as exc:
                raise ValueError(f"port {item!r} is not a number") from exc
        if not (1 <= low <= high <= 65535):
            raise ValueError(f"port {item!r} is outside 1-65535 (or the range is reversed)")
        ranges.append((low, high))
    return tuple(sorted(set(ranges)))


def _protocols(spec: str | None, *, has_ports: bool) -> frozenset[Protocol]:
    if spec is None:
        # A port without a protocol almost always means TCP (a web or API port).
        return frozenset({Protocol.TCP}) if has_ports else ALL_PROTOCOLS
    if spec == "any":
        return frozenset({Protocol.TCP, Protocol.UDP}) if has_ports else ALL_PROTOCOLS
    return frozenset({Protocol(spec)})


class SecretSpec(_Strict):
    """A credential the sandbox sees only as a placeholder (used by the egress proxy)."""

    name: str
    hosts: list[str]
    value: str = Field(description="env:VAR or file:/path, read by the gateway only")
    placeholder_env: str | None = None
    placeholder_file: str | None = None
    placeholder: str | None = None

    @field_validator("value")
    @classmethod
    def _value_source(cls, v: str) -> str:
        if not v.startswith(("env:", "file:")):
            raise ValueError(
                "a secret's value must say where the gateway reads it: 'env:VAR' or 'file:/path'"
                " (never the secret itself in the policy file)"
            )
        return v


class FrontSpec(_Strict):
    """A plain-HTTP service (a LAN model server) the gateway offers over TLS under ``name``,
    with its own CA, streaming as the service streams (report 002's Caddy with
    ``flush_interval -1``). Its upstream must be allowed by an allow rule of the profile."""

    name: str = Field(description="the name the sandbox uses, e.g. models.lan")
    upstream: str = Field(description="http://ADDRESS:PORT of the service")

    @field_validator("name")
    @classmethod
    def _plain_name(cls, v: str) -> str:
        pattern = parse_pattern(v)
        if pattern.wildcard:
            raise ValueError("a front is one name, not a pattern")
        return pattern.base

    @field_validator("upstream")
    @classmethod
    def _http_url(cls, v: str) -> str:
        front_upstream(v)
        return v


def front_upstream(url: str) -> tuple[IPAddress, int]:
    """``http://10.77.0.10:8000`` → (address, port); the service must be named by address."""
    scheme, sep, rest = url.partition("://")
    host, _, port_text = rest.rstrip("/").rpartition(":")
    if scheme != "http" or not sep or not host or not port_text.isdigit():
        raise ValueError(f"{url!r}: write the upstream as http://ADDRESS:PORT")
    try:
        return ipaddress.ip_address(host.strip("[]")), int(port_text)
    except ValueError as exc:
        raise ValueError(
            f"{url!r}: the upstream must be an IP address (a name could rebind)"
        ) from exc


class TunnelLimits(_Strict):
    """Limits for connections the proxy relays itself (CONNECT tunnels, WebSockets)."""

    idle_seconds: float = Field(default=300, gt=0)
    max_seconds: float = Field(default=86400, gt=0)
    max_bytes: int | None = Field(default=None, gt=0, description="both directions together")


class LimitsSpec(BaseModel):
    """``[profiles.X.limits]``: any of pids, memory, cpus (the rest: the run's or defaults)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pids: int | None = Field(default=None, description="processes and threads together")
    memory: int | None = Field(default=None, description='bytes, or a size such as "2G"')
    cpus: float | None = Field(default=None, description="cores' worth of CPU time, e.g. 1.5")

    @field_validator("pids", mode="before")
    @classmethod
    def _pids(cls, v: object) -> object:
        return v if v is None else parse_pids(v)  # type: ignore[arg-type]

    @field_validator("memory", mode="before")
    @classmethod
    def _memory(cls, v: object) -> object:
        return v if v is None else parse_size(v)  # type: ignore[arg-type]

    @field_validator("cpus", mode="before")
    @classmethod
    def _cpus(cls, v: object) -> object:
        return v if v is None else parse_cpus(v)  # type: ignore[arg-type]

    def limits(self) -> Limits:
        return Limits(self.pids, self.memory, self.cpus)


class ProfileSpec(_Strict):
    description: str | None = None
    tunnels: TunnelLimits = Field(default_factory=TunnelLimits)
    internet: Mode = Mode.LOCKED
    allow: list[RuleSpec] = Field(default_factory=list)
    deny: list[RuleSpec] = Field(default_factory=list)
    inspect: list[str] = Field(default_factory=list)
    secret: list[SecretSpec] = Field(default_factory=list)
    front: list[FrontSpec] = Field(default_factory=list)
    limits: LimitsSpec = Field(default_factory=LimitsSpec)  # per-session pids/memory/cpus
    ask: bool = Field(
        default=False,
        description='internet = "ask": allowlist, and a new name waits for `sandgate approve`',
    )
    noexec: bool = Field(
        default=True,
        description="no program runs from where the agent writes (/work, /tmp, home); "
        "false opts out",
    )

    @model_validator(mode="before")
    @classmethod
    def _ask_mode(cls, data: object) -> object:
        # internet = "ask" is the allowlist mode with approvals (issue 14): decide() and the
        # kernel see an allowlist; the gateway asks before it refuses a new name.
        if isinstance(data, dict) and data.get("internet") == "ask":
            return {**data, "internet": "allowlist", "ask": True}
        return data

    @field_validator("inspect")
    @classmethod
    def _inspect_patterns(cls, v: list[str]) -> list[str]:
        for item in v:
            try:
                parse_pattern(item)
            except PatternError as exc:
                raise ValueError(str(exc)) from exc
        return v


DEFAULT_GUEST_POOL = "10.201.0.0/16"
GUEST_POOL_MAX_PREFIX = 28  # room for three guests' /30s and the watchdog's canary


IFNAME_MAX = 15  # the kernel's IFNAMSIZ less the NUL


def check_ifname(v: str) -> str:
    if not v or len(v) > IFNAME_MAX or not all(c.isalnum() or c in "-_." for c in v):
        raise ValueError(f"{v!r} is not an interface name (letters, digits, - _ ., at most 15)")
    return v


class GuestLinkSpec(_Strict):
    """One guest link of a gateway VM (issue 10): the interface, the one guest's profile behind
    it, and the hypervisor's bridge it is a port of (export gateway-vm names it so)."""

    link: str = Field(description="the gateway's interface to this guest, e.g. eth1")
    profile: str = Field(description="the profile of the one guest behind it")
    bridge: str | None = Field(default=None, description="the hypervisor's bridge; default sgbrN")

    @field_validator("link", "bridge")
    @classmethod
    def _names(cls, v: str | None) -> str | None:
        return v if v is None else check_ifname(v)


class GatewaySpec(_Strict):
    """How the gateway is wired: the daemon is started with exactly these (session/stack.py).

    Every key is used; a key the daemon would not use is an error, not silence.
    """

    upstream_dns: list[str] = Field(
        default_factory=list,
        description="resolvers the gateway asks; default: the host's (the test world's own)",
    )
    guest_pool: str = Field(
        default=DEFAULT_GUEST_POOL, description="one /30 per guest is taken from here"
    )
    default_profile: str | None = None
    # A gateway VM's handed interfaces (`sandgate gateway`, `export gateway-vm`); a gateway
    # on one host makes its own links and leaves these unset.
    uplink: str | None = Field(default=None, description="the gateway VM's uplink, e.g. eth0")
    guests: list[GuestLinkSpec] = Field(
        default_factory=list, description="one guest per link: [{ link, profile, bridge }]"
    )

    @field_validator("uplink")
    @classmethod
    def _uplink_name(cls, v: str | None) -> str | None:
        return v if v is None else check_ifname(v)

    @cached_property
    def pool(self) -> ipaddress.IPv4Network:
        net = _cidr_network(self.guest_pool)
        assert isinstance(net, ipaddress.IPv4Network)  # the validator allows IPv4 only
        return net

    @field_validator("upstream_dns")
    @classmethod
    def _addresses(cls, v: list[str]) -> list[str]:
        for item in v:
            try:
                ipaddress.ip_address(item)
            except ValueError as exc:
                raise ValueError(f"{item!r} is not an IP address of a DNS server") from exc
        return v

    @field_validator("guest_pool")
    @classmethod
    def _network(cls, v: str) -> str:
        net = _cidr_network(v)
        if net.version != 4:
            raise ValueError("sandgate routes IPv4 only; give an IPv4 network")
        if net.prefixlen > GUEST_POOL_MAX_PREFIX:
            raise ValueError(
                f"{v} has room for {net.num_addresses // 4} /30s; each guest takes one and the "
                f"watchdog's canary the last: give at least a /{GUEST_POOL_MAX_PREFIX}"
            )
        return v


class ExposeSpec(_Strict):
    """One inbound port forward: LAN clients ``from`` reach ``port`` of the guest of profile
    ``guest`` through the gateway's uplink address (report 001's reverse proxy reaching the
    orchestrator's dashboard). Nothing else comes in."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    guest: str = Field(description="the profile of the guest the port belongs to")
    port: int = Field(description="the TCP port, the same on the uplink and on the guest")
    sources: list[str] = Field(
        alias="from", description="the LAN clients allowed in: addresses or networks"
    )

    @field_validator("port", mode="before")
    @classmethod
    def _one_port(cls, v: object) -> object:
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 65535:
            raise ValueError(f"port = {v!r} must be one TCP port from 1 to 65535")
        return v

    @field_validator("sources", mode="before")
    @classmethod
    def _clients(cls, v: object) -> object:
        items = [v] if isinstance(v, str) else v
        if not isinstance(items, list) or not items:
            raise ValueError(
                'from names the clients allowed in: "192.168.1.10", or a list of addresses '
                "and networks (never everyone: a forward open to all is a hole)"
            )
        for item in items:
            net = _client_network(item)
            if net.prefixlen == 0:
                raise ValueError(
                    f"{item!r} is every address; name the clients (the reverse proxy's address)"
                )
        return items

    @cached_property
    def networks(self) -> tuple[ipaddress.IPv4Network, ...]:
        return tuple(_client_network(s) for s in self.sources)


def _client_network(item: object) -> ipaddress.IPv4Network:
    if not isinstance(item, str):
        raise ValueError(f'{item!r} is not an address; write it as a string, e.g. "192.168.1.10"')
    try:
        net = _unmapped(ipaddress.ip_network(item.strip(), strict=True))
    except ValueError as exc:
        raise ValueError(
            f"{item!r} is not an address or network, e.g. 192.168.1.10 or 192.168.1.0/24"
        ) from exc
    if not isinstance(net, ipaddress.IPv4Network):
        raise ValueError(f"{item!r}: the gateway routes IPv4 only")
    return net


class PolicyFile(_Strict):
    version: Literal[1] = 1
    gateway: GatewaySpec = Field(default_factory=GatewaySpec)
    profiles: dict[str, ProfileSpec]
    expose: list[ExposeSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _default_profile_exists(self) -> PolicyFile:
        # Custom error types, so the loader can point at the key they are about (a model-level
        # error has no location of its own).
        if not self.profiles:
            raise PydanticCustomError(
                "no_profiles", "a policy needs at least one profile, e.g. [profiles.default]"
            )
        default = self.gateway.default_profile
        if default is not None and default not in self.profiles:
            raise PydanticCustomError(
                "unknown_default_profile",
                "{default} is not a profile here; choose one of {choices}",
                {"default": repr(default), "choices": ", ".join(sorted(self.profiles))},
            )
        self._check_guest_links()
        return self

    def _check_guest_links(self) -> None:
        seen: set[str] = set()
        for g in self.gateway.guests:
            if g.profile not in self.profiles:
                raise PydanticCustomError(
                    "unknown_guest_profile",
                    "guest link {link}: {profile} is not a profile here; choose one of {choices}",
                    {
                        "link": g.link,
                        "profile": repr(g.profile),
                        "choices": ", ".join(sorted(self.profiles)),
                    },
                )
            if g.link == self.gateway.uplink:
                raise PydanticCustomError(
                    "uplink_is_guest",
                    "{link} is the uplink and a guest link; a guest link is its guest's alone",
                    {"link": g.link},
                )
            if g.link in seen:
                raise PydanticCustomError(
                    "guest_link_twice",
                    "{link} is named twice; one guest per link",
                    {"link": g.link},
                )
            seen.add(g.link)
