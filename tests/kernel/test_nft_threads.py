"""libnftables keeps one interface cache for the whole process, released by every run and every
free: contexts on different threads must never be inside the library at once (net/nft.py).
Before the lock, the gateway died of "double free or corruption" in CI, and three threads
doing what the script below does aborted 5 runs of 6."""

from __future__ import annotations

import subprocess
import sys

# Each thread its own context, as the gateway has (its own, a guest's uid log, the watchdog's
# canary): `meta iif "lo"` fills the shared cache, a listing prints it, every close frees it.
_RACE = """
import sys, threading
from sandgate.net.nft import Nft

failures = []

def work(soon):
    try:
        for _ in range(150):
            n = Nft()
            n.run({"nftables": [{"add": {"table": {"family": "inet", "name": "sg_race"}}}]})
            n.run("add chain inet sg_race c { type filter hook input priority 0; }")
            n.run('add rule inet sg_race c meta iif "lo" accept')
            n.run({"nftables": [{"list": {"table": {"family": "inet", "name": "sg_race"}}}]})
            n.close_soon() if soon else n.close()
    except Exception as exc:
        failures.append(repr(exc))

threads = [threading.Thread(target=work, args=(i % 2 == 0,)) for i in range(3)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("failures:", failures)
sys.exit(1 if failures else 0)
"""


def test_contexts_on_three_threads_neither_corrupt_nor_refuse() -> None:
    """In a namespace of its own (unshare -n): it commits rules, so not in ours."""
    r = subprocess.run(
        ["unshare", "-n", sys.executable, "-c", _RACE],
        check=False, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert "failures: []" in r.stdout
