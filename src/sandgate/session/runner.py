"""``sandgate run``: one command in a fresh sandbox behind a gateway, then a report.

Uses the running gateway of the instance if there is one (``sandgate up``); otherwise brings
one up for its own duration (and, with ``world="test"``, the test world behind it). Everything
it made is removed on the way out: on success, on error, on Ctrl-C and on SIGTERM.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from sandgate.errors import SandgateError
from sandgate.events.schema import Event, Kind
from sandgate.events.store import Store
from sandgate.gateway import manage
from sandgate.gateway.config import GatewayConfig, Uplink
from sandgate.gateway.manage import GatewayHandle
from sandgate.policy.load import load_policy
from sandgate.report.session import SessionReport, build_report
from sandgate.sandbox import bwrap
from sandgate.sandbox.launch import CommandNotFound, Sandbox, ca_env, preflight
from sandgate.world.topology import TestWorld, WorldInfo

UID_BASE = 61000


@dataclass
class RunOptions:
    command: Sequence[str]
    policy: str | None = None
    profile: str | None = None
    mode: str | None = None
    allow: Sequence[str] = ()
    deny: Sequence[str] = ()
    world: str | None = None  # "test" or None (the real uplink)
    workdir: Path | None = None
    timeout: float | None = None
    uid: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    instance: str | None = None
    store: str | None = None
    label: str | None = None


@dataclass
class RunResult:
    session: str
    exit_code: int
    report: SessionReport
    message: str | None = None


class Interrupted(SandgateError):
    pass


def new_session_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """Turn SIGTERM/SIGHUP into an exception so every ``finally`` below runs."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(f"stopped by signal {signal.Signals(signum).name}")

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def gateway_for(opts: RunOptions) -> Iterator[tuple[GatewayHandle, WorldInfo | None]]:
    """A gateway to use: the instance's running one, or one of our own for this run."""
    instance = opts.instance or ("test" if opts.world == "test" else "main")
    running = manage.find(instance)
    if running is not None:
        world_file = running.control.parent.parent / "world.json"
        info = _load_world(world_file) if opts.world == "test" else None
        if opts.world == "test" and info is None:
            raise SandgateError(
                f"the running gateway '{instance}' is not a test-world gateway",
                "stop it with `sandgate down`, or run without --world test",
            )
        yield running, info
        return
    own = "r" + secrets.token_hex(2)
    world = TestWorld(own) if opts.world == "test" else None
    handle: GatewayHandle | None = None
    try:
        info = world.up() if world is not None else None
        handle = manage.start(gateway_config(own, info, opts.store))
        yield handle, info
    finally:
        if handle is not None:
            manage.stop(handle)
        if world is not None:
            world.down()


def gateway_config(
    instance: str, info: WorldInfo | None, store: str | None, **extra: Any
) -> GatewayConfig:
    if info is not None:
        return GatewayConfig(
            instance=instance,
            uplink=info.uplink,
            upstream_dns=info.upstream_dns,
            public_override=info.public_override,
            store=store or "",
            **extra,
        )
    policy = load_policy(None)
    spec = policy.file.gateway
    return GatewayConfig(
        instance=instance,
        uplink=Uplink(kind="host", host_ifname=f"sg-{instance}-up", subnet=spec.uplink_subnet),
        upstream_dns=tuple(spec.upstream_dns) or host_resolvers(),
        store=store or "",
        **extra,
    )


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


def run(opts: RunOptions) -> RunResult:
    preflight()
    # Validate the policy before anything is built: a broken file changes nothing.
    if opts.policy is not None or opts.world is None:
        load_policy(opts.policy)
    sid = new_session_id()
    store = Store(opts.store) if opts.store else Store()
    exit_code = 1
    message: str | None = None
    counters: dict[str, Any] = {}
    with _signals_raise(), gateway_for(opts) as (gateway, world):
        policy = opts.policy or (str(world.policy) if world is not None else None)
        box: Sandbox | None = None
        guest: dict[str, Any] | None = None
        try:
            uid_hint = opts.uid
            box = Sandbox.create(sid, gateway.instance, opts.workdir, uid_hint or UID_BASE)
            with gateway.client() as ctl:
                guest = ctl.call(
                    "add_guest",
                    netns=box.netns,
                    session=sid,
                    policy=policy,
                    profile=opts.profile,
                    mode=opts.mode,
                    allow=list(opts.allow),
                    deny=list(opts.deny),
                    uid=uid_hint,
                )
            uid = opts.uid or UID_BASE
            store.session_start(
                sid,
                mode=guest["mode"],
                profile=guest["profile"],
                policy=guest["policy"],
                world=opts.world,
                guest=guest["guest"],
                uid=uid,
                command=list(opts.command),
                details={"label": opts.label} if opts.label else None,
            )
            files = box.etc_files(guest["gateway"], uid, world.ca_cert if world else None)
            env = {**(ca_env() if world else {}), **opts.env}
            spec = bwrap.SandboxSpec(
                netns=f"/run/netns/{box.netns}",
                uid=uid,
                gid=uid,
                command=tuple(opts.command),
                workdir=box.workdir,
                home=box.home,
                files=files,
                env=env,
            )
            try:
                exit_code = box.run(spec, opts.timeout)
                if exit_code == 124 and opts.timeout:
                    message = f"timed out after {opts.timeout:g} s; the sandbox was killed"
            except CommandNotFound as exc:
                exit_code, message = 127, str(exc)
            if exit_code != 0 and not gateway.alive():
                message = (
                    "the gateway died during the session; the sandbox had no way out (fail closed)"
                )
        except KeyboardInterrupt:
            exit_code, message = 130, "interrupted"
        except Interrupted as exc:
            exit_code, message = 143, exc.message
        finally:
            if box is not None:
                box.kill()
            if guest is not None:
                with contextlib.suppress(SandgateError), gateway.client() as ctl:
                    counters = ctl.call("remove_guest", guest=guest["guest"]).get(
                        "counters", {}
                    )
            if box is not None:
                box.destroy()
    store.session_end(sid, exit_code, {"message": message} if message else None)
    session = store.session(sid)
    events = store.events(session=sid)
    store.close()
    report = build_report(session, events, counters)
    return RunResult(sid, exit_code, report, message)


def _load_world(path: Path) -> WorldInfo | None:
    import json

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
    )


def world_json(info: WorldInfo) -> str:
    import dataclasses
    import json

    raw = dataclasses.asdict(info)
    return json.dumps(raw, default=str, indent=2)


def events_of(session: str, store_path: str | None = None) -> list[Event]:
    store = Store(store_path) if store_path else Store()
    try:
        return store.events(session=session)
    finally:
        store.close()


__all__ = ["Kind", "RunOptions", "RunResult", "os", "run", "sys"]
