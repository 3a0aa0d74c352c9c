"""Bring your own guest (`--vm --image`): a disk image built here from Debian packages (no image
can be downloaded), booted with its own kernel and initrd, told what to run by a NoCloud seed.

The image: an ext4 made by ``mke2fs -d`` from a busybox tree, converted to qcow2; its /sbin/init
finds the seed by its label (cidata) and runs the seed's script, as an image without cloud-init
but with an init that knows the seed would. Two boots (each TCG boot is ~10 s): one that runs a
command, one whose init never reads the seed. Bad input boots nothing.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandgate.errors import SetupError
from sandgate.events.schema import Kind
from sandgate.vm import disk, image, qemu
from sandgate.vm.disk import ImageOptions
from sandgate.vm.launch import VmOptions, preflight
from tests.kernel.conftest import Runner
from tests.kernel.test_vm import assert_nothing_left

pytestmark = pytest.mark.kernel

if not os.path.exists("/usr/bin/" + qemu.QEMU) or shutil.which("qemu-img") is None:
    pytest.skip("QEMU or qemu-img is not installed (./setup.sh test)", allow_module_level=True)

SEED_INIT = """#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev 2>/dev/null
echo "own-init: up" > /dev/ttyS0
mkdir -p /seed
mount -t iso9660 -o ro "$(findfs LABEL=cidata)" /seed || echo "own-init: no seed" > /dev/ttyS0
sh /seed/sandgate.sh
poweroff -f
"""
# An image that boots but has nothing that reads the seed (a cloud image without cloud-init).
NO_SEED_INIT = """#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
echo "own-init: up, and nothing here reads a cloud-init seed" > /dev/ttyS0
sleep 600
"""


def build_disk(folder: Path, init: str, fmt: str = "qcow2") -> Path:
    tree = folder / "tree"
    for d in ("bin", "sbin", "etc", "root", "tmp", "proc", "sys", "dev", "run"):
        (tree / d).mkdir(parents=True, exist_ok=True)
    shutil.copyfile(image.BUSYBOX, tree / "bin" / "busybox")
    os.chmod(tree / "bin" / "busybox", 0o755)
    os.symlink("busybox", tree / "bin" / "sh")
    (tree / "sbin" / "init").write_text(init)
    os.chmod(tree / "sbin" / "init", 0o755)
    raw = folder / "disk.raw"
    subprocess.run(
        ["mke2fs", "-q", "-F", "-t", "ext4", "-d", str(tree), str(raw), "64M"], check=True
    )
    if fmt == "raw":
        return raw
    out = folder / "my.qcow2"
    subprocess.run(["qemu-img", "convert", "-O", "qcow2", str(raw), str(out)], check=True)
    raw.unlink()
    return out


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, Path]]:
    """(disk, kernel, initrd): the user's own guest."""
    boot = image.ensure_disk_boot()
    folder = tmp_path_factory.mktemp("own-guest")
    yield build_disk(folder, SEED_INIT), boot.kernel, boot.initrd


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_own_image_runs_the_command_behind_the_gateway(
    sandbox: Runner, kit: tuple[Path, Path, Path]
) -> None:
    disk_path, kernel, initrd = kit
    before = digest(disk_path)
    result = sandbox.sh(
        'echo hello from $(uname -r); test -s "$SSL_CERT_FILE" && echo ca-ok; '
        'echo "proxy=$HTTPS_PROXY"; cat /etc/resolv.conf; '
        # busybox's own resolver and nc (its static wget crashes in glibc's NSS, no libc here)
        "ip=$(nslookup example.com | sed -n 's/^Address: //p' | tail -n1); "
        # (busybox's small nc ends at its input's end: the sleep holds it open for the answer)
        "(printf 'GET / HTTP/1.1\\r\\nHost: example.com\\r\\nConnection: close\\r\\n\\r\\n'; "
        "sleep 5) | nc -w 20 \"$ip\" 80 | grep -q '^HTTP/1.1 200' && echo reached; "
        "echo written > /root/mark; exit 3",
        mode="open",
        vm=VmOptions(image=ImageOptions(disk_path, kernel, initrd)),
        timeout=240,
    )
    out = Path(result.report.output or "").read_text() if result.report.output else ""
    assert result.exit_code == 3, (result.message, out)
    assert "hello from 6." in out and "ca-ok" in out and "reached" in out, out
    assert "proxy=http://" in out
    assert "nameserver " in out
    # The gateway saw and judged the guest's lookup and request, by name.
    seen = {(e.kind, e.name, e.verdict) for e in sandbox.events(result)}
    assert (Kind.HTTP, "example.com", "allow") in seen, seen
    # Its frames passed the ingress chain as the guest's own (MAC and address from the seed).
    assert not [e for e in sandbox.events(result, Kind.CONN) if e.category == "L2"]
    assert result.report.vm.get("image") == str(disk_path)
    assert digest(disk_path) == before, "the user's disk was written"
    assert not list(Path("/var/lib").glob("sandgate/sessions/*/vm/overlay.qcow2"))
    assert_nothing_left(result.session)


def test_an_image_that_never_reads_the_seed_is_said_and_removed(
    sandbox: Runner, tmp_path: Path, kit: tuple[Path, Path, Path]
) -> None:
    _, kernel, initrd = kit
    silent = build_disk(tmp_path, NO_SEED_INIT, fmt="raw")
    own = ImageOptions(silent, kernel, initrd, cloud_init=True)
    # The kernel's console lines (the image's command line is not quiet) come within seconds:
    # what the wait is for is the seed's mark, which never comes. The message below is the one
    # for an image that printed something; one that printed nothing gets another.
    result = sandbox("true", mode="locked", vm=VmOptions(image=own, boot_timeout=10), timeout=200)
    assert result.exit_code == 125
    assert "cloud-init in the image did not run the seed within 10 s" in (result.message or "")
    assert "install cloud-init" in (result.message or "")
    assert_nothing_left(result.session)


def test_bad_input_names_the_missing_piece(tmp_path: Path, kit: tuple[Path, Path, Path]) -> None:
    disk_path, kernel, initrd = kit

    def refused(own: ImageOptions, **kw: object) -> str:
        with pytest.raises(SetupError) as exc:
            preflight(VmOptions(image=own, **kw))  # type: ignore[arg-type]
        return str(exc.value)

    assert "no such disk image" in refused(ImageOptions(tmp_path / "nope.qcow2"))
    text = tmp_path / "notes.txt"
    text.write_text("not a disk\n" * 200)
    assert "is not a disk image" in refused(ImageOptions(text))
    assert "needs --initrd" in refused(ImageOptions(disk_path, kernel))
    assert "--initrd needs --kernel" in refused(ImageOptions(disk_path, None, initrd))
    assert "no such file" in refused(ImageOptions(disk_path, tmp_path / "vmlinuz", initrd))
    assert "drop --nic none" in refused(ImageOptions(disk_path, kernel, initrd), nic="none")
    assert not list(tmp_path.glob("*.qcow2")), "nothing made for refused input"


def test_the_disk_is_read_as_the_guest_sees_it(kit: tuple[Path, Path, Path]) -> None:
    disk_path = kit[0]  # qcow2 over an ext4 without a partition table: root is the whole disk
    info = disk.check(ImageOptions(disk_path))
    assert (info.format, info.root) == ("qcow2", "/dev/vda")
