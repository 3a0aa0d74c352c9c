"""The pure half of process attribution: /proc formats parsed, chains classified.

No I/O here (procattr.py reads the files and sockets and calls these; the sock_diag wire
format is net/sockdiag.py).
"""

from __future__ import annotations

import contextlib
import enum
import ipaddress
import struct
from dataclasses import dataclass
from typing import Any

from sandgate.events.redact import redact_argv
from sandgate.net.sockdiag import PROTOCOLS

# Programs that only set a sandbox up (sandbox/bwrap.py's argv): never the framework.
LAUNCHERS = frozenset({"nsenter", "setpriv", "bwrap", "unshare"})
MAX_DEPTH = 64
_MAX_SOCKETS = 65536


class Role(enum.StrEnum):
    FRAMEWORK = "framework"  # the sandbox's top command (or one of its threads)
    TOOL = "tool"  # a process the framework started, at any depth
    LAUNCHER = "launcher"  # nsenter, setpriv or bwrap above the top command
    OUTSIDE = "outside"  # in the guest's namespace, but not under the sandbox's root


# --- pure parsers -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SockEntry:
    """One line of ``/proc/net/{tcp,tcp6,udp,udp6}``. Addresses are unmapped (``::ffff:a.b.c.d``
    becomes ``a.b.c.d``); ``state`` is the kernel's TCP state number (UDP: 7 unconnected, 1
    connected); ``inode`` 0 means no socket file (TIME_WAIT, a half-open request)."""

    proto: str  # "tcp" | "udp"
    local: str
    lport: int
    remote: str
    rport: int
    state: int
    uid: int
    inode: int


def parse_hex_address(text: str) -> tuple[str, int]:
    """``0100007F:0050`` -> ("127.0.0.1", 80). The address is 32-bit words in host order."""
    addr, _, port = text.partition(":")
    if len(addr) not in (8, 32) or not port:
        raise ValueError(f"not an address:port in /proc/net format: {text!r}")
    raw = b"".join(struct.pack("=I", int(addr[i : i + 8], 16)) for i in range(0, len(addr), 8))
    ip = ipaddress.ip_address(raw)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped), int(port, 16)
    return str(ip), int(port, 16)


def parse_proc_net(text: str, proto: str) -> list[SockEntry]:
    """The sockets in one ``/proc/PID/net/`` table; ``proto`` is the file's name (``tcp6``...).

    Lines that do not parse are skipped: the table is read while it changes.
    """
    base = proto.removesuffix("6")
    if base not in PROTOCOLS:
        raise ValueError(f"unknown table {proto!r}: tcp, tcp6, udp or udp6")
    out: list[SockEntry] = []
    for line in text.splitlines()[1:]:
        cols = line.split()
        if len(cols) < 10:
            continue
        try:
            local, lport = parse_hex_address(cols[1])
            remote, rport = parse_hex_address(cols[2])
            out.append(
                SockEntry(
                    base, local, lport, remote, rport, int(cols[3], 16), int(cols[7]), int(cols[9])
                )
            )
        except ValueError:
            continue
    return out


@dataclass(frozen=True, slots=True)
class ProcStat:
    """What ``/proc/PID/stat`` says that we use. ``start`` is in clock ticks since boot."""

    pid: int
    comm: str
    state: str
    ppid: int
    start: int


def parse_stat(text: str) -> ProcStat:
    """``/proc/PID/stat``. The name sits in parentheses and may hold spaces and ``)``."""
    open_at, close_at = text.find("("), text.rfind(")")
    if open_at < 0 or close_at < open_at:
        raise ValueError("no (comm) in /proc/PID/stat")
    rest = text[close_at + 1 :].split()
    if len(rest) < 20:
        raise ValueError("/proc/PID/stat too short")
    return ProcStat(
        int(text[:open_at]), text[open_at + 1 : close_at], rest[0], int(rest[1]), int(rest[19])
    )


def parse_status_ppid(text: str) -> int:
    """The ``PPid:`` line of ``/proc/PID/status``."""
    for line in text.splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    raise ValueError("no PPid line in /proc/PID/status")


def parse_cmdline(raw: bytes) -> list[str]:
    """``/proc/PID/cmdline``: NUL-separated, NUL-terminated; bytes that are not UTF-8 escaped."""
    if not raw:
        return []
    return [a.decode("utf-8", "backslashreplace") for a in raw.removesuffix(b"\0").split(b"\0")]


def parse_socket_link(target: str) -> int | None:
    """``socket:[123]`` (a ``/proc/PID/fd`` link) -> 123; anything else -> None."""
    if target.startswith("socket:[") and target.endswith("]"):
        with contextlib.suppress(ValueError):
            return int(target[8:-1])
    return None


def classify_chain(exes: list[str | None], reached_root: bool) -> Role:
    """The role of ``exes[0]`` (the socket's holder), given the programs (base names) of its
    chain up to the sandbox's root, ``exes[-1]``. The top command is the first one below the
    launchers at the root's end; a chain that never reached the root is ``outside``."""
    if not reached_root or not exes:
        return Role.OUTSIDE
    top = len(exes) - 1
    while top >= 0 and exes[top] in LAUNCHERS:
        top -= 1
    if top < 0:
        return Role.LAUNCHER
    return Role.FRAMEWORK if top == 0 else Role.TOOL


# --- the lookup ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcInfo:
    """The process that held a flow's socket. ``chain`` runs from it up to the sandbox's root,
    ``(pid, comm)`` each. ``exe`` is None when the process left before it could be read."""

    pid: int
    exe: str | None
    cmdline: list[str]
    chain: list[tuple[int, str]]
    role: str
    inode: int = 0
    uid: int | None = None
    parents: tuple[str, ...] = ()  # the executables above it in the chain, nearest first

    def details(self) -> dict[str, Any]:
        """For an event's ``details``: plain JSON types only (the role's text, not its enum),
        which the store's writer process is sent as data (events/writer.py)."""
        return {
            "pid": self.pid,
            "exe": self.exe,
            "cmdline": redact_argv(self.cmdline),  # a URL with a token, -H 'Authorization: …'
            "chain": [[pid, comm] for pid, comm in self.chain],
            "parents": list(self.parents),
            "role": str(self.role),
        }
