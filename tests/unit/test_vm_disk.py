"""`--vm --image` without a VM: what a disk starts with, the NoCloud seed, QEMU's drives."""

from __future__ import annotations

import base64
import json
import shlex
import subprocess
from pathlib import Path

import pytest

from sandgate.vm import disk, qemu
from sandgate.vm.accel import Accel

EXT = bytes(1080) + b"\x53\xef" + bytes(966)  # a whole-disk ext4: superblock magic at 1080
MBR = bytes(510) + b"\x55\xaa" + bytes(1536)


@pytest.mark.parametrize(
    ("head", "want"),
    [
        (EXT, "filesystem"),
        (b"XFSB" + bytes(2044), "filesystem"),
        (MBR, "partitioned"),
        (b"not a disk\n" * 200, None),
        (bytes(2048), None),  # all zeroes: an empty file, not a disk
        (MBR[:511], None),  # cut off before the signature
    ],
)
def test_what_a_disk_starts_with(head: bytes, want: str | None) -> None:
    assert disk.classify_head(head) == want


SEED = disk.Seed(
    "02:53:00:00:00:07",
    "10.201.0.6/30",
    "10.201.0.5",
    "10.201.0.5",
    ("sh", "-c", "echo 'it''s'; exit 3"),
    {"HTTPS_PROXY": "http://10.201.0.5:3128", "OPENAI_API_KEY": "sg-openai-x"},
    b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
)


def test_the_seed_tells_cloud_init_and_a_plain_init_the_same() -> None:
    files = disk.seed_files(SEED, "sess-1")
    assert set(files) == {"meta-data", "network-config", "user-data", disk.SCRIPT}
    assert files["user-data"].startswith(b"#cloud-config\n")
    user = json.loads(files["user-data"].split(b"\n", 1)[1])  # JSON is YAML
    written = base64.b64decode(user["write_files"][0]["content"])
    assert written == files[disk.SCRIPT]
    assert user["runcmd"] == [["/bin/sh", "/run/" + disk.SCRIPT]]
    net = json.loads(files["network-config"])["ethernets"]["sg0"]
    assert net["match"] == {"macaddress": "02:53:00:00:00:07"}
    assert net["addresses"] == ["10.201.0.6/30"]
    assert json.loads(files["meta-data"])["instance-id"] == "sess-1"


def test_the_seed_script_is_valid_sh_and_quotes_the_command() -> None:
    script = disk.guest_script(SEED)
    assert subprocess.run(["sh", "-n"], input=script, text=True, check=False).returncode == 0
    assert "HTTPS_PROXY=http://10.201.0.5:3128" in script
    assert "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt" in script
    assert shlex.quote(SEED.command[2]) in script
    assert script.index("sandgate-seed: read") < script.index("ip addr add")


def test_the_exit_status_is_the_last_mark() -> None:
    assert disk.exit_status(b"sandgate-seed: read\nsandgate-exit: 3\n") == 3
    assert disk.exit_status(b"sandgate-seed: read\n") is None


def test_qemu_boots_the_overlay_and_the_seed_not_the_host(tmp_path: Path) -> None:
    drives = qemu.Drives(tmp_path / "o.qcow2", tmp_path / "seed.iso", tmp_path / "st", "/dev/vda1")
    nic = qemu.Nic("tap0", "02:53:00:00:00:07", "10.201.0.6/30", "10.201.0.5")
    spec = qemu.VmSpec("s", None, None, tmp_path, tmp_path, Accel("tcg", "test"), nic,
                       drives=drives)  # fmt: skip
    argv = qemu.argv(spec, tmp_path / "con")
    assert "-kernel" not in argv  # no --kernel: the disk's own bootloader
    assert "-virtfs" not in argv  # nothing of the host is shared with a user's image
    assert f"file={tmp_path / 'o.qcow2'},format=qcow2,if=virtio,cache=unsafe" in argv
    assert f"file={tmp_path / 'seed.iso'},format=raw,if=virtio,readonly=on" in argv
    own = qemu.VmSpec("s", tmp_path / "k", tmp_path / "i", tmp_path, tmp_path,
                      Accel("tcg", "test"), nic, drives=drives)  # fmt: skip
    argv = qemu.argv(own, tmp_path / "con")
    assert argv[argv.index("-append") + 1].startswith("root=/dev/vda1 console=ttyS0")


def test_no_seed_says_which_piece_is_missing(tmp_path: Path) -> None:
    opts = disk.ImageOptions(tmp_path / "d")
    booted = str(disk.no_seed_error(b"Linux version 6.1", 60, opts, tmp_path / "c"))
    assert "nothing in it read the cloud-init seed" in booted and "install cloud-init" in booted
    silent = str(disk.no_seed_error(b"", 60, opts, tmp_path / "c"))
    assert "did not boot within 60 s" in silent and "--kernel" in silent
