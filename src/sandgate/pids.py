"""Is this pid ours, and is it alive: the one check before sandgate signals a process by pid.

A pid file can outlive its process and the pid be handed to someone else's, so every kill by
pid (``sandgate down``, ``sandgate cleanup``, stopping a gateway daemon) first confirms the
process is alive (a zombie is not) and that its command line names the sandgate part it must
be (``sandgate.gateway.daemon``, ``sandgate.world.servers``, ``sandgate``).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

__all__ = ["alive", "is_ours", "kill"]


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (a pid <= 0 is never a process)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def is_ours(pid: int, marker: str) -> bool:
    """``pid`` is alive and ``marker`` is part of its command line."""
    if not alive(pid):
        return False
    try:
        return marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def kill(pid: int, grace: float = 2.0) -> bool:
    """SIGTERM, then SIGKILL after ``grace`` seconds; True once the process is gone."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return True
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if not alive(pid):
                return True
            time.sleep(0.05)
    return not alive(pid)
