"""Starting, finding and stopping gateway daemons (the client side of ``gateway/daemon.py``)."""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from sandgate import TYPE_CHECKING, pids
from sandgate.errors import GatewayError, SetupError
from sandgate.gateway.config import RUN_ROOT, GatewayConfig, netns_of, pid_path, run_dir
from sandgate.gateway.control import ControlClient
from sandgate.sandbox import limits

if TYPE_CHECKING:
    from typing import Any

READY_TIMEOUT = 20.0
# The daemon's threads (one per proxied connection) each got a malloc arena of their own, up
# to 8 per core, and freed memory stayed spread over them: RSS grew 11.1 MB in a 300-session
# soak with glibc's default, 5.1 MB with two arenas (issue 11, 2026-12-01). A user's own
# setting wins.
DAEMON_ENV = {"MALLOC_ARENA_MAX": "2"}
DAEMON = "sandgate.gateway.daemon"  # the module the daemon runs as; its pid check looks for it


@dataclass
class GatewayHandle:
    """A running gateway daemon: its instance, pid and control socket."""

    instance: str
    pid: int
    control: Path
    proc: subprocess.Popen[bytes] | None = None  # set when we started it
    pasta: subprocess.Popen[bytes] | None = None  # the real uplink, when we started one
    hostlo: subprocess.Popen[bytes] | None = None  # the host side of host_loopback rules

    @property
    def netns(self) -> str:
        return netns_of(self.pid)

    def client(self, timeout: float = 30.0) -> ControlClient:
        return ControlClient(self.control, timeout)

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        return pids.alive(self.pid)


def start(cfg: GatewayConfig, env: dict[str, str] | None = None) -> GatewayHandle:
    """Start a daemon for ``cfg`` and wait until it serves."""
    directory = run_dir(cfg.instance)
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o755)
    (directory / "control").mkdir(exist_ok=True, mode=0o700)
    config_path = directory / "gateway.json"
    config_path.write_text(cfg.dump())
    os.chmod(config_path, 0o600)
    log_path = log_dir() / f"gateway-{cfg.instance}.log"
    log = open(log_path, "ab")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(
        [sys.executable, "-m", DAEMON, str(config_path)],
        stdout=subprocess.PIPE,
        stderr=log,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env={**DAEMON_ENV, **os.environ, **(env or {})},
    )
    log.close()
    assert proc.stdout is not None
    deadline = time.monotonic() + READY_TIMEOUT
    line = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            line = proc.stdout.readline()
            if line.startswith(b"READY ") or not line:
                break
        if proc.poll() is not None:
            break
    if not line.startswith(b"READY "):
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
        tail = _tail(log_path)
        raise GatewayError(
            "the gateway daemon did not start" + (f":\n{tail}" if tail else ""),
            f"see {log_path}",
        )
    handle = GatewayHandle(cfg.instance, proc.pid, cfg.control_path, proc)
    # A guest must not starve the gateway: its own cgroup, reserved memory, OOM score -900.
    for note in limits.protect_gateway(cfg.instance, proc.pid):
        with open(log_path, "a") as f:
            f.write(f"sandgate: gateway protection: {note}\n")
    try:
        if cfg.uplink.kind == "pasta":
            handle.pasta = start_pasta(handle.pid, cfg.uplink.ifname, log_path)
        if cfg.host_loopback:
            handle.hostlo = start_host_side(cfg, handle.pid, log_path)
    except BaseException:
        stop(handle)
        raise
    return handle


def start_host_side(cfg: GatewayConfig, daemon: int, log_path: Path) -> subprocess.Popen[bytes]:
    """The host side of the host-loopback relay (gateway/hostlo.py), in this (the host's)
    namespace; warns for a port nothing listens on yet (the relay serves it once it does)."""
    from sandgate.gateway import hostlo

    for port in hostlo.unserved(cfg.host_loopback):
        sys.stderr.write(
            f"sandgate: warning: host_loopback {port}: nothing listens on 127.0.0.1:{port} of "
            "this host; guests' connections fail until the server runs (e.g. `ollama serve`)\n"
        )
    log = open(log_path, "ab")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sandgate.gateway.hostlo",
            str(cfg.hostlo_dir),
            str(daemon),
            *map(str, cfg.host_loopback),
        ],
        stdout=subprocess.PIPE,
        stderr=log,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    log.close()
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], READY_TIMEOUT)
    if not ready or not proc.stdout.readline().startswith(b"READY"):
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
        raise GatewayError("the host side of host_loopback did not start", f"see {log_path}")
    return proc


PASTA_READY_TIMEOUT = 10.0


def start_pasta(pid: int, ifname: str, log_path: Path) -> subprocess.Popen[bytes]:
    """Give the gateway its real uplink: pasta's tap device, configured like the host's.

    pasta runs in the host's namespace and forwards the gateway's traffic as the host's own
    sockets. Inbound port forwarding is off (-t/-u/-T/-U none), and --no-map-gw keeps the
    gateway from reaching the host itself through pasta's gateway address.
    """
    if shutil.which("pasta") is None:
        raise SetupError("pasta is missing (the real uplink needs it)", "apt-get install passt")
    log = open(log_path, "ab")  # noqa: SIM115 - handed to the child
    nsfd = os.open(netns_of(pid), os.O_RDONLY)
    proc = subprocess.Popen(
        [
            "pasta",
            "--foreground",
            "--quiet",
            "--config-net",
            "--ipv4-only",
            "--no-map-gw",
            "--no-dhcp",
            "--no-ndp",
            "--no-dhcpv6",
            "--no-ra",
            "--runas",
            "0",
            "-t",
            "none",
            "-u",
            "none",
            "-T",
            "none",
            "-U",
            "none",
            "--ns-ifname",
            ifname,
            # The gateway's namespace has no path of its own; hand pasta an open descriptor
            # (pasta drops the capability it would need to open another process's).
            "--netns",
            f"/proc/self/fd/{nsfd}",
        ],
        pass_fds=(nsfd,),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    log.close()
    os.close(nsfd)
    deadline = time.monotonic() + PASTA_READY_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise GatewayError(
                f"pasta exited ({proc.returncode}) before the uplink came up", f"see {log_path}"
            )
        if _has_default_route(pid):
            return proc
        time.sleep(0.05)
    proc.kill()
    raise GatewayError("pasta did not bring the uplink up in time", f"see {log_path}")


def _has_default_route(pid: int) -> bool:
    from sandgate.net import ns

    ipr = ns.iproute(netns_of(pid))
    try:
        return bool(ipr.get_default_routes(family=2))
    finally:
        ipr.close()


def log_dir() -> Path:
    from sandgate.events.store import default_home

    path = default_home() / "logs"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def find(instance: str) -> GatewayHandle | None:
    """The running daemon of ``instance``, if there is one that answers."""
    try:
        pid = int(pid_path(instance).read_text())
    except (FileNotFoundError, ValueError):
        return None
    if not pids.is_ours(pid, DAEMON):
        return None
    handle = GatewayHandle(instance, pid, run_dir(instance) / "control" / "control.sock")
    try:
        with handle.client(timeout=5) as c:
            c.call("ping")
    except GatewayError:
        return None
    return handle


def stop(handle: GatewayHandle, timeout: float = 10.0) -> None:
    """Ask the daemon to stop; SIGTERM, then SIGKILL, by its pid, if it does not."""
    with contextlib.suppress(GatewayError), handle.client(timeout=timeout) as c:
        c.call("shutdown")
    try:
        if _wait_gone(handle, timeout):
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.kill(handle.pid, sig)
            if _wait_gone(handle, 3.0):
                return
    finally:
        with contextlib.suppress(OSError):
            limits.release_gateway(handle.instance)
        from sandgate.gateway import pool  # its warm namespaces, if it could not remove them

        with contextlib.suppress(OSError):
            pool.sweep(run_dir(handle.instance))
        for helper in (handle.pasta, handle.hostlo):
            if helper is not None and helper.poll() is None:
                helper.terminate()
                try:
                    helper.wait(3)
                except subprocess.TimeoutExpired:
                    helper.kill()
                    helper.wait()


def _wait_gone(handle: GatewayHandle, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if handle.proc is not None:
            try:
                handle.proc.wait(timeout=0.05)
                return True
            except subprocess.TimeoutExpired:
                continue
        if not pids.alive(handle.pid):
            return True
        time.sleep(0.05)
    return False


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@dataclass(frozen=True)
class ReloadResult:
    """What a policy reload changed on a running gateway."""

    instance: str
    policy: str  # the absolute path the daemon was given
    guests: int  # running guests started with this file
    changed: int  # of them, those whose rules changed
    cut: int  # open flows the new rules refuse, cut
    default: bool  # made the default policy of new runs on this gateway


def running(instance: str | None) -> GatewayHandle:
    """The running gateway ``instance``, else ``main``, then ``test``; an error if none runs."""
    for name in [instance] if instance else ["main", "test"]:
        handle = find(name)
        if handle is not None:
            return handle
    which = f"'{instance}' " if instance else ""
    raise GatewayError(f"no gateway {which}is running", "start one with `sandgate up`")


def reload(instance: str | None, policy: str | Path, make_default: bool = False) -> ReloadResult:
    """Validate ``policy``, then have the running gateway (``instance``, else main, then test)
    apply it to the guests started with it. A broken file raises ``PolicyError`` (its lines)
    before the daemon is asked, and the daemon keeps the old rules if it disagrees."""
    from sandgate.policy.load import load_policy

    path = str(Path(policy).resolve())
    load_policy(path)
    handle = running(instance)
    with handle.client() as c:
        answer = c.call("reload", policy=path)
    if make_default:
        (run_dir(handle.instance) / "policy").write_text(path)
    return ReloadResult(
        handle.instance,
        path,
        int(answer.get("guests", 0)),
        int(answer.get("changed", 0)),
        int(answer.get("cut", 0)),
        make_default,
    )


def _answering(instance: str | None) -> list[GatewayHandle]:
    """The gateway ``instance``; without one, every running gateway: ``sandgate run`` without
    ``up`` has one of its own, with a random name."""
    if instance is not None:
        return [running(instance)]
    names = sorted(p.name for p in RUN_ROOT.iterdir()) if RUN_ROOT.is_dir() else []
    handles = [h for h in (find(n) for n in names) if h is not None]
    if not handles:
        raise GatewayError("no gateway is running", "start a session with `sandgate run --ask`")
    return handles


def approvals(instance: str | None) -> list[dict[str, Any]]:
    """What waits for an answer on the running gateways (issue 14)."""
    pending: list[dict[str, Any]] = []
    for handle in _answering(instance):
        with contextlib.suppress(GatewayError, OSError), handle.client() as c:
            for p in c.call("approvals").get("pending", []):
                pending.append({**p, "instance": handle.instance})
    return pending


def approve(instance: str | None, name: str, verdict: str) -> dict[str, Any]:
    """Answer ``name`` (allow | always | deny) on the gateway where it waits."""
    last: GatewayError | None = None
    for handle in _answering(instance):
        try:
            with handle.client() as c:
                answer: dict[str, Any] = c.call("approve", name=name, verdict=verdict)
                return answer
        except GatewayError as exc:
            last = exc
    assert last is not None
    raise last
