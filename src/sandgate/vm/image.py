"""The built-in VM guest: a Debian kernel and a busybox initramfs, built from Debian packages.

    /opt/sandgate/vm/<kernel release>/vmlinuz      from ``apt-get download linux-image-…`` +
                                                   ``dpkg -x`` (no install, no boot hooks)
    /opt/sandgate/vm/<kernel release>/vmlinux      the same kernel unpacked, booted as PVH
                                                   under TCG (bzimage.py says why)
    /opt/sandgate/vm/<kernel release>/initrd.gz    busybox-static, the kernel's virtio and 9p
                                                   modules, and init.sh as /init

The guest needs no disk: init mounts the host's ``/`` read-only over virtio-9p (tag ``host``)
and the session's folder read-write (tag ``sg``), builds the root the command sees from them
(the same system a namespace sandbox sees, with the session's /work, home, scratch and /etc
files bound over it), configures its NIC from the kernel command line, runs the job the runner
wrote, writes the exit status into the session folder and powers off.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from sandgate.errors import SetupError
from sandgate.vm import bzimage
from sandgate.vm.accel import Accel

VM_ROOT = Path(os.environ.get("SANDGATE_VM_DIR", "/opt/sandgate/vm"))
BUSYBOX = Path("/bin/busybox")
KERNEL_META = "linux-image-amd64"  # Debian's metapackage: it names the current kernel package
# Loaded in this order (modules.dep decides what each needs first: a wrong order is "Unknown
# symbol"). virtio is modular in Debian's kernel; the 9p stack mounts the host's system.
MODULES = (
    "virtio_pci",
    "virtio_net",
    "virtio_console",
    "9pnet_virtio",
    "9p",
)
INIT_RESOURCE = "init.sh"
# How the folder is made, beyond init and modules: a change here rebuilds every machine's guest.
BUILD_RECIPE = "2: vmlinux (PVH) beside vmlinuz"


@dataclass(frozen=True)
class GuestImage:
    kernel: Path
    initrd: Path
    release: str
    pvh: Path | None = None  # the unpacked kernel, if it can boot as PVH

    def present(self) -> bool:
        return self.kernel.is_file() and self.initrd.is_file()

    def boot_kernel(self, a: Accel) -> Path:
        """The file QEMU's -kernel gets: the unpacked one under TCG (its emulated decompressor
        was half of a boot there), the bzImage under KVM (the decompressor runs at native speed,
        and this host cannot try a PVH boot under KVM)."""
        if a.name == "tcg" and self.pvh is not None and self.pvh.is_file():
            return self.pvh
        return self.kernel


def read_depends(ko: bytes) -> list[str]:
    """The ``depends=`` field of a module's .modinfo section (no kmod needed: the package ships
    no modules.dep, depmod makes it at install time, and we install nothing)."""
    match = re.search(rb"(?:^|\x00)depends=([^\x00]*)\x00", ko)
    if not match:
        return []
    return [d.decode() for d in match.group(1).split(b",") if d]


def module_order(deps: dict[str, list[str]], wanted: tuple[str, ...] = MODULES) -> list[str]:
    """Module names to insmod, dependencies first, each once; ``deps`` maps a module's name
    (underscores) to the names it depends on."""
    order: list[str] = []

    def visit(name: str, trail: tuple[str, ...]) -> None:
        if name in order:
            return
        if name in trail:
            raise SetupError(f"module dependencies loop through {name}")
        if name not in deps:
            raise SetupError(
                f"the guest kernel has no module {name!r} (built in, or not Debian's kernel?)",
                "rebuild the guest with `sandgate vm build --force`",
            )
        for dep in deps[name]:
            visit(dep.replace("-", "_"), (*trail, name))
        order.append(name)

    for name in wanted:
        visit(name.replace("-", "_"), ())
    return order


def _module_name(path: str) -> str:
    base = path.rsplit("/", 1)[-1]
    return re.sub(r"\.ko(\.(xz|zst|gz))?$", "", base).replace("-", "_")


def _scan_modules(
    mods: Path, wanted: tuple[str, ...] = MODULES
) -> tuple[dict[str, Path], dict[str, list[str]]]:
    paths = {_module_name(p.name): p for p in mods.rglob("*.ko*")}
    deps: dict[str, list[str]] = {}
    for name in _needed(paths, wanted):
        deps[name] = read_depends(paths[name].read_bytes())
    return paths, deps


def _needed(paths: dict[str, Path], wanted: tuple[str, ...]) -> set[str]:
    """Names reachable from ``wanted`` (reading only those modules, not all 4,000)."""
    seen: set[str] = set()
    todo = [w.replace("-", "_") for w in wanted]
    while todo:
        name = todo.pop()
        if name in seen or name not in paths:
            continue
        seen.add(name)
        todo += [d.replace("-", "_") for d in read_depends(paths[name].read_bytes())]
    return seen


def init_script() -> str:
    """The guest's /init (a busybox sh script, kept as a file beside this module)."""
    return resources.files("sandgate.vm").joinpath(INIT_RESOURCE).read_text()


def build_key() -> str:
    """What the guest is made of besides the kernel: a new init, module list or recipe rebuilds
    it (the folder's name ends with this key, so an old machine's folder is not found)."""
    text = init_script() + "\n".join(MODULES) + BUILD_RECIPE
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def installed(root: Path = VM_ROOT) -> GuestImage | None:
    """The newest built guest under ``root`` with this version's init, if any."""
    found = sorted(
        p for p in root.glob(f"*-{build_key()}/initrd.gz") if (p.parent / "vmlinuz").is_file()
    )
    if not found:
        return None
    folder = found[-1].parent
    pvh = folder / "vmlinux"
    return GuestImage(
        folder / "vmlinuz",
        folder / "initrd.gz",
        folder.name.rsplit("-", 1)[0],
        pvh if pvh.is_file() else None,
    )


def current_package() -> str:
    """The kernel package apt offers now (what ``linux-image-amd64`` depends on)."""
    out = _run(["apt-cache", "depends", KERNEL_META], "apt-cache").stdout
    match = re.search(r"Depends:\s*(linux-image-[0-9][^\s]*-amd64)", out)
    if not match:
        raise SetupError(
            "apt offers no linux-image-…-amd64 kernel package",
            "run `apt-get update` (the guest kernel comes from Debian's archive)",
        )
    return match.group(1)


def ensure(root: Path = VM_ROOT, force: bool = False, say: bool = True) -> GuestImage:
    """The built-in guest, built on first use (a progress line on stderr while it is)."""
    have = installed(root)
    if have is not None and not force:
        return have
    for tool, pkg in (("cpio", "cpio"), ("dpkg", "dpkg"), ("apt-get", "apt")):
        if shutil.which(tool) is None:
            raise SetupError(f"building the VM guest needs {tool}", f"apt-get install {pkg}")
    if not BUSYBOX.is_file():
        raise SetupError(
            "building the VM guest needs a static busybox",
            "apt-get install --no-install-recommends busybox-static (or ./setup.sh test)",
        )
    package = current_package()
    release = package.removeprefix("linux-image-")
    if say:
        sys.stderr.write(f"sandgate: building the VM guest (kernel {release}, once)...\n")
        sys.stderr.flush()
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sandgate-vm-") as tmp:
        work = Path(tmp)
        out = root / f"{release}-{build_key()}"
        _build(work, package, out, MODULES, init_script(), pvh=True)
    if say:
        sys.stderr.write(f"sandgate: VM guest ready in {out}\n")
    pvh = out / "vmlinux"
    return GuestImage(out / "vmlinuz", out / "initrd.gz", release, pvh if pvh.is_file() else None)


# A kernel + initrd that boots a root disk (``root=/dev/vda``): the "user's own" kernel and
# initrd of ``--vm --image`` tests, from the same Debian package (none can be downloaded here).
DISK_MODULES = ("virtio_pci", "virtio_blk", "virtio_net", "crc32c_generic", "ext4", "isofs")
DISK_INIT = """#!/bin/sh
# Loads the disk's modules, mounts root= and hands over to its /sbin/init.
export PATH=/bin
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t devtmpfs dev /dev
for m in $(cat /lib/modules/order); do insmod "/lib/modules/$m"; done
root=/dev/vda
for w in $(cat /proc/cmdline); do case "$w" in root=*) root="${w#root=}";; esac; done
i=0; while [ ! -b "$root" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
mount -o rw "$root" /newroot || { echo "initrd: cannot mount $root"; poweroff -f; }
umount /proc
exec switch_root /newroot /sbin/init
"""


def disk_boot_key() -> str:
    return hashlib.sha256((DISK_INIT + "\n".join(DISK_MODULES)).encode()).hexdigest()[:10]


def ensure_disk_boot(root: Path = VM_ROOT) -> GuestImage:
    """A Debian kernel and a busybox initrd that mounts ``root=`` and runs its /sbin/init."""
    found = sorted(root.glob(f"disk-*-{disk_boot_key()}/initrd.gz"))
    if found:
        folder = found[-1].parent
        return GuestImage(folder / "vmlinuz", folder / "initrd.gz", folder.name.split("-", 1)[1])
    package = current_package()
    release = package.removeprefix("linux-image-")
    root.mkdir(parents=True, exist_ok=True)
    out = root / f"disk-{release}-{disk_boot_key()}"
    with tempfile.TemporaryDirectory(prefix="sandgate-vm-") as tmp:
        _build(Path(tmp), package, out, DISK_MODULES, DISK_INIT)
    return GuestImage(out / "vmlinuz", out / "initrd.gz", release)


def _build(
    work: Path, package: str, out: Path, wanted: tuple[str, ...], init: str, pvh: bool = False
) -> None:
    """Download the kernel package, unpack it, and write ``out``/{vmlinuz,initrd.gz} (and, with
    ``pvh``, vmlinux where the kernel can boot that way)."""
    _run(["apt-get", "download", "-q", package], "apt-get download", cwd=work)
    debs = list(work.glob("linux-image-*.deb"))
    if not debs:
        raise SetupError(f"apt-get download {package} gave no .deb", "check apt's sources")
    tree = work / "kernel"
    _run(["dpkg", "-x", str(debs[0]), str(tree)], "dpkg -x")
    kernels = sorted((tree / "boot").glob("vmlinuz-*"))
    if not kernels:
        raise SetupError(f"{package} holds no /boot/vmlinuz-*", "check the package name")
    kver = kernels[-1].name.removeprefix("vmlinuz-")
    mods = tree / "lib" / "modules" / kver
    paths, deps = _scan_modules(mods, wanted)
    # A module the kernel has built in is not there to load (crc32c, say): only the rest.
    order = [paths[name] for name in module_order(deps, tuple(w for w in wanted if w in paths))]
    initrd = work / "initrd"
    _initramfs_tree(initrd, order, kver, init)
    staging = out.parent / f".{out.name}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    shutil.copyfile(kernels[-1], staging / "vmlinuz")
    elf = bzimage.pvh_kernel(kernels[-1].read_bytes()) if pvh else None
    if elf is not None:
        (staging / "vmlinux").write_bytes(elf)
    _cpio(initrd, staging / "initrd.gz")
    for f in staging.iterdir():
        os.chmod(f, 0o644)
    os.chmod(staging, 0o755)
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)


def _initramfs_tree(dest: Path, order: list[Path], kver: str, init: str) -> None:
    for d in ("bin", "dev", "proc", "sys", "host", "sg", "newroot", "lib/modules"):
        (dest / d).mkdir(parents=True, exist_ok=True)
    shutil.copyfile(BUSYBOX, dest / "bin" / "busybox")
    os.chmod(dest / "bin" / "busybox", 0o755)
    os.symlink("busybox", dest / "bin" / "sh")
    names = []
    for src in order:
        name = src.name
        if not name.endswith(".ko"):
            raise SetupError(f"module {name} is compressed; busybox insmod cannot load it")
        shutil.copyfile(src, dest / "lib" / "modules" / name)
        names.append(name)
    (dest / "lib" / "modules" / "order").write_text("\n".join(names) + "\n")
    (dest / "lib" / "modules" / "release").write_text(kver + "\n")
    (dest / "init").write_text(init)
    os.chmod(dest / "init", 0o755)


def _cpio(tree: Path, out: Path) -> None:
    names = sorted(str(p.relative_to(tree)) for p in tree.rglob("*"))
    proc = subprocess.run(
        ["cpio", "-o", "-H", "newc", "--quiet"],
        input=("\n".join(names) + "\n").encode(),
        cwd=tree,
        capture_output=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SetupError(f"cpio failed: {proc.stderr.decode(errors='replace').strip()}")
    with gzip.open(out, "wb", compresslevel=6) as f:
        f.write(proc.stdout)


def _run(argv: list[str], what: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    except FileNotFoundError as exc:
        raise SetupError(f"{what}: {argv[0]} is not installed", "apt-get install apt") from exc
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise SetupError(f"{what} failed: {' / '.join(tail)}", "check apt's sources and network")
    return proc


if __name__ == "__main__":  # ./setup.sh test: build the guest once (a no-op when it is there)
    ensure()
    ensure_disk_boot()  # the --vm --image tests' "user's" kernel and initrd
