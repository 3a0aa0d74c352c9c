"""``sandgate cleanup``: remove what sandgate left behind after a crash, and only that.

Kernel objects: network namespaces named ``sg-…``, links named ``sg-…`` in the host namespace,
nftables tables named ``sandgate…`` in the host namespace, session disks (tmpfs mounts whose
source is ``sandgate``) under the sessions folder, cgroups named ``sandgate-…``. Processes:
gateway daemons and test-world servers, found by the pid files sandgate wrote and killed by pid
only after their command line confirms they are ours. Objects still owned by a live sandgate
process are left alone unless ``everything`` is asked for.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from sandgate.gateway.config import RUN_ROOT
from sandgate.net import ns
from sandgate.pids import alive, is_ours, kill
from sandgate.sandbox import limits
from sandgate.sandbox.workspace import SESSIONS_ROOT, our_mounts, unmount

OWNERS = RUN_ROOT / "owners"
PROCESS_MARKERS = ("sandgate.world.servers", "sandgate-vm-")


@dataclass
class CleanupResult:
    """What a cleanup removed, by kind."""

    processes: list[int] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    tables: list[str] = field(default_factory=list)
    mounts: list[str] = field(default_factory=list)
    cgroups: list[str] = field(default_factory=list)
    guests: list[str] = field(default_factory=list)  # "instance/link" taken off a live gateway
    kept: list[str] = field(default_factory=list)

    @property
    def nothing(self) -> bool:
        return not (
            self.processes
            or self.namespaces
            or self.links
            or self.tables
            or self.mounts
            or self.cgroups
            or self.guests
        )


def own(name: str, pid: int | None = None) -> None:
    """Record that a live process owns kernel object ``name`` (so cleanup leaves it alone).
    os calls, the folder made only when missing: a session writes three of these before its
    command and removes them after it (pathlib's were ~3x the syscalls' time; issue 13)."""
    path = f"{OWNERS}/{name}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o666)
    except FileNotFoundError:
        OWNERS.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, flags, 0o666)
    try:
        os.write(fd, str(pid or os.getpid()).encode())
    finally:
        os.close(fd)


def disown(name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(f"{OWNERS}/{name}")


def owned(name: str) -> bool:
    try:
        pid = int((OWNERS / name).read_text())
    except (OSError, ValueError):
        return False
    return alive(pid)


def record_pids(name: str, pids: list[int], owner: int | None = None) -> None:
    """Remember processes we started (world servers), for cleanup after a crash."""
    path = RUN_ROOT / "pids" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"owner": owner or os.getpid(), "pids": pids}))


def add_pid(name: str, pid: int, owner: int | None = None) -> None:
    """Remember one more process, at once (a crash right after starting it must not orphan it)."""
    path = RUN_ROOT / "pids" / f"{name}.json"
    try:
        pids = list(json.loads(path.read_text()).get("pids", []))
    except (OSError, ValueError):
        pids = []
    record_pids(name, [*pids, pid], owner)


def forget_pids(name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        (RUN_ROOT / "pids" / f"{name}.json").unlink()


def cleanup(everything: bool = False) -> CleanupResult:
    result = CleanupResult()
    dead = _dead_sessions(everything)  # before the owner records below are removed
    _processes(result, everything)
    for name in ns.list_ours():
        # A namespace whose recorded owner (a session's runner) died is that session's
        # leftover even on a live gateway; one without a record lives with its instance.
        recorded = (OWNERS / name).exists()
        instance_owned = owned(name) or (not recorded and _instance_owned(name))
        if instance_owned and not everything:
            result.kept.append(name)
            continue
        ns.remove(name)
        disown(name)
        result.namespaces.append(name)
    _host_links(result, everything)
    _host_tables(result, everything)
    _session_mounts(result, everything)
    _cgroups(result, everything)
    _stale_guests(result, dead)
    if everything or not result.kept:
        with contextlib.suppress(FileNotFoundError):
            for entry in OWNERS.iterdir():
                if everything or not owned(entry.name):
                    entry.unlink()
    return result


def _dead_sessions(everything: bool) -> set[str]:
    """Sessions whose runner is gone (each runner owns ``mount-<session>`` while it runs)."""
    if not OWNERS.is_dir():
        return set()
    return {
        entry.name.removeprefix("mount-")
        for entry in OWNERS.iterdir()
        if entry.name.startswith("mount-") and (everything or not owned(entry.name))
    }


def _stale_guests(result: CleanupResult, dead: set[str]) -> None:
    """A runner killed by SIGKILL never told its gateway: a gateway that stays up still lists
    the guest (its link gone with the namespace). Take those guests off every live gateway."""
    if not dead or not RUN_ROOT.is_dir():
        return
    from sandgate.errors import GatewayError
    from sandgate.gateway.manage import find

    for folder in sorted(RUN_ROOT.iterdir()):
        handle = find(folder.name) if folder.is_dir() else None
        if handle is None:
            continue
        with contextlib.suppress(GatewayError, OSError), handle.client() as ctl:
            for link, guest in dict(ctl.call("status").get("guests", {})).items():
                if guest.get("session") in dead:
                    with contextlib.suppress(GatewayError):
                        ctl.call("remove_guest", guest=link)
                        result.guests.append(f"{handle.instance}/{link}")


def _session_mounts(result: CleanupResult, everything: bool) -> None:
    """Session disks (tmpfs named ``sandgate`` under the sessions folder) of dead sessions, with
    what is mounted inside them (the noexec binds of its home and scratch folders). A mount
    belongs to the session whose folder it is in: a live session's binds are its own, not
    sessions of their own (cleanup once took a live session's home for a dead session's)."""
    by_session: dict[str, list[Path]] = {}
    for mountpoint in our_mounts(SESSIONS_ROOT):
        session = mountpoint.relative_to(SESSIONS_ROOT).parts[0]
        by_session.setdefault(session, []).append(mountpoint)
    for session, mounts in sorted(by_session.items()):
        owner = f"mount-{session}"
        if owned(owner) and not everything:
            result.kept.append(str(SESSIONS_ROOT / session))
            continue
        for mountpoint in sorted(mounts, key=lambda m: len(m.parts), reverse=True):
            unmount(mountpoint)  # the binds inside first, then the disk
            result.mounts.append(str(mountpoint))
        shutil.rmtree(SESSIONS_ROOT / session, ignore_errors=True)
        disown(owner)


def _cgroups(result: CleanupResult, everything: bool) -> None:
    """sandgate-<session> cgroups of dead sessions, sandgate-gw-<instance> of dead gateways."""
    for name in limits.ours():
        if name.startswith(limits.GATEWAY_PREFIX):
            # A gateway's: kept while its daemon runs in it.
            instance = name.removeprefix(limits.GATEWAY_PREFIX)
            live = owned(f"instance-{instance}") or limits.populated(name)
        else:
            live = owned(name)
        if live and not everything:
            result.kept.append(f"cgroup {name}")
            continue
        try:
            limits.remove(name)
        except OSError as exc:
            result.kept.append(f"cgroup {name} ({exc.strerror})")
            continue
        disown(name)
        result.cgroups.append(name)


def _instance_owned(name: str) -> bool:
    # sg-<instance>-...: alive while its gateway daemon or its owner process lives.
    parts = name.split("-")
    return len(parts) >= 3 and owned(f"instance-{parts[1]}")


def _processes(result: CleanupResult, everything: bool) -> None:
    pid_dir = RUN_ROOT / "pids"
    if pid_dir.is_dir():
        for path in pid_dir.glob("*.json"):
            try:
                raw = json.loads(path.read_text())
            except (OSError, ValueError):
                path.unlink(missing_ok=True)
                continue
            if alive(int(raw.get("owner", 0))) and not everything:
                continue
            for pid in raw.get("pids", []):
                # World servers, and VM guests' QEMU (its -name carries the marker).
                if any(is_ours(pid, m) for m in PROCESS_MARKERS) and kill(pid):
                    result.processes.append(pid)
            path.unlink(missing_ok=True)
    if RUN_ROOT.is_dir():
        for pid_file in RUN_ROOT.glob("*/daemon.pid"):
            instance = pid_file.parent.name
            try:
                pid = int(pid_file.read_text())
            except (OSError, ValueError):
                continue
            if owned(f"instance-{instance}") and not everything:
                result.kept.append(f"gateway {instance}")
                continue
            if is_ours(pid, "sandgate.gateway.daemon") and kill(pid):
                result.processes.append(pid)
            pid_file.unlink(missing_ok=True)
            shutil.rmtree(pid_file.parent, ignore_errors=True)


def _host_links(result: CleanupResult, everything: bool) -> None:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        for link in ipr.get_links():
            name = link.get_attr("IFLA_IFNAME")
            if not name or not name.startswith(ns.OUR_PREFIXES):
                continue
            if owned(name) and not everything:
                result.kept.append(name)
                continue
            ipr.link("del", index=link["index"])
            disown(name)
            result.links.append(name)


def _host_tables(result: CleanupResult, everything: bool) -> None:
    from sandgate.net.nft import Nft

    nft = Nft()
    try:
        listing = nft.run({"nftables": [{"list": {"tables": {}}}]}) or {}
        for item in listing.get("nftables", []):
            table = item.get("table")
            if not table or not str(table.get("name", "")).startswith(ns.OUR_PREFIXES):
                continue
            label = f"{table['family']} {table['name']}"
            if owned(f"table-{table['name']}") and not everything:
                result.kept.append(label)
                continue
            nft.run(
                {
                    "nftables": [
                        {"delete": {"table": {"family": table["family"], "name": table["name"]}}}
                    ]
                }
            )
            result.tables.append(label)
    finally:
        nft.close()
