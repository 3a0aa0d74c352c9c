"""Links handed to the gateway (issue 10): a gateway VM's uplink and one interface per guest.

On a gateway VM the daemon makes no links: it is told "eth0 is the uplink, eth1 is the coding
agent's link, eth2 the orchestrator's" (``sandgate gateway --uplink eth0 --guest eth1=coder``,
or the policy's ``[gateway]`` table), each guest link a port of its own bridge on the
hypervisor, so one guest per link, routed, never switched. Guest ``i`` (in the order given)
gets the pool's ``i``-th /30: the gateway ``.1``, the guest ``.2``.

``ruleset`` is the whole nftables ruleset such a gateway runs, made by the daemon's own
compiler (net/compile.py) from the same profiles the daemon makes; ``export gateway-vm``
writes exactly it, and the daemon loads the same commands (base, then each guest).
Pure: names and policies in, nftables JSON out; the kernel checks are ``Plumber.check_handed``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from sandgate.errors import SandgateError
from sandgate.net.compile import ALIVE_SET, TABLE, GuestLink, Json, Limits, base_ruleset, guest_add
from sandgate.net.links import GATEWAY_SYSCTLS, link_sysctl_values
from sandgate.policy.load import Policy
from sandgate.policy.model import check_ifname
from sandgate.policy.profile import Profile

# The daemon refreshes the alive set every HEARTBEAT seconds; an element lives ALIVE_FOR.
# A dead (or stuck) daemon stops forwarding within ALIVE_FOR, with no help from it.
HEARTBEAT = 1.0
DEFAULT_LIMITS = Limits()  # the daemon's (GatewayConfig.drop_log_rate 500, burst twice that)
ALIVE_FOR = 6


@dataclass(frozen=True)
class HandedGuest:
    ifname: str
    profile: str
    bridge: str  # the hypervisor's bridge this link is a port of


@dataclass(frozen=True)
class Handed:
    """Which link is the uplink, which guest each other link is (in order: index = slot)."""

    uplink: str
    guests: tuple[HandedGuest, ...]

    @property
    def ifnames(self) -> list[str]:
        return [g.ifname for g in self.guests]

    def links(self, pool: ipaddress.IPv4Network) -> list[GuestLink]:
        return [GuestLink.handed(pool, i, g.ifname) for i, g in enumerate(self.guests)]


def default_bridge(index: int) -> str:
    return f"sgbr{index + 1}"


def handed_from(policy: Policy, uplink: str | None, guests: Sequence[str]) -> Handed:
    """The links from the command line (``--uplink``, ``--guest IF=PROFILE``), else the policy's
    ``[gateway]`` table. Every problem at once, each with its fix; nothing is applied here."""
    spec = policy.file.gateway
    problems: list[str] = []
    up = uplink or spec.uplink
    if not up:
        problems.append('no uplink: give --uplink IF or uplink = "eth0" in [gateway]')
    pairs: list[tuple[str, str, str | None]] = []
    if guests:
        for item in guests:
            name, sep, profile = item.partition("=")
            if not sep or not name or not profile:
                problems.append(f"--guest {item!r}: write IF=PROFILE, e.g. --guest eth1=coder")
                continue
            bridge = next((g.bridge for g in spec.guests if g.link == name), None)
            pairs.append((name, profile, bridge))
    else:
        pairs = [(g.link, g.profile, g.bridge) for g in spec.guests]
    if not pairs and not problems:
        problems.append("no guest link: give --guest IF=PROFILE or guests = [...] in [gateway]")
    seen: set[str] = set()
    out: list[HandedGuest] = []
    for i, (name, profile, bridge) in enumerate(pairs):
        try:
            check_ifname(name)
        except ValueError as exc:
            problems.append(str(exc))
        if name == up:
            problems.append(f"{name} is the uplink and a guest link: give each its own interface")
        elif name in seen:
            problems.append(f"{name} is named twice: one guest per link")
        if profile not in policy.file.profiles:
            known = ", ".join(sorted(policy.file.profiles))
            problems.append(
                f"{name}={profile}: no profile {profile!r} in {policy.source} ({known})"
            )
        seen.add(name)
        out.append(HandedGuest(name, profile, bridge or default_bridge(i)))
    if up:
        try:
            check_ifname(up)
        except ValueError as exc:
            problems.append(str(exc))
    if problems:
        raise SandgateError(
            "the gateway's links are not right: " + "; ".join(problems),
            "fix them and start again; nothing was applied",
        )
    assert up is not None
    return Handed(up, tuple(out))


def guest_profile(policy: Policy, guest: HandedGuest, link: GuestLink) -> Profile:
    """A handed guest's profile, exactly as the daemon makes it (lifecycle.profile_for):
    no test world, no host addresses (on a gateway VM the host is the gateway itself, whose
    every port but the resolver's and the proxy's is closed to guests)."""
    return policy.profile(
        guest.profile,
        gateway_address=link.gateway,
        guest_pool=policy.file.gateway.pool,
    )


def base(handed: Handed, policy: Policy, limits: Limits = DEFAULT_LIMITS) -> list[Json]:
    cmds, _ = base_ruleset(
        handed.uplink,
        policy.file.gateway.pool,
        limits=limits,
        guest_ifnames=handed.ifnames,
        fence=True,
    )
    return cmds


def ruleset(handed: Handed, policy: Policy, limits: Limits = DEFAULT_LIMITS) -> list[Json]:
    """The whole ruleset of a gateway VM: the base, then every guest's part, as the daemon
    applies them. Loaded from a file before the daemon starts, it forwards nothing (the alive
    set is empty) until the daemon vouches for its links."""
    cmds = base(handed, policy, limits)
    for guest, link in zip(handed.guests, handed.links(policy.file.gateway.pool), strict=True):
        part, _ = guest_add(link, guest_profile(policy, guest, link), limits)
        cmds += part
    return cmds


def sysctls(handed: Handed) -> dict[str, str]:
    """The settings the daemon writes before forwarding (Plumber.harden_gateway and
    link_sysctls), for the gateway and each of its links; forwarding itself is not here."""
    out = dict(GATEWAY_SYSCTLS)
    for name in (handed.uplink, *handed.ifnames):
        out.update(link_sysctl_values(name))
    return out


def heartbeat(handed: Handed) -> list[Json]:
    """One refresh of the alive set (add, delete, add: an existing element's timeout is not
    renewed by ``add`` alone; one batch, so it never lapses in between)."""
    names = [handed.uplink, *handed.ifnames]
    target = {"family": "inet", "table": TABLE, "name": ALIVE_SET}
    fresh = [{"elem": {"val": n, "timeout": ALIVE_FOR}} for n in names]
    return [
        {"add": {"element": {**target, "elem": fresh}}},
        {"delete": {"element": {**target, "elem": names}}},
        {"add": {"element": {**target, "elem": fresh}}},
    ]


__all__ = [
    "ALIVE_FOR",
    "HEARTBEAT",
    "Handed",
    "HandedGuest",
    "base",
    "default_bridge",
    "guest_profile",
    "handed_from",
    "heartbeat",
    "ruleset",
    "sysctls",
]
