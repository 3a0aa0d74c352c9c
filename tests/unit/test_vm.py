"""VM guests without a VM: the accelerator choice, the guest's module order, QEMU's command
line, the job init sources, the VM probe catalogue, and who a spoofed frame is charged to."""

from __future__ import annotations

import gzip
import ipaddress
import lzma
import shlex
import struct
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from sandgate.errors import SetupError
from sandgate.gateway.logs.logreader import gateway_event
from sandgate.net.compile import Site
from sandgate.net.nflog import NflogPacket
from sandgate.policy.decide import Reason, deny
from sandgate.vm import accel, bzimage, image, qemu

# -- the accelerator -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kvm", "modules", "flags", "override", "want", "why"),
    [
        (False, set(), {"vmx"}, None, "tcg", "no /dev/kvm"),
        # This machine (2026-12-01): /dev/kvm, only kvm_pvm, no vmx/svm. A stock kernel hangs.
        (True, {"kvm", "kvm_pvm"}, {"hypervisor"}, None, "tcg", "PVM-only"),
        (True, {"kvm"}, {"vmx"}, None, "tcg", "without kvm_intel"),
        (True, {"kvm", "kvm_intel"}, set(), None, "tcg", "no vmx/svm"),
        (True, {"kvm", "kvm_intel"}, {"vmx"}, None, "kvm", "kvm_intel"),
        (True, {"kvm", "kvm_amd"}, {"svm"}, None, "kvm", "kvm_amd"),
        (True, {"kvm", "kvm_pvm"}, set(), "kvm", "kvm", "SANDGATE_VM_ACCEL"),
        (True, {"kvm", "kvm_intel"}, {"vmx"}, "tcg", "tcg", "SANDGATE_VM_ACCEL"),
    ],
)
def test_accelerator_choice(
    kvm: bool, modules: set[str], flags: set[str], override: str | None, want: str, why: str
) -> None:
    got = accel.choose(kvm, modules, flags, override)
    assert got.name == want
    assert why in got.why
    assert got.qemu_args()[:2] == ["-accel", want]


# -- the guest image -----------------------------------------------------------------------------


def test_depends_read_from_modinfo() -> None:
    # A .modinfo section is NUL-separated key=value strings inside the ELF file.
    ko = b"\x7fELF\x00license=GPL\x00depends=virtio,virtio_ring\x00name=virtio_net\x00"
    assert image.read_depends(ko) == ["virtio", "virtio_ring"]
    assert image.read_depends(b"\x00depends=\x00name=virtio_ring\x00") == []
    assert image.read_depends(b"no modinfo at all") == []


def test_module_order_puts_dependencies_first_once() -> None:
    # Debian 6.1's virtio stack (a wrong order is "Unknown symbol" at insmod).
    deps = {
        "virtio_ring": [],
        "virtio": [],
        "virtio_pci_modern_dev": [],
        "virtio_pci_legacy_dev": [],
        "virtio_pci": ["virtio_pci_modern_dev", "virtio_pci_legacy_dev", "virtio_ring", "virtio"],
        "failover": [],
        "net_failover": ["failover"],
        "virtio_net": ["virtio_ring", "virtio", "net_failover"],
        "virtio_console": ["virtio_ring", "virtio"],
        "netfs": [],
        "fscache": ["netfs"],
        "9pnet": [],
        "9pnet_virtio": ["virtio_ring", "9pnet", "virtio"],
        "9p": ["9pnet", "netfs", "fscache"],
    }
    order = image.module_order(deps)
    assert sorted(order) == sorted(deps)  # each once
    for name, needs in deps.items():
        assert all(order.index(d) < order.index(name) for d in needs), name


def test_module_order_names_what_is_missing_or_loops() -> None:
    with pytest.raises(SetupError, match="no module '9p'"):
        image.module_order({"virtio": []}, ("virtio", "9p"))
    with pytest.raises(SetupError, match="loop"):
        image.module_order({"a": ["b"], "b": ["a"]}, ("a",))


def test_init_script_is_valid_sh_and_mounts_what_it_should() -> None:
    text = image.init_script()
    assert subprocess.run(["sh", "-n"], input=text, text=True, check=False).returncode == 0
    for needle in (
        "host /host",  # the host's system, read-only
        "ro,cache=loose",
        " sg /sg",  # the session's folder
        " work /work",
        "/sg/vm/exit",  # the exit status back to the runner
        "poweroff -f",
        "disable_ipv6",
    ):
        assert needle in text, needle


def test_build_key_follows_the_init_script(monkeypatch: pytest.MonkeyPatch) -> None:
    before = image.build_key()
    monkeypatch.setattr(image, "init_script", lambda: "#!/bin/sh\necho changed\n")
    assert image.build_key() != before


def test_installed_finds_only_this_init(tmp_path: Path) -> None:
    stale = tmp_path / "6.1.0-1-amd64-0000000000"
    stale.mkdir()
    (stale / "vmlinuz").write_bytes(b"k")
    (stale / "initrd.gz").write_bytes(b"i")
    assert image.installed(tmp_path) is None
    fresh = tmp_path / f"6.1.0-1-amd64-{image.build_key()}"
    fresh.mkdir()
    (fresh / "vmlinuz").write_bytes(b"k")
    (fresh / "initrd.gz").write_bytes(b"i")
    got = image.installed(tmp_path)
    assert got is not None and got.release == "6.1.0-1-amd64" and got.present()


def test_build_key_follows_the_recipe(monkeypatch: pytest.MonkeyPatch) -> None:
    # A machine with an older build (no vmlinux beside vmlinuz) must not find it: a new folder.
    before = image.build_key()
    monkeypatch.setattr(image, "BUILD_RECIPE", "1")
    assert image.build_key() != before


def test_installed_offers_the_unpacked_kernel_under_tcg_only(tmp_path: Path) -> None:
    folder = tmp_path / f"6.1.0-1-amd64-{image.build_key()}"
    folder.mkdir()
    for name in ("vmlinuz", "initrd.gz"):
        (folder / name).write_bytes(b"x")
    tcg, kvm = accel.Accel("tcg", "t"), accel.Accel("kvm", "t")
    got = image.installed(tmp_path)
    assert got is not None and got.pvh is None  # a kernel that cannot boot as PVH
    assert got.boot_kernel(tcg) == got.boot_kernel(kvm) == folder / "vmlinuz"
    (folder / "vmlinux").write_bytes(b"x")
    got = image.installed(tmp_path)
    assert got is not None and got.pvh == folder / "vmlinux"
    assert got.boot_kernel(tcg) == folder / "vmlinux"
    assert got.boot_kernel(kvm) == folder / "vmlinuz"  # KVM keeps the stock boot


# -- a bzImage's payload, unpacked for a PVH boot --------------------------------------------------


def _elf(note_type: int = bzimage.XEN_ELFNOTE_PHYS32_ENTRY, name: bytes = b"Xen\x00") -> bytes:
    """An ELF64 header, one PT_NOTE program header, and a note (a GNU one, then the asked one):
    what ``has_pvh_entry`` reads of a vmlinux."""

    def note(n: bytes, kind: int, desc: bytes) -> bytes:
        pad = lambda b: b + b"\x00" * (-len(b) % 4)  # noqa: E731
        return struct.pack("<III", len(n), len(desc), kind) + pad(n) + pad(desc)

    notes = note(b"GNU\x00", 3, b"\x01\x02\x03\x04\x05")
    notes += note(name, note_type, b"\x50\x08\x00\x01")
    header = b"\x7fELF\x02\x01\x01" + b"\x00" * 9
    header += struct.pack("<HHIQQQIHHHHHH", 2, 62, 1, 0x1000000, 64, 0, 0, 64, 56, 1, 64, 0, 0)
    phdr = struct.pack("<IIQQQQQQ", bzimage.PT_NOTE, 4, 120, 0, 0, len(notes), len(notes), 4)
    return header + phdr + notes


def _bzimage(payload: bytes, version: int = 0x20F, setup_sects: int = 3) -> bytes:
    setup = bytearray((setup_sects + 1) * 512)
    setup[0x1F1] = setup_sects
    setup[0x202:0x206] = bzimage.HDRS_MAGIC
    struct.pack_into("<H", setup, 0x206, version)
    struct.pack_into("<II", setup, 0x248, 16, len(payload))
    return bytes(setup) + b"\x00" * 16 + payload + struct.pack("<I", 123456)  # + size_append


@pytest.mark.parametrize(
    "pack",
    [
        lambda b: lzma.compress(b, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC32),  # Debian's
        lambda b: lzma.compress(b, format=lzma.FORMAT_ALONE),
        gzip.compress,
    ],
    ids=["xz", "lzma", "gzip"],
)
def test_a_bzimage_payload_unpacks_to_its_elf(pack: Callable[[bytes], bytes]) -> None:
    elf = _elf()
    assert bzimage.has_pvh_entry(elf)
    assert bzimage.pvh_kernel(_bzimage(pack(elf))) == elf


def test_what_cannot_boot_as_pvh_keeps_the_bzimage() -> None:
    xz = lambda b: lzma.compress(b, format=lzma.FORMAT_XZ)  # noqa: E731
    assert bzimage.pvh_kernel(_bzimage(xz(_elf(note_type=17)))) is None  # no PHYS32_ENTRY
    assert bzimage.pvh_kernel(_bzimage(xz(_elf(name=b"GNU\x00")))) is None  # not Xen's note
    assert bzimage.pvh_kernel(_bzimage(xz(b"not an ELF" * 10))) is None
    assert bzimage.pvh_kernel(_bzimage(b"\x28\xb5\x2f\xfd" + b"zstd" * 10)) is None  # no reader
    assert bzimage.pvh_kernel(_bzimage(b"\xfd7zXZ\x00 truncated")) is None
    assert bzimage.pvh_kernel(_bzimage(xz(_elf()), version=0x207)) is None  # no payload fields
    good = _bzimage(xz(_elf()))
    assert bzimage.pvh_kernel(good[:-200]) is None  # payload runs past the file
    assert bzimage.pvh_kernel(good[:0x202] + b"XXXX" + good[0x206:]) is None  # not a bzImage
    assert not bzimage.has_pvh_entry(_elf()[:100])  # program headers cut off


def test_the_tcg_command_line_is_only_for_tcg() -> None:
    tcg = qemu.kernel_cmdline(None, accel.Accel("tcg", "t")).split()
    kvm = qemu.kernel_cmdline(None, accel.Accel("kvm", "t")).split()
    assert set(qemu.TCG_CMDLINE) <= set(tcg) and not set(qemu.TCG_CMDLINE) & set(kvm)
    assert "acpi=off" not in tcg  # the guest's TSC needs ACPI's HPET to calibrate against
    assert qemu.kernel_cmdline(None).split() == kvm
    nic = qemu.Nic("tap0", "02:53:47:00:00:03", "10.201.0.14/30", "10.201.0.13")
    assert " ".join(qemu.TCG_CMDLINE) in " ".join(qemu.argv(_spec(nic), Path("/log")))


# -- QEMU's command line and the job ---------------------------------------------------------------


def _spec(nic: qemu.Nic | None, runas: int | None = 61000) -> qemu.VmSpec:
    return qemu.VmSpec(
        "S1",
        Path("/k"),
        Path("/i"),
        Path("/var/tmp/sandgate/S1"),
        Path("/var/tmp/sandgate/S1/work"),
        accel.Accel("tcg", "test"),
        nic,
        runas,
    )


def test_qemu_argv_with_a_tap() -> None:
    nic = qemu.Nic("tap0", "02:53:47:00:00:03", "10.201.0.14/30", "10.201.0.13")
    argv = qemu.argv(_spec(nic), Path("/log"))
    joined = " ".join(argv)
    assert argv[0] == qemu.QEMU
    assert f"{qemu.MARKER}-S1" in argv  # `sandgate cleanup` finds it by this
    assert "-nodefaults" in argv and "-no-reboot" in argv
    assert "local,path=/,mount_tag=host,security_model=none,readonly=on" in argv
    assert "tap,id=n0,ifname=tap0,script=no,downscript=no" in argv
    assert "virtio-net-pci,netdev=n0,mac=02:53:47:00:00:03" in argv  # the MAC the gateway pins
    assert "sg.ip=10.201.0.14/30 sg.gw=10.201.0.13" in joined
    assert argv[argv.index("-runas") + 1] == "61000:61000"
    assert "-nic" not in argv


def test_qemu_argv_without_a_nic() -> None:
    argv = qemu.argv(_spec(None, runas=None), Path("/log"))
    assert argv[argv.index("-nic") + 1] == "none"
    assert not any(a.startswith("tap,") for a in argv)
    assert "sg.ip" not in " ".join(argv) and "-runas" not in argv


def test_job_script_quotes_every_word() -> None:
    job = qemu.Job(
        ["sh", "-c", "echo '$HOME'; touch \"/work/a b\""],
        {"HTTPS_PROXY": "http://10.201.0.1:3128", "EVIL": "x'; reboot -f; '"},
        {"/etc/resolv.conf": "/sg/etc/resolv.conf", "/etc/x y": "/sg/files/0-x y"},
        uid=61000,
    )
    text = qemu.job_script(job)
    assert "bind /sg/etc/resolv.conf /etc/resolv.conf" in text
    assert "bind '/sg/files/0-x y' '/etc/x y'" in text
    run_line = next(ln for ln in text.splitlines() if ln.strip().startswith("chroot"))
    words = shlex.split(run_line)
    assert words[:2] == ["chroot", qemu.GUEST_ROOT]
    assert "EVIL=x'; reboot -f; '" in words  # one word, not a command
    assert words[words.index("--reuid=61000") - 1] == "/usr/bin/setpriv"
    assert words[-3:] == ["sh", "-c", "echo '$HOME'; touch \"/work/a b\""]
    root = qemu.job_script(qemu.Job(["id"], {}, {}, uid=None))
    assert "setpriv" not in root


# -- the VM's probes -------------------------------------------------------------------------------


def test_vm_catalogue_swaps_capability_probes_for_wire_attacks(tmp_path: Path) -> None:
    from importlib import resources

    from sandgate.policy.load import load_policy
    from sandgate.policy.model import Mode
    from sandgate.prove.catalogue import Context, catalogue
    from sandgate.prove.vmprobes import in_vm

    world = tmp_path / "testworld.toml"
    world.write_bytes(resources.files("sandgate.world").joinpath("testworld.toml").read_bytes())
    profile = load_policy(str(world)).profile(
        None,
        mode=Mode("allowlist"),
        gateway_address=ipaddress.ip_address("10.201.0.5"),
        guest_pool=ipaddress.ip_network("10.201.0.0/24"),
    )
    proxy = "http://10.201.0.5:3128"
    ctx = Context(profile=profile, gateway="10.201.0.5", proxy=proxy, world=True)
    plain = catalogue(ctx)
    vm = in_vm(plain, ctx)
    dropped = {p.id for p in plain} - {p.id for p in vm}
    assert "raw socket" in dropped and "ip link from inside" in dropped
    assert all(p.why.startswith("sandbox: no") for p in plain if p.id in dropped)
    added = [p for p in vm if p.group == "vm root"]
    reasons = {p.why for p in added}
    for r in (Reason.SPOOF_IP, Reason.SPOOF_MAC, Reason.SPOOF_ARP, Reason.IPV6, Reason.ETHERTYPE):
        assert r.key in reasons, r
    assert all(p.expected == "deny" for p in added)
    assert len(vm) >= 80


# -- a spoofed frame is its sender's attempt ---------------------------------------------------


def test_spoofing_another_guests_address_is_charged_to_the_spoofer() -> None:
    sessions = {"g0": "victim-session", "g1": "spoofer-session"}
    by_address = {"10.201.0.2": ("g0", "victim-session")}
    pkt = NflogPacket(
        group=1, prefix="sg:g1/l2:0", hook=None, family=2, indev=None, outdev=None, uid=None,
        gid=None, seq=None, seq_global=None, timestamp=None, proto=6, src="10.201.0.2",
        dst="10.77.0.10", sport=40000, dport=8000, tcp_flags=2, icmp_type=None, icmp_code=None,
        length=60, mark=None,
    )  # fmt: skip
    site = Site("sg:g1/l2:0", "g1/l2", deny(Reason.SPOOF_IP))
    _, event = gateway_event(pkt, site, by_address.get, sessions.get)
    assert (event.guest, event.session) == ("g1", "spoofer-session")
    # A site that names no guest still goes by the source address (DNS redirect, invalid).
    other = Site("sg:dns:0", None, deny(Reason.SPOOF_IP))
    _, event = gateway_event(pkt, other, by_address.get, sessions.get)
    assert (event.guest, event.session) == ("g0", "victim-session")


# -- bad input -------------------------------------------------------------------------------------


def test_no_qemu_is_a_clear_error_before_anything_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    from sandgate.vm import launch

    monkeypatch.setattr(launch.shutil, "which", lambda name: None)
    built: list[bool] = []
    monkeypatch.setattr(launch.image, "ensure", lambda: built.append(True))
    with pytest.raises(SetupError) as caught:
        launch.preflight(launch.VmOptions())
    assert "qemu-system-x86_64 is not installed" in caught.value.message
    assert caught.value.fix is not None and "apt-get install" in caught.value.fix
    assert built == []  # nothing downloaded or built


def test_no_kernel_package_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        image,
        "_run",
        lambda argv, what, cwd=None: subprocess.CompletedProcess(
            argv, 0, "linux-image-amd64\n", ""
        ),
    )
    with pytest.raises(SetupError, match="no linux-image") as caught:
        image.current_package()
    assert caught.value.fix is not None and "apt-get update" in caught.value.fix
