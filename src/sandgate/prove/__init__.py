"""The probe catalogue, the never-rules, and the driver that runs inside a guest."""

__all__ = [
    "catalogue",
    "driver",
    "homelab",
    "invariants",
    "runner",
    "vmprobes",
]
