"""Which accelerator a VM guest gets: KVM where a real KVM works, TCG otherwise.

``/dev/kvm`` alone proves nothing: on a PVM-only host (module ``kvm_pvm``, no ``kvm_intel`` or
``kvm_amd``, no vmx/svm CPU flags) it exists, yet a stock Debian kernel hangs under
``-enable-kvm`` right after "Probing EDD" (measured 2026-12-01 on this machine). PVM runs only
PVM-aware guest kernels, so such a host gets TCG.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

KVM_VENDOR_MODULES = ("kvm_intel", "kvm_amd")
ENV_OVERRIDE = "SANDGATE_VM_ACCEL"  # "kvm" or "tcg": the user knows better than our guess


@dataclass(frozen=True)
class Accel:
    name: str  # "kvm" or "tcg"
    why: str  # said in the run's log and the session's details

    def qemu_args(self) -> list[str]:
        if self.name == "kvm":
            return ["-accel", "kvm", "-cpu", "host"]
        # TCG: a host thread per vCPU (multi-threaded TCG, the default for x86 on x86); "max"
        # gives the guest every feature TCG emulates.
        return ["-accel", "tcg", "-cpu", "max"]


def choose(
    kvm_device: bool, modules: set[str], cpu_flags: set[str], override: str | None = None
) -> Accel:
    """The accelerator for what this host has (pure: the facts are passed in)."""
    if override in ("kvm", "tcg"):
        return Accel(override, f"{ENV_OVERRIDE}={override}")
    if not kvm_device:
        return Accel("tcg", "no /dev/kvm")
    vendor = [m for m in KVM_VENDOR_MODULES if m in modules]
    if not vendor:
        if "kvm_pvm" in modules:
            return Accel("tcg", "/dev/kvm is PVM-only (kvm_pvm runs only PVM-aware kernels)")
        return Accel("tcg", "/dev/kvm without kvm_intel or kvm_amd")
    if not cpu_flags & {"vmx", "svm"}:
        return Accel("tcg", f"{vendor[0]} loaded but the CPU shows no vmx/svm")
    return Accel("kvm", f"{vendor[0]} with hardware virtualisation")


def detect() -> Accel:
    """``choose`` with this host's facts."""
    modules = {p.name for p in Path("/sys/module").glob("kvm*")}
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    kvm = os.path.exists("/dev/kvm") and os.access("/dev/kvm", os.R_OK | os.W_OK)
    return choose(kvm, modules, flags, os.environ.get(ENV_OVERRIDE))
