"""What a gateway and sandboxes need to know about a running world (``WorldInfo``).

Apart from topology.py, which builds the world: a run on a running gateway reads this from the
instance's world.json and never loads the builder (its servers, fixtures, resources; issue 13).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sandgate.net.links import Uplink

__all__ = ["WorldInfo"]


@dataclass
class WorldInfo:
    """What a gateway and sandboxes need to know about a running world."""

    uplink: Uplink
    upstream_dns: tuple[str, ...]
    public_override: tuple[str, ...]
    ca_cert: Path
    policy: Path
    logs: dict[str, Path]
    namespaces: tuple[str, ...]
    # The "real" credentials of the world's hosted APIs, for the gateway's environment only.
    gateway_env: dict[str, str] = field(default_factory=dict)
    model: str = "scripted"  # what the LAN model server is: scripted, or a world/llm.py model
