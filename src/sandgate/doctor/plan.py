"""What the doctor's driver is asked to try, chosen from the profile by ``decide()`` (pure).

The plan names only what the policy allows, so a failed hop means the chain is broken, not
that the policy said no. Without the test world the plan never names a host of the real
internet for the proxy doors (they are asked for ``sandgate-doctor.invalid``, which the
gateway refuses without forwarding); the DNS hops and the uplink hop use one allowed name of
the policy, and only when a user runs ``sandgate doctor`` (the tests always use the world).
"""

from __future__ import annotations

import ipaddress
from dataclasses import asdict, dataclass, field
from typing import Any

from sandgate.policy.decide import Attempt, decide, decide_name
from sandgate.policy.model import Protocol
from sandgate.policy.profile import Profile

# A name the gateway refuses itself (RFC 6761 .invalid): the proxy doors answer it without
# sending anything anywhere. The transparent door is asked at TEST-NET-1 (never routed).
OFFLINE_NAME = "sandgate-doctor.invalid"
OFFLINE_ADDRESS = "192.0.2.1"


@dataclass(frozen=True)
class WorldFacts:
    """What the test world offers (given by the runner; the plan imports no world)."""

    model: tuple[str, int] | None = None  # the LAN model server
    names: tuple[str, ...] = ()  # its public web hosts, in order of preference


@dataclass(frozen=True)
class ModelTarget:
    address: str
    port: int
    rule: str | None  # the allow rule that exempts it, None when the profile has none
    url: str  # where the driver asks for the model list (direct, or the gateway's front)
    via: str = "direct"  # or "front NAME"


@dataclass(frozen=True)
class Plan:
    profile: str
    gateway: str
    proxy: str
    gateway_ca: str  # PEM
    world: bool
    known_name: str | None  # an allowed name: the gateway resolver answers it
    fresh_name: str | None  # an allowed name nobody asked before: upstream must answer it
    door_url: str  # asked at both proxy doors
    door_resolve: str | None  # curl --resolve for the transparent door (offline mode)
    models: tuple[ModelTarget, ...] = ()
    inspected: tuple[str, ...] = ()
    skipped_inspect: tuple[str, ...] = ()  # wildcard patterns: no one name to try
    tls_url: str | None = None  # served with the gateway's CA: the tools' live check
    uplink_url: str | None = None
    date_url: str | None = None  # a web server whose Date header the clock is checked with
    bundle: str = "/etc/ssl/certs/ca-certificates.crt"
    ca_env: dict[str, str] = field(default_factory=dict)  # what the runner sets (launch.py)
    proxy_env: dict[str, str] = field(default_factory=dict)

    def as_driver(self) -> dict[str, Any]:
        return asdict(self)


def _allowed_name(profile: Profile, name: str, port: int | None = None) -> bool:
    if not decide_name(profile, name).allowed:
        return False
    return port is None or decide(profile, Attempt(Protocol.TCP, None, port, name)).allowed


def plan_for(
    profile: Profile,
    guest: dict[str, Any],
    world: WorldFacts | None,
    token: str,
    ca_env: dict[str, str],
    proxy_env: dict[str, str],
    bundle: str,
) -> Plan:
    """The plan for one guest of ``profile`` (``guest`` is the gateway's add_guest answer;
    ``token`` a fresh random label that makes the uncached name)."""
    front_names = {f.name for f in profile.fronts}
    exact = [
        r.spec.pattern.base
        for r in profile.allow
        if r.spec.pattern is not None and not r.spec.pattern.wildcard
    ]
    candidates = [n for n in [*exact, *(world.names if world else ())] if n not in front_names]
    known = next((n for n in candidates if _allowed_name(profile, n)), None)
    fresh = _fresh_name(profile, known, token)
    web = next((n for n in candidates if _allowed_name(profile, n, 80)), None) if world else None
    tls = next((n for n in candidates if _allowed_name(profile, n, 443)), None)
    inspected = tuple(p.base for p in profile.inspect if not p.wildcard)
    tls_url = None
    if inspected and _allowed_name(profile, inspected[0], 443):
        tls_url = f"https://{inspected[0]}/"
    elif profile.fronts:
        tls_url = f"https://{profile.fronts[0].name}/v1/models"
    return Plan(
        profile=profile.name,
        gateway=str(guest["gateway"]),
        proxy=str(guest["proxy"]),
        gateway_ca=str(guest["ca"]),
        world=world is not None,
        known_name=known,
        fresh_name=fresh,
        door_url=f"http://{web or OFFLINE_NAME}/",
        door_resolve=None if web else f"{OFFLINE_NAME}:80:{OFFLINE_ADDRESS}",
        models=model_targets(profile, world),
        inspected=inspected,
        skipped_inspect=tuple(str(p) for p in profile.inspect if p.wildcard),
        tls_url=tls_url,
        uplink_url=f"https://{tls}/" if tls else None,
        date_url=f"http://{web}/" if web else None,
        bundle=bundle,
        ca_env=dict(ca_env),
        proxy_env=dict(proxy_env),
    )


def _fresh_name(profile: Profile, known: str | None, token: str) -> str | None:
    """A name below an allowed one that no cache holds: its answer (even NXDOMAIN) must
    come from upstream. Below a wildcard rule, else below the known name if the mode allows."""
    label = f"sg-doctor-{token}"
    for r in profile.allow:
        p = r.spec.pattern
        if p is not None and p.wildcard and _allowed_name(profile, f"{label}.{p.base}"):
            return f"{label}.{p.base}"
    if known is not None and _allowed_name(profile, f"{label}.{known}"):
        return f"{label}.{known}"
    return None


def model_targets(profile: Profile, world: WorldFacts | None) -> tuple[ModelTarget, ...]:
    """Every single-address allow rule with a port (the model server exemptions), each front,
    and the test world's model server even when no rule exempts it (so a missing rule shows)."""
    out: list[ModelTarget] = []
    for r in profile.allow:
        net = r.spec.network
        if net is None or net.num_addresses != 1 or not r.spec.ports:
            continue
        address, port = str(net.network_address), r.spec.ports[0][0]
        out.append(ModelTarget(address, port, str(r), f"http://{address}:{port}/v1/models"))
    for f in profile.fronts:
        out.append(
            ModelTarget(
                str(f.address),
                f.port,
                _rule_for(profile, str(f.address), f.port),
                f"https://{f.name}/v1/models",
                f"front {f.name}",
            )
        )
    if world is not None and world.model is not None:
        address, port = world.model
        if not any(t.address == address and t.port == port and t.via == "direct" for t in out):
            out.append(
                ModelTarget(
                    address,
                    port,
                    _rule_for(profile, address, port),
                    f"http://{address}:{port}/v1/models",
                )
            )
    return tuple(out)


def _rule_for(profile: Profile, address: str, port: int) -> str | None:
    d = decide(profile, Attempt(Protocol.TCP, ipaddress.ip_address(address), port))
    return str(d.rule) if d.allowed and d.rule is not None else None
