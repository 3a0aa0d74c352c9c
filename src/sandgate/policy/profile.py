"""The effective profile: what ``decide()`` consults for one guest.

A ``Profile`` is a profile of a policy file with the run's overrides applied (``--mode``,
``--allow``, ``--deny``) and with the few facts about the gateway that decisions need (the
guest pool, the guest's own gateway address). Rules carry a reference back to where they were
written (``coder.allow[2]`` or ``--allow[0]``) so every decision can name its rule.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Literal

from sandgate.policy.model import (
    ALL_PROTOCOLS,
    IPAddress,
    IPNetwork,
    Mode,
    Protocol,
    RuleSpec,
    SecretSpec,
)
from sandgate.policy.patterns import DomainPattern, parse_pattern

if TYPE_CHECKING:
    from sandgate.policy.index import RuleIndex

Action = Literal["allow", "deny"]


@dataclass(frozen=True, slots=True)  # no __dict__: one per rule of 100,000
class Rule:
    action: Action
    spec: RuleSpec
    ref: str  # where it was written: "coder.allow[2]" or "--allow[0]"

    @property
    def label(self) -> str:
        return self.spec.name or self.spec.target_text()

    def __str__(self) -> str:
        return f"{self.ref} ({self.label})"

    @property
    def whole(self) -> bool:
        """Every port and protocol: a domain deny rule that refuses the name itself."""
        return not self.spec.ports and self.spec.protocols == ALL_PROTOCOLS

    def _port_ok(self, port: int | None, protocol: Protocol) -> bool:
        if protocol not in self.spec.protocols:
            return False
        if not self.spec.ports or port is None:
            # A port-less question (a DNS lookup, ICMP) is matched by port-scoped rules too:
            # the port is checked again when the connection is made.
            return True
        return any(low <= port <= high for low, high in self.spec.ports)

    def in_scope(self, port: int | None, protocol: Protocol) -> bool:
        """Do the rule's ports and protocols hold this port and protocol?"""
        return self._port_ok(port, protocol)

    def matches_address(self, address: IPAddress, port: int | None, protocol: Protocol) -> bool:
        net = self.spec.network
        return (
            net is not None
            and net.version == address.version
            and address in net
            and self._port_ok(port, protocol)
        )

    def matches_name(self, name: str, port: int | None, protocol: Protocol) -> bool:
        pattern = self.spec.pattern
        return pattern is not None and pattern.matches(name) and self._port_ok(port, protocol)

    def matches_lookup(self, name: str) -> bool:
        """Does this rule speak to a DNS question for ``name`` (no port or protocol yet)?

        An allow rule lets the name resolve whatever ports and protocol it is scoped to: the
        connection is judged again with its own. A deny rule refuses the lookup only when it
        denies the name whole (every port and protocol): ``{ domain = "github.com", port = 22 }``
        must not stop HTTPS to github.com from resolving.
        """
        pattern = self.spec.pattern
        if pattern is None or not pattern.matches(name):
            return False
        return self.action == "allow" or self.whole


# ULA (RFC 4193), so no guest address is routable beyond the gateway; a /64 per guest index.
GUEST_POOL6 = ipaddress.IPv6Network("fd53:4700::/48")


@dataclass(frozen=True)
class Profile:
    name: str
    mode: Mode
    allow: tuple[Rule, ...] = ()
    deny: tuple[Rule, ...] = ()
    inspect: tuple[DomainPattern, ...] = ()
    secrets: tuple[SecretSpec, ...] = ()
    # Networks the test world declares to be its internet (documentation ranges). Only the
    # test world sets this; no policy file can (see policy.load).
    public_override: tuple[IPNetwork, ...] = ()
    guest_pool: IPNetwork = field(default_factory=lambda: ipaddress.ip_network("10.201.0.0/16"))
    gateway_address: IPAddress | None = None  # the guest's own gateway, when known
    host_addresses: tuple[IPAddress, ...] = ()  # the host the gateway runs on, when known
    # The gateway's uplink has IPv6, so guests get routed IPv6 egress (issue 14 part 5). Wiring,
    # like the gateway address: the daemon (or the test world) says so; no policy file can.
    uplink_ipv6: bool = False
    # The guests' IPv6 addresses (a /64 each, NAT66 to the uplink: net/compile.py), where the
    # uplink has IPv6: another guest's or the gateway's there is lateral, as in guest_pool.
    guest_pool6: IPNetwork = field(default_factory=lambda: GUEST_POOL6)
    fronts: tuple[Front, ...] = ()
    expose: tuple[Expose, ...] = ()  # inbound forwards to this profile's guest
    tunnel_idle: float = 300.0
    tunnel_max_seconds: float = 86400.0
    tunnel_max_bytes: int | None = None
    ask: bool = False  # a name the allowlist refuses waits for an answer (gateway/approvals.py)

    @cached_property
    def index(self) -> RuleIndex[Rule]:
        """The rules indexed by network and name, made once (policy/index.py)."""
        from sandgate.policy.index import RuleIndex

        return RuleIndex.of(self.allow, self.deny)

    @cached_property
    def has_process_rules(self) -> bool:
        return any(r.spec.process is not None for r in self.allow)

    def rules(self) -> tuple[Rule, ...]:
        return self.deny + self.allow

    def inspects(self, name: str) -> bool:
        if any(p.matches(name) for p in self.inspect):
            return True
        return self.forced_inspection(name) is not None

    def proxied(self, name: str) -> bool:
        """Must the guest's HTTPS to ``name`` go through the proxy? When it is inspected, and
        when an allow rule for it is for some programs only (``process``): the proxy is where
        a flow's process is known (the TLS is passed through unless inspected)."""
        if self.inspects(name):
            return True
        return any(
            r.spec.process is not None and r.matches_name(name, 443, Protocol.TCP)
            for r in self.index.allow.candidates(None, name)
        )

    def forced_inspection(self, name: str) -> Rule | None:
        """An allow rule whose request rules (``http``) judge HTTPS to ``name``: its requests
        can be read only if TLS ends here, so the name is inspected whatever ``inspect`` says
        (chosen over refusing such a rule at load; ``explain`` says so)."""
        return next(
            (
                r
                for r in self.index.allow.candidates(None, name)
                if r.spec.http is not None and r.matches_name(name, 443, Protocol.TCP)
            ),
            None,
        )

    def host_loopback(self) -> tuple[Rule, ...]:
        """Allow rules that forward a port of the host's own loopback (host_loopback)."""
        return tuple(r for r in self.allow if r.spec.host_loopback is not None)

    def front(self, name: str | None) -> Front | None:
        if not self.fronts:  # most profiles (and a DNS question's hot path: no generator)
            return None
        return next((f for f in self.fronts if f.name == name), None)

    def model_hosts(self) -> list[str]:
        """Where the agent's model lives, as far as the profile tells: fronted services,
        hosts that get an injected API key, and single private addresses it exempts (the LAN
        model server). Their traffic is the framework's, never evidence for an answer's claim."""
        hosts: set[str] = set()
        for f in self.fronts:
            hosts |= {f.name, str(f.address)}
        for secret in self.secrets:
            hosts |= set(secret.hosts)
        for rule in self.allow:
            net = rule.spec.network
            if net is not None and net.num_addresses == 1 and net.network_address.is_private:
                hosts.add(str(net.network_address))
        return sorted(hosts)


@dataclass(frozen=True)
class Front:
    """A plain-HTTP service offered over TLS by the gateway under ``name`` (FrontSpec)."""

    name: str
    address: IPAddress
    port: int


@dataclass(frozen=True)
class Expose:
    """One inbound forward (ExposeSpec): ``sources`` reach ``port`` of this profile's guest."""

    port: int
    sources: tuple[ipaddress.IPv4Network, ...]
    ref: str  # "expose[0]"

    def admits(self, source: IPAddress) -> bool:
        return source.version == 4 and any(source in n for n in self.sources)

    def __str__(self) -> str:
        return f"{self.ref} (port {self.port} from {', '.join(map(str, self.sources))})"


def rules_from_specs(action: Action, specs: list[RuleSpec], prefix: str) -> tuple[Rule, ...]:
    return tuple(Rule(action, spec, f"{prefix}[{i}]") for i, spec in enumerate(specs))


def inspect_patterns(items: list[str]) -> tuple[DomainPattern, ...]:
    return tuple(parse_pattern(item) for item in items)
