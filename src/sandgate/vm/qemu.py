"""QEMU's command line and the guest's job, as pure functions of a ``VmSpec``.

The guest's init (init.sh) sources ``<session>/vm/job.sh``, which defines two functions:
``sg_binds`` (session files over system ones, as bwrap binds them for a namespace guest) and
``sg_run`` (the command: chrooted into the guest's root, environment cleared, as root or,
with ``uid``, dropped to it by setpriv). Every word in it is quoted with ``shlex.quote``.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sandgate.vm.accel import Accel

QEMU = "qemu-system-x86_64"
MARKER = "sandgate-vm"  # in QEMU's -name, so `sandgate cleanup` knows the process is ours
GUEST_ROOT = "/newroot"  # where init builds the command's root
MEMORY_MB = 512
# Two vCPUs where the host has two cores: under TCG each is a host thread of its own (QEMU's
# multi-threaded TCG), so an agent's parallel work (a build, prove's probes) is not serialised
# on one; prove as root in a TCG guest took 29.3 s with one, 21.4 s with two (docs/NOTES.md).
VCPUS = min(2, os.cpu_count() or 1)


@dataclass(frozen=True)
class Nic:
    """The guest's one NIC: a tap in QEMU's namespace (bridged to the guest link there)."""

    tap: str
    mac: str
    address: str  # CIDR, e.g. 10.99.0.2/30
    gateway: str


# --nic none: the guest's side of the host channel (QEMU's user-mode stack, nothing else).
CHANNEL_GUEST = "10.0.2.15/24"
CHANNEL_DOOR = "10.0.2.100"  # the only address that answers: the proxy and resolver forwards
CHANNEL_PROXY_PORT = 3128


@dataclass(frozen=True)
class Channel:
    """No link at all: the guest's one virtio NIC ends in QEMU's user-mode stack with
    ``restrict=on`` (no packet of the guest is routed anywhere) and two forwards, each
    connection run through ``nc`` to a destination fixed here: the gateway's explicit proxy
    and its resolver (DNS over TCP). QEMU, and so every ``nc``, runs in the guest's namespace:
    what they send leaves from the guest's address through the gateway's rules."""

    proxy: tuple[str, int]
    resolver: tuple[str, int]

    def netdev(self) -> str:
        fwd = [
            f"guestfwd=tcp:{CHANNEL_DOOR}:{CHANNEL_PROXY_PORT}-cmd:nc -N {self.proxy[0]} "
            f"{self.proxy[1]}",
            f"guestfwd=tcp:{CHANNEL_DOOR}:53-cmd:nc -N {self.resolver[0]} {self.resolver[1]}",
        ]
        return ",".join(["user", "id=n0", "restrict=on", "ipv6=off", "net=10.0.2.0/24", *fwd])


@dataclass(frozen=True)
class Drives:
    """--image: the user's disk (as its overlay) and the NoCloud seed, in place of the 9p
    shares; a third serial port carries the seed's marks and the exit status."""

    overlay: Path
    seed: Path
    status_log: Path
    root: str  # root= when booted with the user's --kernel


@dataclass(frozen=True)
class VmSpec:
    session: str
    kernel: Path | None  # None: the --image disk boots its own bootloader
    initrd: Path | None
    share: Path  # the session's folder: home, scratch, etc (9p tag "sg")
    workdir: Path  # /work (9p tag "work"): the session's own or the user's --workdir
    accel: Accel
    nic: Nic | Channel | None  # None: no network device at all
    runas: int | None = None  # QEMU drops to this uid:gid once it has opened its files
    memory_mb: int = MEMORY_MB
    vcpus: int = VCPUS
    drives: Drives | None = None  # --image; kernel/initrd then the user's, or None: its own


def image_cmdline(root: str) -> str:
    """The user's kernel's command line: its root disk, the console, three serial ports."""
    return f"root={root} console=ttyS0 panic=-1 8250.nr_uarts=3"


# Under TCG only (every emulated instruction counts; a KVM guest keeps the stock boot), each
# measured on Debian's 6.1 kernel, 2026-12-02 (docs/NOTES.md): PCI interrupts from the BIOS's
# $PIR table, not ACPI's interrupt links (evaluating their AML as virtio_pci probes each device
# took ~1.6 s), and no crypto self-tests at boot (~1 s). Not acpi=off: without ACPI's HPET the
# guest cannot calibrate its TSC and keeps time in 4 ms jiffies. tsc=reliable: with two vCPUs
# the guest's TSC sync check fails under TCG and time falls back to the HPET, an emulated MMIO
# read per clock read; TCG derives every vCPU's TSC from one host clock, so they agree.
TCG_CMDLINE = ("pci=noacpi", "cryptomgr.notests", "tsc=reliable")


def kernel_cmdline(nic: Nic | Channel | None, accel: Accel | None = None) -> str:
    words = ["console=ttyS0", "quiet", "loglevel=3", "panic=-1", "8250.nr_uarts=2"]
    if accel is not None and accel.name == "tcg":
        words += TCG_CMDLINE
    if isinstance(nic, Nic):
        words += [f"sg.ip={nic.address}", f"sg.gw={nic.gateway}"]
    elif isinstance(nic, Channel):
        words.append(f"sg.ip={CHANNEL_GUEST}")  # and no route: only the door is on-link
    return " ".join(words)


def argv(spec: VmSpec, console_log: Path) -> list[str]:
    """QEMU's argv: no default devices, two serial ports (console to a file, the command's
    output on stdout), the host's / read-only and the session folder over 9p, one NIC or none."""
    out = [
        QEMU,
        "-name",
        f"{MARKER}-{spec.session}",
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-no-reboot",
        *spec.accel.qemu_args(),
        "-smp",
        str(spec.vcpus),
        "-m",
        str(spec.memory_mb),
    ]
    d = spec.drives
    if spec.kernel is not None and spec.initrd is not None:
        cmdline = kernel_cmdline(spec.nic, spec.accel) if d is None else image_cmdline(d.root)
        out += ["-kernel", str(spec.kernel), "-initrd", str(spec.initrd), "-append", cmdline]
    out += [
        "-chardev",
        f"file,id=con,path={console_log}",
        "-serial",
        "chardev:con",
        "-chardev",
        "stdio,id=out,signal=off",
        "-serial",
        "chardev:out",
    ]
    if d is None:
        out += [
            "-virtfs",
            "local,path=/,mount_tag=host,security_model=none,readonly=on",
            "-virtfs",
            f"local,path={spec.share},mount_tag=sg,security_model=none",
            "-virtfs",
            f"local,path={spec.workdir},mount_tag=work,security_model=none",
        ]
    else:
        out += [
            "-chardev",
            f"file,id=status,path={d.status_log}",
            "-serial",
            "chardev:status",
            "-drive",
            f"file={d.overlay},format=qcow2,if=virtio,cache=unsafe",
            "-drive",
            f"file={d.seed},format=raw,if=virtio,readonly=on",
        ]
    if spec.nic is None:
        out += ["-nic", "none"]
    elif isinstance(spec.nic, Channel):
        out += ["-netdev", spec.nic.netdev(), "-device", "virtio-net-pci,netdev=n0"]
    else:
        out += [
            "-netdev",
            f"tap,id=n0,ifname={spec.nic.tap},script=no,downscript=no",
            "-device",
            f"virtio-net-pci,netdev=n0,mac={spec.nic.mac}",
        ]
    if spec.runas is not None:
        out += ["-runas", f"{spec.runas}:{spec.runas}"]
    return out


@dataclass(frozen=True)
class Job:
    command: Sequence[str]
    env: Mapping[str, str]
    binds: Mapping[str, str] = field(default_factory=dict)  # guest path -> path under /sg
    uid: int | None = None  # None: root in the guest
    workdir: str = "/work"


def job_script(job: Job) -> str:
    """The job file init sources (see the module docstring)."""
    q = shlex.quote
    lines = ["# written by sandgate for one VM session", "sg_binds() {", "    :"]
    lines += [f"    bind {q(src)} {q(dst)}" for dst, src in sorted(job.binds.items())]
    lines.append("}")
    inner = ["/usr/bin/env", "-i", *(f"{k}={v}" for k, v in sorted(job.env.items()))]
    if job.uid is not None:
        inner += [
            "/usr/bin/setpriv",
            f"--reuid={job.uid}",
            f"--regid={job.uid}",
            "--clear-groups",
            "--",
        ]
    inner += list(job.command)
    shell = f'cd {q(job.workdir)} && exec "$@"'
    words = ["chroot", GUEST_ROOT, "/bin/sh", "-c", shell, "sg-job", *inner]
    lines += ["sg_run() {", "    " + " ".join(q(w) for w in words), "}"]
    return "\n".join(lines) + "\n"
