"""``sandgate run``: one command in a fresh sandbox behind a gateway, then a report.

Uses the running gateway of the instance if there is one (``sandgate up``); otherwise brings
one up for its own duration (and, with ``world="test"``, the test world behind it). Everything
it made is removed on the way out: on success, on error, on Ctrl-C and on SIGTERM.
"""

from __future__ import annotations

import contextlib
import secrets
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from sandgate import cleanup
from sandgate.errors import SandgateError
from sandgate.events.store import Store
from sandgate.policy.load import load_policy
from sandgate.report.session import SessionReport, build_report
from sandgate.sandbox import bwrap
from sandgate.sandbox.launch import (
    CommandNotFound,
    Sandbox,
    ca_env,
    place_secrets,
    preflight,
    proxy_env,
)
from sandgate.session.stack import Stack, stack_for

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
    files: dict[str, Path] = field(default_factory=dict)  # extra read-only files: target -> source
    instance: str | None = None
    store: str | None = None
    label: str | None = None
    stop: threading.Event | None = None  # set it to end the session early (exit status 143)
    # Files that depend on the guest (its addresses, placeholders): called once it exists.
    late_files: Callable[[dict[str, Any]], dict[str, Path]] | None = None


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
def signals_raise() -> Iterator[None]:
    """Turn SIGTERM/SIGHUP into an exception so every ``finally`` on the way out runs."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(f"stopped by signal {signal.Signals(signum).name}")

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def run(opts: RunOptions) -> RunResult:
    """Bring up (or find) a gateway, run one session in it, tear down what we brought up."""
    preflight()
    # Validate the policy before anything is built: a broken file changes nothing.
    if opts.policy is not None or opts.world is None:
        load_policy(opts.policy)
    with signals_raise(), stack_for(opts.world, opts.instance, opts.store) as stack:
        return run_in(stack, opts)


def run_in(stack: Stack, opts: RunOptions) -> RunResult:
    """One session on an existing stack."""
    sid = new_session_id()
    store = Store(opts.store) if opts.store else Store()
    world = stack.world
    policy = opts.policy or stack.policy or (str(world.policy) if world is not None else None)
    uid = opts.uid or UID_BASE
    exit_code, message = 1, None
    counters: dict[str, Any] = {}
    box: Sandbox | None = None
    guest: dict[str, Any] | None = None
    try:
        box = Sandbox.create(sid, stack.instance, opts.workdir, uid)
        cleanup.own(box.netns)
        with stack.gateway.client() as ctl:
            guest = ctl.call(
                "add_guest",
                netns=box.netns,
                session=sid,
                policy=policy,
                profile=opts.profile,
                mode=opts.mode,
                allow=list(opts.allow),
                deny=list(opts.deny),
                uid=uid,
            )
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
        cas = [guest["ca"].encode()] + ([world.ca_cert.read_bytes()] if world else [])
        late = opts.late_files(guest) if opts.late_files is not None else {}
        files = {**box.etc_files(guest["gateway"], uid, cas), **box.copy_in({**opts.files, **late})}
        env = {
            **ca_env(),
            **proxy_env(guest["proxy"]),
            **place_secrets(box.home, uid, guest.get("secrets", {})),
            **opts.env,
        }
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
            exit_code = box.run(spec, opts.timeout, opts.stop)
            if exit_code == 124 and opts.timeout:
                message = f"timed out after {opts.timeout:g} s; the sandbox was killed"
        except CommandNotFound as exc:
            exit_code, message = 127, str(exc)
        if not stack.gateway.alive():
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
            with contextlib.suppress(SandgateError), stack.gateway.client() as ctl:
                counters = ctl.call("remove_guest", guest=guest["guest"]).get("counters", {})
        if box is not None:
            box.destroy()
            cleanup.disown(box.netns)
    if guest is None:
        store.close()
        raise SandgateError(message or "the sandbox could not be started")
    store.session_end(sid, exit_code, {"message": message} if message else None)
    report = build_report(store.session(sid), store.events(session=sid), counters)
    store.close()
    return RunResult(sid, exit_code, report, message)
