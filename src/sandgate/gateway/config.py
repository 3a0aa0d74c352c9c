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

from sandgate import TYPE_CHECKING
from sandgate.net.links import Uplink

if TYPE_CHECKING:
    from typing import Any

RUN_ROOT = Path(os.environ.get("SANDGATE_RUN", "/run/sandgate"))


@dataclass(frozen=True)
class GatewayConfig:
    """How a gateway is wired: its uplink, guest pool, upstream resolvers, store, alarms."""

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
    host_addresses: tuple[str, ...] = ()  # the host's own addresses: no guest reaches them
    # A gateway VM (uplink kind "handed"): its guest links, (interface, profile) in slot order.
    guest_links: tuple[tuple[str, str], ...] = ()
    host_loopback: tuple[int, ...] = ()  # ports of the host's 127.0.0.1 relayed (gateway/hostlo)
    warm_links: int = 3  # guest namespaces kept ready with their links (gateway/pool.py)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def run_dir(self) -> Path:
        return run_dir(self.instance)

    @property
    def handed(self) -> bool:
        """On a gateway VM: links handed to it, tables that outlive the daemon."""
        return self.uplink.kind == "handed"

    @property
    def hostlo_dir(self) -> Path:
        """The Unix sockets to the host side of the host-loopback relay (gateway/hostlo.py)."""
        return self.run_dir / "hostlo"

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
        raw["host_addresses"] = tuple(raw.get("host_addresses", ()))
        raw["guest_links"] = tuple((str(a), str(b)) for a, b in raw.get("guest_links", ()))
        raw["host_loopback"] = tuple(raw.get("host_loopback", ()))
        return cls(**raw)


def run_dir(instance: str) -> Path:
    return RUN_ROOT / instance


def pid_path(instance: str) -> Path:
    return run_dir(instance) / "daemon.pid"


def netns_of(pid: int) -> str:
    """The gateway's namespace has no name: it lives exactly as long as its daemon."""
    return f"/proc/{pid}/ns/net"
