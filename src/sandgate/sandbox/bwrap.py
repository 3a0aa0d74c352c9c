"""The command line that starts a sandboxed process. Pure: a spec in, an argv out.

    nsenter --net=GUEST_NS --          (root) enter the guest's network namespace
    setpriv --reuid U --regid U ...    drop to the unprivileged uid, no capabilities, no new privs
                                       (these two steps: the runner's child does them itself
                                       now, enter.py; ``argv`` keeps them as the reference)
    bwrap --unshare-all --share-net …  (as U) new user/mount/pid/ipc/uts namespaces, a read-only
                                       system, fresh /tmp and /run, writable work dir, fresh home
      -- COMMAND

The uid switch happens *before* bwrap: bwrap run as root with ``--uid`` leaves the process root
to the host (it can read /etc/shadow; report in FIELD-NOTES). The guest's network namespace is
owned by the host's user namespace, where U holds no capability, so nothing inside can change
its links, routes or rules. /run is a fresh tmpfs and no host socket is bound, so no host unix
socket is reachable (a bound unix socket would cross the network namespace).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

SANDBOX_HOME = "/home/agent"
SANDBOX_WORK = "/work"
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Top-level host directories a sandbox sees read-only. Everything else is absent.
SYSTEM_DIRS = ("/usr", "/etc", "/opt", "/var")
MERGED_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
HIDDEN = ("/var/lib/sandgate", "/var/tmp", "/var/run", "/var/lock", "/etc/sandgate")
SCRATCH_AREAS = ("/tmp", "/var/tmp", "/dev/shm", "/run")
SCRATCH_TMPFS = 64 << 20


@dataclass(frozen=True)
class SandboxSpec:
    """What the sandbox is made with: namespace, user, command, files, scratch areas."""

    netns: str  # path of the guest's network namespace
    uid: int
    gid: int
    command: tuple[str, ...]
    workdir: Path
    home: Path
    files: dict[str, Path] = field(default_factory=dict)  # sandbox path -> host file (read-only)
    env: dict[str, str] = field(default_factory=dict)
    hostname: str = "sandgate"
    # Writable scratch areas (/tmp, /var/tmp, /dev/shm, /run) -> host dirs the runner can read
    # afterwards; an area not given here is a small tmpfs that vanishes with the sandbox.
    scratch: dict[str, Path] = field(default_factory=dict)


def argv(spec: SandboxSpec) -> list[str]:
    """The whole chain as one command line: nsenter, setpriv, then bwrap. The runner does the
    first two itself now (enter.py, with ``bwrap_argv``); this stays as their reference, for
    the benches' peer and for tests comparing the two."""
    return [*chain_argv(spec), *bwrap_argv(spec)]


def chain_argv(spec: SandboxSpec) -> list[str]:
    """nsenter into the guest's network namespace, setpriv to the sandbox's uid."""
    return [
        "nsenter",
        f"--net={spec.netns}",
        "--",
        "setpriv",
        f"--reuid={spec.uid}",
        f"--regid={spec.gid}",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        "--",
    ]


def bwrap_argv(
    spec: SandboxSpec, block_fd: int | None = None, late: Sequence[str] | None = None
) -> list[str]:
    """bwrap and the command, run as the sandbox's uid inside the guest's network namespace.
    With ``block_fd`` bwrap sets everything up, then waits for a byte there before the exec.
    With ``late`` bwrap runs that in place of the command, with no environment at all: the
    command and its environment (``base_env``) come later (enter.late_command)."""
    out = [
        "bwrap",
        "--unshare-all",
        "--share-net",
        "--die-with-parent",
        "--new-session",
        *(["--block-fd", str(block_fd)] if block_fd is not None else []),
        "--cap-drop",
        "ALL",
        "--hostname",
        spec.hostname,
    ]
    for top in MERGED_LINKS:
        if os.path.islink(top):
            out += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            out += ["--ro-bind", top, top]
    for top in SYSTEM_DIRS:
        if top == "/var":
            out += _var_binds()
        elif os.path.isdir(top):
            out += ["--ro-bind", top, top]
    for hidden in (*HIDDEN, *_home_to_hide()):
        if hidden in spec.scratch:
            continue
        if os.path.isdir(hidden) and not os.path.islink(hidden):
            out += ["--size", str(SCRATCH_TMPFS), "--tmpfs", hidden]
    out += ["--proc", "/proc", "--dev", "/dev"]
    for area in SCRATCH_AREAS:
        if area in spec.scratch:
            out += ["--bind", str(spec.scratch[area]), area]
        elif area in ("/tmp", "/run"):
            out += ["--size", str(SCRATCH_TMPFS), "--tmpfs", area]
    # bwrap's /dev is an unbounded tmpfs the sandbox could fill: read-only once set up
    # (device nodes still work; /dev/shm and /dev/pts are mounts of their own).
    out += ["--remount-ro", "/dev"]
    out += [
        "--dir",
        "/home",
        "--bind",
        str(spec.home),
        SANDBOX_HOME,
        "--bind",
        str(spec.workdir),
        SANDBOX_WORK,
    ]
    for target, source in sorted(spec.files.items()):
        out += ["--ro-bind", str(source), target]
    # The root itself is bwrap's tmpfs, unbounded: read-only once every mount point is made.
    out += ["--remount-ro", "/", "--clearenv"]
    if late is None:
        for key, value in sorted(base_env(spec).items()):
            out += ["--setenv", key, value]
    out += ["--chdir", SANDBOX_WORK, "--"]
    out += list(spec.command if late is None else late)
    return out


def _var_binds() -> list[str]:
    """/var read-only an entry at a time, leaving out /var/tmp (a scratch area or hidden
    anyway). A bind of /var whole copies every session's workspace mount below
    /var/tmp/sandgate with it, and one unmounted meanwhile (another session ending) failed the
    bind: seen once in 24 concurrent sessions."""
    if not os.path.isdir("/var"):
        return []
    out = ["--dir", "/var"]
    with os.scandir("/var") as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            path = f"/var/{entry.name}"
            if path == "/var/tmp":
                continue
            if entry.is_symlink():
                out += ["--symlink", os.readlink(path), path]
            else:
                out += ["--ro-bind", path, path]
    return out


def base_env(spec: SandboxSpec) -> dict[str, str]:
    env = {
        "PATH": SANDBOX_PATH,
        "HOME": SANDBOX_HOME,
        "USER": "agent",
        "LOGNAME": "agent",
        "LANG": "C.UTF-8",
        "TERM": os.environ.get("TERM", "dumb"),
        "TMPDIR": "/tmp",
    }
    env.update(spec.env)
    return env


def passwd_lines(uid: int, gid: int, passwd: str, group: str) -> tuple[str, str]:
    """The host's passwd/group with an ``agent`` entry for the sandbox uid, so tools that look
    the user up (git, ssh, pip's cache) work; password hashes live in shadow, which stays hidden."""
    users = [line for line in passwd.splitlines() if line and line.split(":")[0] != "agent"]
    groups = [line for line in group.splitlines() if line and line.split(":")[0] != "agent"]
    users.append(f"agent:x:{uid}:{gid}:sandgate agent:{SANDBOX_HOME}:/bin/bash")
    groups.append(f"agent:x:{gid}:")
    return "\n".join(users) + "\n", "\n".join(groups) + "\n"


def find_command(name: str, path: str = SANDBOX_PATH) -> str | None:
    """Where ``name`` would be found inside the sandbox (which sees the host's system dirs)."""
    if "/" in name:
        visible = name.startswith(("/usr/", "/bin/", "/sbin/", "/lib", "/opt/", SANDBOX_WORK + "/"))
        return name if visible or not name.startswith("/") else None
    for directory in path.split(":"):
        candidate = os.path.join(directory, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _home_to_hide() -> tuple[str, ...]:
    """sandgate's home (the store and its signing key) when it is set to a place inside the
    system directories the sandbox sees read-only: a sandbox never reads it."""
    home = os.path.realpath(os.environ.get("SANDGATE_HOME", "/var/lib/sandgate"))
    inside = any(home == top or home.startswith(top + "/") for top in SYSTEM_DIRS)
    return (home,) if inside and os.path.isdir(home) and home not in HIDDEN else ()
