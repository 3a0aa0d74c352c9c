"""Start a test-world server as a child process and wait for its READY line.

    with start("dns", ["--config", "dns.json"], prefix=["ip", "netns", "exec", "sg-wan"]) as s:
        s.ready["udp"]   # what the server announced

`prefix` runs the server inside something (`ip netns exec NAME` execs, so the child's
pid is the server's and SIGTERM reaches it). Stops with SIGTERM, then SIGKILL.
`read_log` / `wait_log` read a server's JSON-lines log while it runs.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import IO, Any

__all__ = ["Running", "ServerFailed", "read_log", "start", "wait_log"]


class ServerFailed(RuntimeError):
    """The server exited or stayed silent instead of printing READY."""


@dataclass
class Running:
    name: str
    proc: subprocess.Popen[bytes]
    ready: dict[str, Any]
    stderr: IO[bytes]

    def stop(self, timeout: float = 5.0) -> int:
        """SIGTERM, wait, SIGKILL if needed; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return self.proc.returncode

    def stderr_text(self) -> str:
        self.stderr.flush()
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")

    def __enter__(self) -> Running:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def start(
    name: str,
    args: Sequence[str],
    *,
    prefix: Sequence[str] = (),
    python: str = sys.executable,
    timeout: float = 15.0,
    env: Mapping[str, str] | None = None,
) -> Running:
    """Run `python -m sandgate.world.servers.<name> ARGS` and wait for `READY {json}`."""
    stderr = tempfile.TemporaryFile()  # noqa: SIM115 - owned by the Running
    cmd = [*prefix, python, "-m", f"sandgate.world.servers.{name}", *args]
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr,
        env=dict(env) if env is not None else None,
    )  # fmt: skip
    assert proc.stdout is not None
    running = Running(name, proc, {}, stderr)
    deadline = time.monotonic() + timeout
    buf = b""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while b"\n" not in buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not sel.select(remaining):
                running.stop()
                raise ServerFailed(f"{name}: no READY in {timeout}s\n{running.stderr_text()}")
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                proc.wait()
                text = running.stderr_text()
                raise ServerFailed(f"{name}: exited {proc.returncode} before READY\n{text}")
            buf += chunk
    line = buf.split(b"\n", 1)[0].decode()
    if not line.startswith("READY "):
        running.stop()
        raise ServerFailed(f"{name}: unexpected first line {line!r}")
    running.ready = json.loads(line[len("READY ") :])
    return running


def read_log(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every complete JSON line of a server log written so far."""
    try:
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.endswith("\n")]
    except FileNotFoundError:
        return []


def wait_log(
    path: str | os.PathLike[str], match: Callable[[dict[str, Any]], bool], timeout: float = 5.0
) -> dict[str, Any]:
    """Poll the log until a record satisfies `match`; raises TimeoutError otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        for record in read_log(path):
            if match(record):
                return record
        if time.monotonic() > deadline:
            raise TimeoutError(f"no matching record in {path} after {timeout}s")
        time.sleep(0.02)
