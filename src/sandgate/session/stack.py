"""A gateway, and the test world behind it when asked: found running, or brought up for a while.

``sandgate up`` brings one up and keeps it; ``run``, ``demo`` and the tests bring up their own
(an ephemeral instance with a random name) when none is running. Teardown removes all of it:
servers, daemon (whose namespace dies with it), world namespaces, run files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from sandgate import TYPE_CHECKING, cleanup, pids
from sandgate.errors import SandgateError
from sandgate.gateway import manage
from sandgate.gateway.config import GatewayConfig, run_dir
from sandgate.gateway.manage import GatewayHandle
from sandgate.net.links import Uplink
from sandgate.world.info import WorldInfo

if TYPE_CHECKING:  # policy/ brings pydantic: a run on a running gateway loads no policy
    from typing import Any

    from sandgate.policy.load import Policy
    from sandgate.world.topology import TestWorld  # the builder: only when a world is brought up


@dataclass
class Stack:
    """A gateway (and test world) that runs use, and whether we own it."""

    instance: str
    gateway: GatewayHandle
    world: WorldInfo | None
    owned: bool = False
    _world: TestWorld | None = field(default=None, repr=False)
    config: GatewayConfig | None = None
    env: dict[str, str] | None = None
    policy: str | None = None  # the default policy of runs on this gateway (`up --policy`)

    def restart_gateway(self) -> GatewayHandle:
        """A new daemon for a gateway that died: it gives the guests still alive their links
        back (gateway/server.py, ``_reattach``) without restarting them."""
        if self.config is None:
            raise SandgateError("this gateway was not started here; restart it where it was")
        with contextlib.suppress(Exception):
            manage.stop(self.gateway)
        self.gateway = manage.start(self.config, env=self.env)
        return self.gateway

    def teardown(self) -> None:
        if not self.owned:
            return
        with contextlib.suppress(Exception):
            manage.stop(self.gateway)
        if self._world is not None:
            self._world.down()
            cleanup.forget_pids(f"world-{self.instance}")
        shutil.rmtree(run_dir(self.instance), ignore_errors=True)
        cleanup.disown(f"instance-{self.instance}")


def bring_up(
    instance: str | None = None,
    *,
    world: bool,
    store: str | None = None,
    extra_env: dict[str, str] | None = None,
    policy: str | None = None,
    world_model: str | None = None,
    world_ipv6: bool = False,
    **gateway_extra: Any,
) -> Stack:
    """Start a gateway (and a test world for it). The caller must ``teardown()``.

    The gateway is wired as ``policy``'s ``[gateway]`` table says (the test world's own policy,
    or the built-in one, when none is named)."""
    name = instance or ("r" + os.urandom(2).hex())
    real_model = check_world_model(world_model) if world else None
    if manage.find(name) is not None:
        raise SandgateError(
            f"a gateway '{name}' is already running", "stop it with `sandgate down`"
        )
    cleanup.own(f"instance-{name}")
    tw = None
    if world:
        from sandgate.world.topology import TestWorld

        tw = TestWorld(
            name,
            on_start=lambda pid: cleanup.add_pid(f"world-{name}", pid),
            model_script=_world_script(),
            real_model=real_model,
            ipv6=world_ipv6,  # the world's IPv6 internet (issue 14 part 5)
        )
    handle: GatewayHandle | None = None
    try:
        info = tw.up() if tw is not None else None
        config = gateway_config(name, info, store, gateway_policy(policy, info), **gateway_extra)
        env = {**(info.gateway_env if info is not None else {}), **(extra_env or {})}
        handle = manage.start(config, env=env)
        if info is not None:
            (run_dir(name) / "world.json").write_text(
                json.dumps(dataclasses.asdict(info), default=str, indent=2)
            )
    except BaseException:
        if handle is not None:
            manage.stop(handle)
        if tw is not None:
            tw.down()
        shutil.rmtree(run_dir(name), ignore_errors=True)
        cleanup.disown(f"instance-{name}")
        raise
    return Stack(name, handle, info, owned=True, _world=tw, config=config, env=env)


def _world_script() -> Any:
    from sandgate.agents.frameworks import world_script  # only when a world is brought up

    return world_script()


def find_stack(instance: str) -> Stack | None:
    handle = manage.find(instance)
    if handle is None:
        return None
    try:
        policy: str | None = (run_dir(instance) / "policy").read_text().strip()
    except OSError:
        policy = None
    return Stack(instance, handle, load_world(run_dir(instance) / "world.json"), policy=policy)


@contextlib.contextmanager
def stack_for(
    world: str | None,
    instance: str | None = None,
    store: str | None = None,
    policy: str | None = None,
    world_model: str | None = None,
) -> Iterator[Stack]:
    """The instance's running gateway, or one of our own for the duration of the block
    (wired as ``policy``'s ``[gateway]`` says; a running gateway refuses a guest whose policy
    asks for another wiring). ``world_model``: the test world's model server (None: scripted,
    or whatever the running world serves)."""
    name = instance or ("test" if world == "test" else "main")
    running = find_stack(name)
    if running is not None:
        if world == "test" and running.world is None:
            raise SandgateError(
                f"the running gateway '{name}' is not a test-world gateway",
                "stop it with `sandgate down`, or run without --world test",
            )
        serves = running.world.model if running.world is not None else None
        if world_model is not None and serves != world_model:
            raise SandgateError(
                f"the running test world '{name}' serves the {serves} model, not {world_model}",
                f"stop it with `sandgate down`, or `sandgate up --world test --world-model "
                f"{world_model}`",
            )
        yield running
        return
    if instance is not None:
        raise SandgateError(f"no gateway '{instance}' is running", "start it with `sandgate up`")
    stack = bring_up(world=world == "test", store=store, policy=policy, world_model=world_model)
    try:
        yield stack
    finally:
        stack.teardown()


def check_world_model(name: str | None) -> str | None:
    """A real model for the test world (world/llm.py), installed (on first use, before
    anything is built); None for the scripted one. Unknown, or its install failing: an error
    that says how to install it."""
    if name in (None, "scripted"):
        return None
    from sandgate.world import llm

    try:
        llm.get(name)
    except KeyError as exc:
        raise SandgateError(str(exc.args[0]), "use --world-model smollm2 or leave it out") from None
    problem = llm.missing(name)
    if problem is not None:  # first use: build it here, saying so (llm.install's lines)
        try:
            llm.install(name)
        except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
            raise SandgateError(
                f"{problem.split(': ', 1)[0]}, and installing it failed ({exc})",
                problem.split(": ", 1)[1],
            ) from None
    return name


def gateway_policy(path: str | None, info: WorldInfo | None) -> Policy:
    """The policy whose ``[gateway]`` wires a new gateway: the named one, else the test
    world's own, else the built-in default."""
    from sandgate.policy.load import load_policy

    if path is not None:
        return load_policy(path)
    return load_policy(info.policy if info is not None else None)


def gateway_config(
    instance: str, info: WorldInfo | None, store: str | None, policy: Policy, **extra: Any
) -> GatewayConfig:
    """The daemon's whole configuration: the uplink, and ``[gateway]`` of ``policy``, read once."""
    spec = policy.file.gateway
    uplink = info.uplink if info is not None else Uplink(kind="pasta")
    taken = uplink_networks(info)
    clash = next((n for n in taken if n.overlaps(spec.pool)), None)
    if clash is not None:
        raise policy.gateway_problem(
            "guest_pool",
            f"guest_pool {spec.pool} overlaps the uplink's network {clash}",
            "choose a guest_pool outside every network the gateway reaches, e.g. 10.201.0.0/16",
        )
    upstream = tuple(spec.upstream_dns)
    host = tuple(a.split("/")[0] for a in host_addresses())
    if info is not None:
        return GatewayConfig(
            instance=instance,
            uplink=uplink,
            guest_pool=str(spec.pool),
            upstream_dns=upstream or info.upstream_dns,
            public_override=info.public_override,
            store=store or "",
            extra_ca=(str(info.ca_cert),),
            policy=policy.source,
            host_addresses=host,
            host_loopback=policy.host_loopback_ports(),
            **extra,
        )
    return GatewayConfig(
        instance=instance,
        uplink=uplink,
        guest_pool=str(spec.pool),
        upstream_dns=upstream or host_resolvers(),
        store=store or "",
        policy=policy.source,
        host_addresses=host,
        host_loopback=policy.host_loopback_ports(),
        **extra,
    )


def uplink_networks(info: WorldInfo | None) -> list[ipaddress.IPv4Network]:
    """The networks the gateway's uplink leads to: the test world's LAN and "internet", or the
    host's own IPv4 networks (pasta gives the gateway the host's address)."""
    if info is not None:
        nets = [
            ipaddress.ip_interface(info.uplink.address).network,
            *map(ipaddress.ip_network, info.public_override),
        ]
    else:
        nets = [ipaddress.ip_interface(a).network for a in host_addresses()]
    return [n for n in nets if isinstance(n, ipaddress.IPv4Network)]


def host_addresses() -> list[str]:
    """The host's IPv4 addresses with their prefix, loopback aside (read only)."""
    try:
        out = subprocess.run(
            ["ip", "-j", "-4", "addr", "show"],
            check=False,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout
        links = json.loads(out or "[]")
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return []
    return [
        f"{a['local']}/{a['prefixlen']}"
        for link in links
        for a in link.get("addr_info", [])
        if a.get("family") == "inet" and not str(a.get("local", "")).startswith("127.")
    ]


def host_resolvers() -> tuple[str, ...]:
    """The host's own resolvers (systemd-resolved's upstreams when it runs a stub)."""
    for path in ("/run/systemd/resolve/resolv.conf", "/etc/resolv.conf"):
        try:
            lines = Path(path).read_text().splitlines()
        except OSError:
            continue
        servers = [
            ln.split()[1] for ln in lines if ln.startswith("nameserver") and len(ln.split()) > 1
        ]
        servers = [s for s in servers if not s.startswith("127.")]
        if servers:
            return tuple(servers)
    return ()


def load_world(path: Path) -> WorldInfo | None:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return WorldInfo(
        uplink=Uplink(**raw["uplink"]),
        upstream_dns=tuple(raw["upstream_dns"]),
        public_override=tuple(raw["public_override"]),
        ca_cert=Path(raw["ca_cert"]),
        policy=Path(raw["policy"]),
        logs={k: Path(v) for k, v in raw["logs"].items()},
        namespaces=tuple(raw["namespaces"]),
        gateway_env=raw.get("gateway_env", {}),
        model=raw.get("model", "scripted"),
    )


# -- `sandgate up` / `sandgate down` --------------------------------------------------------------

UP_PID = "up.pid"  # in the instance's run dir: the `sandgate up` process that keeps it


def keep_up(
    stack: Stack,
    stopping: threading.Event,
    *,
    died: Callable[[], None],
    restarted: Callable[[], None],
    poll: float = 0.2,
) -> None:
    """Keep ``stack``'s gateway until ``stopping`` is set: a daemon that dies is restarted (its
    guests re-attached). ``died``/``restarted`` tell the caller; a failed restart raises
    ``SandgateError``. The pid of this process is recorded for ``stop_up``. The caller tears
    the stack down."""
    (run_dir(stack.instance) / UP_PID).write_text(str(os.getpid()))
    while not stopping.is_set():
        if not stack.gateway.alive():
            died()
            stack.restart_gateway()
            restarted()
        time.sleep(poll)


def stop_up(instance: str, timeout: float = 20.0) -> bool:
    """SIGTERM the `sandgate up` keeping ``instance`` (if its pid is still ours) and wait for it
    to end; True if there was one."""
    try:
        pid = int((run_dir(instance) / UP_PID).read_text())
    except (OSError, ValueError):
        return False
    if not pids.is_ours(pid, "sandgate"):
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and pids.alive(pid):
        time.sleep(0.1)
    return True
