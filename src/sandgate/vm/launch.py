"""Running one VM guest in a sandbox's namespace: its tap, its job, the QEMU process.

The gateway gives the sandbox's namespace its one link (eth0, with the guest's address and
route) as for any guest. For a VM that namespace becomes a wire: eth0 loses its address and
route and a new MAC, and is bridged to a tap that QEMU opens; the VM's NIC takes the guest's
MAC and address, so the gateway's ingress chain (MAC, source address, ARP, ethertype) judges the
VM's frames exactly as a namespace guest's. QEMU runs inside that namespace (no address, no
route: it can reach nothing but its tap), in the session's cgroup, and drops to the session's
uid once it has opened its files. It is killed with the session; ``sandgate cleanup`` kills a
leftover one by its recorded pid (its -name carries ``sandgate-vm``).

There is no per-process attribution from inside a VM: its attempts are the guest's (link,
session), never a uid or a process, and the session's details say so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from sandgate import cleanup
from sandgate.errors import NetError, SandboxError, SetupError
from sandgate.net import ns
from sandgate.net.links import guest_mac
from sandgate.sandbox import bwrap
from sandgate.sandbox.launch import SYSTEM_BUNDLE, Sandbox, _pump, proxy_env
from sandgate.vm import accel, disk, image, qemu

BRIDGE, TAP = "br0", "tap0"
MUTE_TABLE = "sandgate_vm"
BOOT_TIMEOUT = 180.0  # TCG on a loaded 2-core host: ~3 s guest time, 7-15 s wall (2026-12-01)
UP_MARK = b"sandgate-init: up"
CHANNEL_PROXY_URL = f"http://{qemu.CHANNEL_DOOR}:{qemu.CHANNEL_PROXY_PORT}"
ATTRIBUTION = "per guest only: a VM has its own kernel, so no uid or process is known"

NicMode = Literal["tap", "none"]


@dataclass(frozen=True)
class VmOptions:
    nic: NicMode = "tap"
    as_uid: bool = False  # run the command as the session's uid, not as root in the guest
    boot_timeout: float = BOOT_TIMEOUT
    image: disk.ImageOptions | None = None  # --image: the user's own disk, not the built-in guest


def preflight(opts: VmOptions) -> tuple[image.GuestImage, accel.Accel]:
    """Everything a VM needs that could be missing, before anything is made."""
    if shutil.which(qemu.QEMU) is None:
        raise SetupError(
            f"--vm needs QEMU ({qemu.QEMU} is not installed)",
            "apt-get install --no-install-recommends qemu-system-x86 (or ./setup.sh test)",
        )
    if opts.image is not None:
        if opts.nic != "tap":
            raise SetupError("--image boots with its NIC on the tap", "drop --nic none")
        if opts.as_uid:
            raise SetupError("--uid is not for --image: its users are its own", "drop --uid")
        info = disk.check(opts.image)
        own = image.GuestImage(
            opts.image.kernel or info.path,
            opts.image.initrd or info.path,
            f"own image {info.path.name} ({info.format}"
            + (", its own bootloader)" if opts.image.kernel is None else ", --kernel)"),
        )
        return own, accel.detect()
    if opts.nic not in ("tap", "none"):
        raise SetupError(f"unknown --nic {opts.nic!r}", "use --nic tap or --nic none")
    if opts.nic == "none" and shutil.which("nc") is None:
        raise SetupError(
            "--nic none relays through nc, which is not installed",
            "apt-get install netcat-openbsd",
        )
    return image.ensure(), accel.detect()


def wire_tap(netns: str, uid: int) -> None:
    """Turn the guest namespace's eth0 into one port of a bridge whose other port is the tap."""
    wire_mac = "02:53:56:" + ":".join(f"{b:02x}" for b in secrets.token_bytes(3))
    # First, as it becomes a wire: nothing of the namespace's own (the bridge's IGMP reports,
    # say) may leave through the bridge; the VM's frames are forwarded, not output, and pass.
    mute = (
        f"table bridge {MUTE_TABLE} {{\n  chain out {{\n"
        "    type filter hook output priority 0; policy drop;\n  }\n}\n"
    )
    proc = subprocess.run(
        [*ns.nsenter_argv(netns), "nft", "-f", "-"],
        input=mute,
        text=True,
        capture_output=True,
        check=False,
    )
    if proc.returncode != 0:
        raise NetError(f"could not mute the VM's wire in {netns}: {proc.stderr.strip()}")
    batch = "\n".join(
        [
            "addr flush dev eth0",
            "link set eth0 down",  # drops every route through it
            "route flush table main",
            f"link set eth0 address {wire_mac}",
            f"link add {BRIDGE} type bridge stp_state 0",
            f"tuntap add dev {TAP} mode tap user {uid} group {uid}",
            f"link set eth0 master {BRIDGE}",
            f"link set {TAP} master {BRIDGE}",
            f"link set {BRIDGE} up",
            "link set eth0 up",
            f"link set {TAP} up",
            "",
        ]
    )
    proc = subprocess.run(
        ["ip", "-n", netns, "-batch", "-"], input=batch, text=True, capture_output=True, check=False
    )
    if proc.returncode != 0:
        raise NetError(f"could not wire the VM's tap in {netns}: {proc.stderr.strip()}")


def job_for(box: Sandbox, spec: bwrap.SandboxSpec, opts: VmOptions) -> qemu.Job:
    """The namespace guest's files and environment, as the VM's job (paths under /sg)."""
    binds: dict[str, str] = {}
    if opts.nic == "none":
        # The channel's door in place of the gateway's address: resolver (over TCP: the
        # forwards carry TCP only) and proxy. Written apart: etc/ is the drift snapshot's.
        door = box.dir / "vm" / "resolv.conf"
        door.write_text(f"nameserver {qemu.CHANNEL_DOOR}\noptions use-vc timeout:3 attempts:2\n")
        os.chmod(door, 0o644)
        spec = dataclasses.replace(
            spec,
            files={**spec.files, "/etc/resolv.conf": door},
            env={**spec.env, **proxy_env(CHANNEL_PROXY_URL)},
        )
    for target, source in spec.files.items():
        src = Path(source).resolve()
        if box.dir.resolve() not in src.parents:
            copy = box.dir / "files" / f"vm-{len(binds)}-{src.name}"
            copy.parent.mkdir(mode=0o755, exist_ok=True)
            shutil.copyfile(src, copy)
            os.chmod(copy, 0o644)
            src = copy.resolve()
        binds[target] = "/sg/" + str(src.relative_to(box.dir.resolve()))
    env = bwrap.base_env(spec)
    if not opts.as_uid:
        env.update(USER="root", LOGNAME="root")
    return qemu.Job(tuple(spec.command), env, binds, spec.uid if opts.as_uid else None)


def details(a: accel.Accel, opts: VmOptions, guest_image: image.GuestImage) -> dict[str, Any]:
    own = {} if opts.image is None else {"image": str(opts.image.disk.absolute())}
    return {
        **own,
        "accel": a.name,
        "accel_why": a.why,
        "nic": opts.nic,
        "kernel": guest_image.release,
        "user": "uid" if opts.as_uid else "root",
        "attribution": ATTRIBUTION,
    }


def run(
    box: Sandbox,
    spec: bwrap.SandboxSpec,
    guest: dict[str, Any],
    opts: VmOptions,
    guest_image: image.GuestImage,
    a: accel.Accel,
    timeout: float | None,
    stop: threading.Event | None = None,
    capture: Path | None = None,
    echo: bool = True,
    prefix: list[str] | None = None,
) -> int:
    """Boot the VM, run the command in it, return its exit status (124: out of time, 143:
    stopped). The QEMU process is ``box.proc``, so ``box.kill()`` ends it."""
    if opts.image is not None:
        return _run_image(box, spec, guest, opts, opts.image, a, timeout, stop, capture, echo,
                          prefix)  # fmt: skip
    # QEMU, once dropped to the uid, must open the share's root (0711 for namespace guests).
    os.chown(box.dir, 0, spec.uid)
    os.chmod(box.dir, 0o750)
    vmdir = box.dir / "vm"
    vmdir.mkdir(mode=0o700, exist_ok=True)
    os.chown(vmdir, spec.uid, spec.uid)  # QEMU, once it drops to the uid, writes the exit file
    (vmdir / "job.sh").write_text(qemu.job_script(job_for(box, spec, opts)))
    nic: qemu.Nic | qemu.Channel | None = None
    exit_file = vmdir / "exit"
    # The console log outlives the session's disk (next to its output), for a failed boot.
    console = (capture.parent if capture is not None else vmdir) / "vm-console.log"
    if opts.nic == "none":
        door = urlsplit(str(guest["proxy"]))
        gateway = str(guest["gateway"])
        nic = qemu.Channel((door.hostname or gateway, door.port or 3128), (gateway, 53))
    else:
        wire_tap(box.netns, spec.uid)
        nic = qemu.Nic(
            TAP,
            str(guest.get("mac") or guest_mac(int(guest["index"]))),
            f"{guest['address']}/30",
            guest["gateway"],
        )
    vm = qemu.VmSpec(
        box.session,
        guest_image.boot_kernel(a),
        guest_image.initrd,
        box.dir,
        spec.workdir.resolve(),
        a,
        nic,
        spec.uid,
    )
    argv = [*(prefix or []), *ns.nsenter_argv(box.netns), *qemu.argv(vm, console)]

    def no_boot() -> Exception:
        return SandboxError(
            f"the VM guest did not boot within {opts.boot_timeout:g} s (accelerator {a.name})",
            f"see its console log {console}",
        )

    watch = _Watch(capture, vmdir, echo, timeout, stop, opts.boot_timeout,
                   lambda: UP_MARK in _read(console), no_boot)  # fmt: skip
    ended = _boot_and_wait(box, argv, watch)
    if ended is not None:
        return ended
    try:
        return int(exit_file.read_text().strip())
    except (OSError, ValueError):
        tail = _read(console).decode(errors="replace").strip().splitlines()[-5:]
        raise SandboxError(
            "the VM guest stopped without running the command: " + " / ".join(tail),
            f"see its console log {console}",
        ) from None


def _run_image(
    box: Sandbox,
    spec: bwrap.SandboxSpec,
    guest: dict[str, Any],
    opts: VmOptions,
    own: disk.ImageOptions,
    a: accel.Accel,
    timeout: float | None,
    stop: threading.Event | None,
    capture: Path | None,
    echo: bool,
    prefix: list[str] | None,
) -> int:
    """--image: the user's disk behind a temporary overlay, told what to do by a NoCloud seed."""
    info = disk.check(own)
    vmdir = box.dir / "vm"
    vmdir.mkdir(mode=0o700, exist_ok=True)
    os.chown(vmdir, spec.uid, spec.uid)
    mac = str(guest.get("mac") or guest_mac(int(guest["index"])))
    bundle = spec.files.get(str(SYSTEM_BUNDLE))  # system trust + the gateway's CA
    env = {k: v for k, v in spec.env.items() if k not in ("PATH", "HOME", "USER", "LOGNAME")}
    seed = disk.Seed(
        mac,
        f"{guest['address']}/30",
        str(guest["gateway"]),
        str(guest["gateway"]),
        tuple(spec.command),
        env,
        Path(bundle).read_bytes() if bundle is not None else b"",
    )
    overlay = vmdir / "overlay.qcow2"
    console = (capture.parent if capture is not None else vmdir) / "vm-console.log"
    status = vmdir / "status.log"
    try:
        disk.create_overlay(info, overlay)
        seed_iso = disk.build_seed(disk.seed_files(seed, box.session), vmdir / "seed", vmdir
                                   / "seed.iso")  # fmt: skip
        wire_tap(box.netns, spec.uid)
        vm = qemu.VmSpec(
            box.session,
            own.kernel,
            own.initrd,
            box.dir,
            spec.workdir.resolve(),
            a,
            qemu.Nic(TAP, mac, seed.address, seed.gateway),
            spec.uid,
            drives=qemu.Drives(overlay, seed_iso, status, info.root),
        )
        argv = [*(prefix or []), *ns.nsenter_argv(box.netns), *qemu.argv(vm, console)]
        watch = _Watch(capture, vmdir, echo, timeout, stop, opts.boot_timeout,
                       lambda: disk.SEED_MARK in _read(status),
                       lambda: disk.no_seed_error(_read(console), opts.boot_timeout, own,
                                                  console))  # fmt: skip
        ended = _boot_and_wait(box, argv, watch)
        if ended is not None:
            return ended
    finally:
        # The overlay holds whatever the guest wrote: it goes now, not with the session's disk.
        with contextlib.suppress(FileNotFoundError):
            overlay.unlink()
    code = disk.exit_status(_read(status))
    if code is None:
        if disk.SEED_MARK not in _read(status):
            raise disk.no_seed_error(_read(console), opts.boot_timeout, own, console)
        raise SandboxError(
            "the image ran the seed but stopped before the command's exit status",
            f"see its console log {console}",
        )
    return code


@dataclass(frozen=True)
class _Watch:
    """What a running guest is watched for: its output, the time it has, and its boot mark."""

    capture: Path | None
    vmdir: Path
    echo: bool
    timeout: float | None
    stop: threading.Event | None
    boot_timeout: float
    booted: Callable[[], bool]
    no_boot: Callable[[], Exception]


def _boot_and_wait(box: Sandbox, argv: list[str], w: _Watch) -> int | None:
    """Start QEMU as ``box.proc`` and wait for it: None once it has stopped by itself, 143 on
    ``stop``, 124 out of time; raise ``w.no_boot()`` if the mark is not seen in time. QEMU is
    always ended and forgotten on return."""
    box.proc = subprocess.Popen(
        argv,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    cleanup.add_pid(f"vm-{box.session}", box.proc.pid)
    box.output = w.capture
    out = w.capture or w.vmdir / "output.log"
    pump = threading.Thread(target=_pump, args=(box.proc, out, w.echo), name="vm-out",
                            daemon=True)  # fmt: skip
    pump.start()
    started = time.monotonic()
    deadline = None if w.timeout is None else started + w.timeout
    booted = False
    try:
        while True:
            try:
                box.proc.wait(timeout=0.2)
                return None
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if w.stop is not None and w.stop.is_set():
                return 143
            if deadline is not None and now >= deadline:
                return 124
            if not booted:
                booted = w.booted()
                if not booted and now - started > w.boot_timeout:
                    raise w.no_boot()
    finally:
        _end(box)
        pump.join(timeout=5)
        cleanup.forget_pids(f"vm-{box.session}")


def _end(box: Sandbox) -> None:
    proc = box.proc
    if proc is None or proc.poll() is not None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=3)
            return


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""
