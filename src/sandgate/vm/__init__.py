"""VM guests: the built-in guest image, the accelerator, QEMU's command line and its process."""

__all__ = ["accel", "image", "launch", "qemu"]
