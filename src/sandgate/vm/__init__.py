"""VM guests: the built-in guest image (its kernel also unpacked for a PVH boot), a user's own
disk, the accelerator, QEMU's command line and its process."""

__all__ = ["accel", "bzimage", "disk", "image", "launch", "qemu"]
