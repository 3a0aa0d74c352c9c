"""VM guests: the built-in guest image, a user's own disk, the accelerator, QEMU's command line
and its process."""

__all__ = ["accel", "disk", "image", "launch", "qemu"]
