"""TLS for inspection: the gateway's own CA, leaf certificates per name, and the two contexts.

The CA is created on first use under ``$SANDGATE_HOME/ca`` (key 0600, root only) and is never
inside a sandbox; sandboxes get its certificate in their trust bundle. Leaves are issued per name
and cached in memory. Towards the client we offer only HTTP/1.1 by ALPN (HTTP/2 is not inspected:
clients fall back to 1.1); towards the server we verify its certificate against the system's
trust store plus any extra CA the gateway was given (the test world's, in tests).
"""

from __future__ import annotations

import ssl
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path

from sandgate.events.store import default_home
from sandgate.gateway.proxy.ca import CA, make_ca

LEAF_CACHE = 512
ALPN = ["http/1.1"]


def ca_dir() -> Path:
    return default_home() / "ca"


def load_or_create_ca(directory: Path | None = None) -> CA:
    folder = directory or ca_dir()
    if (folder / "ca.pem").exists() and (folder / "ca.key").exists():
        return CA.load(folder)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    ca = make_ca("sandgate inspection CA", days=3650)
    ca.save(folder)
    return ca


class Leaves:
    """Server-side contexts, one per name, made on demand and cached (LRU)."""

    def __init__(self, ca: CA) -> None:
        self.ca = ca
        self._cache: OrderedDict[str, ssl.SSLContext] = OrderedDict()
        self._lock = threading.Lock()
        self._scratch = tempfile.TemporaryDirectory(prefix="sandgate-leaves-")

    def context(self, name: str) -> ssl.SSLContext:
        with self._lock:
            ctx = self._cache.get(name)
            if ctx is not None:
                self._cache.move_to_end(name)
                return ctx
        ctx = self._make(name)
        with self._lock:
            self._cache[name] = ctx
            while len(self._cache) > LEAF_CACHE:
                self._cache.popitem(last=False)
        return ctx

    def _make(self, name: str) -> ssl.SSLContext:
        cert_pem, key_pem = self.ca.issue([name], days=7)
        # ssl wants files; write them where only root can read, load, and forget them.
        folder = Path(self._scratch.name)
        cert, key = folder / f"{name}.pem", folder / f"{name}.key"
        key.touch(mode=0o600)
        key.write_bytes(key_pem)
        cert.write_bytes(cert_pem + self.ca.cert_pem)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(cert, key)
        ctx.set_alpn_protocols(ALPN)
        key.unlink()
        cert.unlink()
        return ctx

    def close(self) -> None:
        self._scratch.cleanup()


def upstream_context(extra_ca: list[Path] | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    for path in extra_ca or []:
        ctx.load_verify_locations(cafile=str(path))
    ctx.set_alpn_protocols(ALPN)
    return ctx
