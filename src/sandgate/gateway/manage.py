"""Starting, finding and stopping gateway daemons (the client side of ``gateway/daemon.py``)."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from sandgate.errors import GatewayError
from sandgate.gateway.config import GatewayConfig, netns_of, pid_path, run_dir
from sandgate.gateway.control import ControlClient

READY_TIMEOUT = 20.0


@dataclass
class GatewayHandle:
    instance: str
    pid: int
    control: Path
    proc: subprocess.Popen[bytes] | None = None  # set when we started it

    @property
    def netns(self) -> str:
        return netns_of(self.pid)

    def client(self, timeout: float = 30.0) -> ControlClient:
        return ControlClient(self.control, timeout)

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        return _alive(self.pid)


def start(cfg: GatewayConfig) -> GatewayHandle:
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
        [sys.executable, "-m", "sandgate.gateway.daemon", str(config_path)],
        stdout=subprocess.PIPE,
        stderr=log,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
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
    return GatewayHandle(cfg.instance, proc.pid, cfg.control_path, proc)


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
    if not _alive(pid) or not _is_daemon(pid):
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
    if _wait_gone(handle, timeout):
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.kill(handle.pid, sig)
        if _wait_gone(handle, 3.0):
            return


def _wait_gone(handle: GatewayHandle, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if handle.proc is not None:
            try:
                handle.proc.wait(timeout=0.05)
                return True
            except subprocess.TimeoutExpired:
                continue
        if not _alive(handle.pid):
            return True
        time.sleep(0.05)
    return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is not alive.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _is_daemon(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"sandgate.gateway.daemon" in cmdline


def is_daemon(pid: int) -> bool:
    return _alive(pid) and _is_daemon(pid)


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
