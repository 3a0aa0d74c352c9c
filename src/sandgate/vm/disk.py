"""Bring your own guest (`--vm --image DISK`): the user's disk, its overlay, and a NoCloud seed.

The disk is never written: QEMU boots a temporary qcow2 overlay (``qemu-img create -b``) that
is removed with the session. The command reaches the guest on a NoCloud seed (an ISO9660 image
labelled ``cidata``, made by genisoimage) holding ``meta-data``, ``network-config`` (v2, the
guest's /30 and resolver), ``user-data`` (a cloud-config that writes ``/run/sandgate.sh`` and
runs it) and the same script as ``sandgate.sh`` for an image whose own init reads the seed
without cloud-init. The script sets the address, route, resolver, CA bundle and proxy variables,
runs the command as root with its output on the second serial port (ttyS1) and writes
``sandgate-exit: N`` on the third (ttyS2), then powers off. Its first line on ttyS2,
``sandgate-seed: read``, tells the runner the seed was run: without it by the boot timeout, the
image lacks cloud-init (or did not boot at all: nothing on its console).

cloud-config is YAML; JSON is YAML, so the user-data is written with ``json`` (no YAML writer).
"""

from __future__ import annotations

import base64
import json
import re
import shlex
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sandgate.errors import SandboxError, SetupError

QEMU_IMG, GENISO = "qemu-img", "genisoimage"
SEED_MARK = b"sandgate-seed: read"
EXIT_MARK = re.compile(rb"sandgate-exit: (\d+)")
SCRIPT = "sandgate.sh"
GUEST_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
GUEST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CA_VARS = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "PIP_CERT", "GIT_SSL_CAINFO")
# Formats qemu-img names besides raw that are disk images (it reports "raw" for anything else).
IMAGE_FORMATS = ("qcow2", "qcow", "vmdk", "vdi", "vhdx", "vpc", "qed")


@dataclass(frozen=True)
class ImageOptions:
    disk: Path
    kernel: Path | None = None
    initrd: Path | None = None
    cloud_init: bool = False  # the image runs cloud-init (only changes what a timeout says)


@dataclass(frozen=True)
class DiskInfo:
    path: Path  # absolute
    format: str
    root: str  # root= for a --kernel boot: the whole disk or its first partition


def check(opts: ImageOptions) -> DiskInfo:
    """Every piece of ``--image`` that could be missing or wrong, before anything is made."""
    for tool, pkg in ((QEMU_IMG, "qemu-utils"), (GENISO, "genisoimage")):
        if shutil.which(tool) is None:
            raise SetupError(
                f"--image needs {tool} (not installed)",
                f"apt-get install --no-install-recommends {pkg} (or ./setup.sh test)",
            )
    if opts.kernel is None and opts.initrd is not None:
        raise SetupError("--initrd needs --kernel", "give --kernel VMLINUZ too, or neither")
    if opts.kernel is not None and opts.initrd is None:
        raise SetupError(
            f"--kernel {opts.kernel} needs --initrd: a distribution kernel loads its disk and "
            "filesystem drivers from the initrd",
            "give --initrd INITRD (the initrd.img beside the vmlinuz), or neither to boot the "
            "disk's own bootloader",
        )
    for flag, path in (("--kernel", opts.kernel), ("--initrd", opts.initrd)):
        if path is not None and not path.is_file():
            raise SetupError(f"{flag} {path}: no such file", f"give the path of the {flag[2:]}")
    disk = opts.disk.absolute()
    if not disk.is_file():
        raise SetupError(f"--image {opts.disk}: no such disk image", "give a qcow2 or raw disk")
    fmt = _format(disk)
    head = read_head(disk, fmt)
    kind = classify_head(head)
    if fmt == "raw" and kind is None:
        raise SetupError(
            f"--image {opts.disk} is not a disk image: no partition table or filesystem in it",
            "give a qcow2 or raw disk (e.g. a Debian cloud image, or one made by mke2fs -d)",
        )
    return DiskInfo(disk, fmt, "/dev/vda" if kind == "filesystem" else "/dev/vda1")


def classify_head(head: bytes) -> str | None:
    """``filesystem`` (a whole-disk ext2/3/4 or XFS), ``partitioned`` (an MBR or GPT), or
    None: nothing a disk starts with."""
    if len(head) >= 1082 and head[1080:1082] == b"\x53\xef":  # ext superblock magic 0xEF53
        return "filesystem"
    if head[:4] == b"XFSB":
        return "filesystem"
    if len(head) >= 512 and head[510:512] == b"\x55\xaa":  # MBR (and GPT's protective MBR)
        return "partitioned"
    return None


def _format(disk: Path) -> str:
    proc = subprocess.run(
        [QEMU_IMG, "info", "--output=json", str(disk)], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise SetupError(
            f"--image {disk}: qemu-img cannot open it: {_tail(proc.stderr)}",
            "give a readable qcow2 or raw disk",
        )
    fmt = str(json.loads(proc.stdout).get("format", ""))
    if fmt != "raw" and fmt not in IMAGE_FORMATS:
        raise SetupError(f"--image {disk}: {fmt!r} is not a disk format QEMU boots here")
    return fmt


def read_head(disk: Path, fmt: str, size: int = 2048) -> bytes:
    """The disk's first bytes as the guest would see them (through qcow2 etc. via qemu-io)."""
    if fmt == "raw":
        with disk.open("rb") as f:
            return f.read(size)
    proc = subprocess.run(
        ["qemu-io", "-r", "-f", fmt, "-c", f"read -v 0 {size}", str(disk)],
        capture_output=True,
        text=True,
        check=False,
    )
    out = bytearray()
    for line in proc.stdout.splitlines():
        # 00000000:  eb 63 90 10 ...  ascii: 16 hex bytes after the offset
        match = re.match(r"^[0-9a-f]{8}:\s+((?:[0-9a-f]{2}\s){1,16})", line)
        if match:
            out += bytes.fromhex(match.group(1))
    return bytes(out)


def create_overlay(info: DiskInfo, dest: Path) -> Path:
    """A qcow2 over the user's disk: QEMU writes here; the disk is opened read-only."""
    proc = subprocess.run(
        [QEMU_IMG, "create", "-q", "-f", "qcow2", "-F", info.format, "-b", str(info.path),
         str(dest)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise SandboxError(f"could not make the disk's overlay: {_tail(proc.stderr)}")
    return dest


@dataclass(frozen=True)
class Seed:
    """What the guest is told: its NIC (by MAC), address, gateway, and what to run."""

    mac: str
    address: str  # CIDR
    gateway: str
    nameserver: str
    command: Sequence[str]
    env: Mapping[str, str]
    ca_bundle: bytes = b""
    hostname: str = "sandgate"


def guest_script(seed: Seed) -> str:
    """The script the seed runs as root in the guest (busybox sh or any POSIX sh)."""
    q = shlex.quote
    env = {"PATH": GUEST_PATH, "HOME": "/root", "USER": "root", "LOGNAME": "root",
           "LANG": "C.UTF-8", "TMPDIR": "/tmp", **seed.env}  # fmt: skip
    if seed.ca_bundle:
        env.update(dict.fromkeys(CA_VARS, GUEST_BUNDLE))
    run = ["env", "-i", *(f"{k}={v}" for k, v in sorted(env.items())), *seed.command]
    lines = [
        "#!/bin/sh",
        "# written by sandgate: this guest's network, trust and command",
        f"export PATH={GUEST_PATH}",
        "echo 'sandgate-seed: read' > /dev/ttyS2",
        "fail() { echo \"sandgate-seed: FAILED $*\" > /dev/ttyS2; echo 'sandgate-exit: 125' "
        "> /dev/ttyS2; sync; poweroff -f; exit 125; }",
        f"mac={q(seed.mac.lower())}",
        "dev=''",
        'for d in /sys/class/net/*; do [ "$(cat "$d/address")" = "$mac" ] && dev=${d##*/}; done',
        '[ -n "$dev" ] || fail "no NIC with MAC $mac"',
        'for f in /proc/sys/net/ipv6/conf/*/disable_ipv6; do echo 1 > "$f"; done 2>/dev/null',
        'ip addr flush dev "$dev"',
        f'ip addr add {q(seed.address)} dev "$dev" || fail "address {seed.address}"',
        'ip link set "$dev" up',
        f'ip route replace default via {q(seed.gateway)} || fail "route via {seed.gateway}"',
        "rm -f /etc/resolv.conf",
        f"echo {q(f'nameserver {seed.nameserver}')} > /etc/resolv.conf",
    ]
    if seed.ca_bundle:
        pem = seed.ca_bundle.decode("ascii", errors="replace").rstrip("\n")
        lines += [
            f"mkdir -p {q(str(Path(GUEST_BUNDLE).parent))}",
            f"cat > {GUEST_BUNDLE} <<'SANDGATE_CA_END'",
            pem,
            "SANDGATE_CA_END",
        ]
    lines += [
        "stty -F /dev/ttyS1 raw -echo 2>/dev/null",
        "cd /root 2>/dev/null || cd /",
        " ".join(q(w) for w in run) + " < /dev/null > /dev/ttyS1 2>&1",
        'echo "sandgate-exit: $?" > /dev/ttyS2',
        "sync",
        "poweroff -f",
        "",
    ]
    return "\n".join(lines)


def seed_files(seed: Seed, instance: str) -> dict[str, bytes]:
    """The NoCloud seed's files (name -> content)."""
    script = guest_script(seed)
    network = {
        "version": 2,
        "ethernets": {
            "sg0": {
                "match": {"macaddress": seed.mac.lower()},
                "addresses": [seed.address],
                "routes": [{"to": "0.0.0.0/0", "via": seed.gateway}],
                "nameservers": {"addresses": [seed.nameserver]},
            }
        },
    }
    user = {
        "write_files": [
            {
                "path": "/run/" + SCRIPT,
                "permissions": "0700",
                "encoding": "b64",
                "content": base64.b64encode(script.encode()).decode(),
            }
        ],
        "runcmd": [["/bin/sh", "/run/" + SCRIPT]],
    }
    meta = {"instance-id": instance, "local-hostname": seed.hostname}
    return {
        "meta-data": json.dumps(meta, indent=1).encode() + b"\n",
        "network-config": json.dumps(network, indent=1).encode() + b"\n",
        "user-data": b"#cloud-config\n" + json.dumps(user, indent=1).encode() + b"\n",
        SCRIPT: script.encode(),
    }


def build_seed(files: Mapping[str, bytes], folder: Path, dest: Path) -> Path:
    """The seed as an ISO9660 image labelled ``cidata`` (what NoCloud looks for)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (folder / name).write_bytes(content)
    proc = subprocess.run(
        [GENISO, "-quiet", "-output", str(dest), "-volid", "cidata", "-joliet", "-rock",
         str(folder)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise SandboxError(f"could not make the cloud-init seed: {_tail(proc.stderr)}")
    return dest


def no_seed_error(
    console: bytes, timeout: float, opts: ImageOptions, console_path: Path
) -> SandboxError:
    """What a boot timeout means for an image: it did not boot, or booted without cloud-init."""
    if console.strip():
        if opts.cloud_init:
            what = "cloud-init in the image did not run the seed"
        else:
            what = "the image booted but nothing in it read the cloud-init seed"
        return SandboxError(
            f"{what} within {timeout:g} s (a cloud image without cloud-init, or its NoCloud "
            "datasource disabled?)",
            "install cloud-init in the image (NoCloud reads the ISO labelled cidata), or boot "
            f"it with an init that runs /{SCRIPT} from that ISO; see {console_path}",
        )
    return SandboxError(
        f"the image did not boot within {timeout:g} s (nothing on its serial console)",
        "check that it boots (a BIOS bootloader, a console on ttyS0), or give --kernel and "
        f"--initrd; see {console_path}",
    )


def exit_status(status: bytes) -> int | None:
    """The command's exit status the guest wrote on ttyS2, if it did."""
    found = EXIT_MARK.findall(status)
    return int(found[-1]) if found else None


def _tail(text: str) -> str:
    return " / ".join(text.strip().splitlines()[-2:])
