"""What a gateway daemon is told when it starts, and where its files live.

The daemon is given its links as data ("which link is the uplink, how to make it"), never
assuming it made them: on one host it creates a veth to the test world's LAN or to the host;
on a gateway VM it would adopt existing interfaces.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

RUN_ROOT = Path(os.environ.get("SANDGATE_RUN", "/run/sandgate"))


@dataclass(frozen=True)
class Uplink:
    """How the gateway reaches the outside.

    kind "netns": a veth whose far end goes into namespace ``peer_netns`` (the test world's
    LAN), enslaved to ``peer_master`` there; the gateway takes ``address`` and routes via
    ``via``.
    kind "pasta": the real uplink of this host, through pasta (package passt), which gives the
    gateway a tap device and carries its traffic out as ordinary sockets of the host. Nothing
    in the host's namespace changes: no route, no sysctl, no firewall rule, no link.
    """

    kind: Literal["netns", "pasta"]
    address: str = ""  # CIDR, e.g. "10.77.0.2/24"
    via: str = ""  # next hop
    peer_netns: str = ""
    peer_ifname: str = ""
    peer_master: str = ""
    ifname: str = "up0"  # the uplink's name inside the gateway


@dataclass(frozen=True)
class GatewayConfig:
    instance: str
    uplink: Uplink
    guest_pool: str = "10.201.0.0/16"
    upstream_dns: tuple[str, ...] = ()
    public_override: tuple[str, ...] = ()  # the test world's "internet"; never from a policy file
    store: str = ""
    watchdog: float | None = None
    notify: str | None = None
    drop_log_rate: int = 500
    extra_ca: tuple[
        str, ...
    ] = ()  # CAs the proxy trusts upstream besides the system's (test world)
    policy: str = ""  # the policy file whose [gateway] table this is (for messages)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def run_dir(self) -> Path:
        return run_dir(self.instance)

    @property
    def control_path(self) -> Path:
        return self.run_dir / "control" / "control.sock"

    def dump(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def load(cls, text: str) -> GatewayConfig:
        raw = json.loads(text)
        raw["uplink"] = Uplink(**raw["uplink"])
        raw["upstream_dns"] = tuple(raw.get("upstream_dns", ()))
        raw["public_override"] = tuple(raw.get("public_override", ()))
        raw["extra_ca"] = tuple(raw.get("extra_ca", ()))
        return cls(**raw)


def run_dir(instance: str) -> Path:
    return RUN_ROOT / instance


def pid_path(instance: str) -> Path:
    return run_dir(instance) / "daemon.pid"


def netns_of(pid: int) -> str:
    """The gateway's namespace has no name: it lives exactly as long as its daemon."""
    return f"/proc/{pid}/ns/net"
