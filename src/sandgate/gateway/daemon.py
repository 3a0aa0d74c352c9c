"""The gateway daemon: one process that *is* the gateway.

It creates its own network namespace (``unshare``) as the very first thing it does, before any
thread exists, so every thread it ever has lives there; nothing it opens can land on the host's
network. That namespace has no name and no bind mount: it exists exactly as long as this
process. If the daemon dies, the kernel tears the namespace down with every link in it, and the
guests' only links vanish with it: a dead gateway is a closed gateway (fail closed), with no
window in which the rules are gone but forwarding goes on.

Inside: the nftables ruleset (applied before forwarding is switched on), the resolver, the
NFLOG readers, the attribution of flows to uids, the event writer and a root-only control
socket, all on one asyncio loop.

Run as ``python -m sandgate.gateway.daemon CONFIG.json``; it prints ``READY {json}`` on stdout
once it serves.
"""

from __future__ import annotations

import ctypes
import os
import sys


def _unshare_net() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x40000000) != 0:  # CLONE_NEWNET
        err = ctypes.get_errno()
        sys.stderr.write(f"sandgate gateway: cannot create its namespace: {os.strerror(err)}\n")
        raise SystemExit(3)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: python -m sandgate.gateway.daemon CONFIG.json\n")
        return 2
    # First: our own namespace, while this is the only thread.
    _unshare_net()
    from sandgate.gateway.server import run

    return run(args[0])


if __name__ == "__main__":
    raise SystemExit(main())
