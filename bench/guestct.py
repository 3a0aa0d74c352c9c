"""The guest table's conntrack cost: CPU per GB with TCP tracked (as before) and untracked (now).

``PYTHONPATH=src:. python -m bench.guestct [ROUNDS]`` as root. Two namespaces of our own,
``sg-gct<pid>-c`` (the guest: ``guest_uid_log``'s table, one variant at a time) and
``sg-gct<pid>-s`` (a sink and a source), joined by a veth; nothing else. Each round moves 1 GiB
each way (guest uploads, guest downloads) under both variants, interleaved, and reads the CPU of
the two processes (user + system, which on a veth includes the receiving side's softirq work run
in the sender's context). The variants differ only in the guest table:

    tracked    the table as it is: every TCP segment looked up in the guest's conntrack
    untracked  the experiment of issue 13: TCP marked ``notrack`` at raw priority (before
               conntrack's hook), a TCP flow logged by its SYN instead of by ``ct state new``

On a shared 2-core machine the rates move with the neighbours; CPU per GB is what travels.
Measured 2026-12-01 (6 rounds, load average ~8 on 2 cores): upload 0.596 vs 0.601 s/GB,
download 0.671 vs 0.652 s/GB: no difference beyond the noise (veth moves 64 KiB GSO segments,
so conntrack sees ~16k packets per GB), so the guest table keeps tracking TCP.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

from sandgate import cleanup
from sandgate.net import conntrack
from sandgate.net.compile import GROUP_GUEST, TABLE, guest_uid_log
from sandgate.net.netlink import run_in_netns
from sandgate.net.nft import Nft, batch

SIZE = 1 << 30
SERVER, CLIENT = "10.79.9.1", "10.79.9.2"
PY = sys.executable

SINK = """
import socket, sys
l = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
while True:
    c, _ = l.accept()
    mode = c.recv(1)
    if mode == b"u":  # the guest uploads: read to EOF
        buf = bytearray(1 << 20)
        while c.recv_into(buf):
            pass
    else:  # the guest downloads
        data = bytes(1 << 20)
        for _ in range(int(sys.argv[3]) >> 20):
            c.sendall(data)
    c.close()
"""
CLIENT_CODE = """
import socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])))
c.sendall(sys.argv[3].encode())
n, t = int(sys.argv[4]), time.perf_counter()
if sys.argv[3] == "u":
    data = bytes(1 << 20)
    for _ in range(n >> 20):
        c.sendall(data)
    c.shutdown(socket.SHUT_WR)
    c.recv(1)
else:
    buf, got = bytearray(1 << 20), 0
    while k := c.recv_into(buf):
        got += k
    assert got == n, got
print(time.perf_counter() - t)
"""


def variant(name: str) -> list[dict[str, Any]]:
    """The guest table as it is (tracked), or with TCP untracked and logged by its SYN."""
    cmds = guest_uid_log()
    if name == "tracked":
        return cmds
    t = {"family": "inet", "table": TABLE}
    extra: list[dict[str, Any]] = []
    for hook in ("prerouting", "output"):
        chain = {**t, "name": f"raw_{hook}", "type": "filter", "hook": hook, "prio": -300}
        tcp = {"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": "tcp"}}
        extra.append({"add": {"chain": {**chain, "policy": "accept"}}})
        extra.append(
            {"add": {"rule": {**t, "chain": f"raw_{hook}", "expr": [tcp, {"notrack": None}]}}}
        )
    flags = {"&": [{"payload": {"protocol": "tcp", "field": "flags"}}, ["syn", "ack"]]}
    syn = {"match": {"op": "==", "left": flags, "right": "syn"}}
    log = {"log": {"prefix": "sg:uid", "group": GROUP_GUEST, "queue-threshold": 1}}
    extra.append({"add": {"rule": {**t, "chain": "output", "expr": [syn, log]}}})
    # After the table and its output chain exist (the first four commands), before its rules.
    return [*cmds[:4], *extra[:4], *cmds[4:5], extra[4], *cmds[5:]]


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


@contextlib.contextmanager
def world() -> Iterator[tuple[str, str]]:
    tag = f"sg-gct{os.getpid()}"
    c, s = f"{tag}-c", f"{tag}-s"
    made: list[str] = []
    try:
        for n in (s, c):
            cleanup.own(n)
            sh("ip", "netns", "add", n)
            made.append(n)
            sh("ip", "-n", n, "link", "set", "lo", "up")
        sh("ip", "-n", s, "link", "add", "sgv-s", "type", "veth", "peer", "sgv-c", "netns", c)
        sh("ip", "-n", s, "addr", "add", f"{SERVER}/24", "dev", "sgv-s")
        sh("ip", "-n", c, "addr", "add", f"{CLIENT}/24", "dev", "sgv-c")
        sh("ip", "-n", s, "link", "set", "sgv-s", "up")
        sh("ip", "-n", c, "link", "set", "sgv-c", "up")
        yield c, s
    finally:
        for n in made:
            subprocess.run(["ip", "netns", "del", n], check=False)
        for n in (c, s):
            cleanup.disown(n)


def apply(netns: str, cmds: list[dict[str, Any]]) -> None:
    def go() -> None:
        nft = Nft()
        try:
            nft.run(batch(*cmds))
        finally:
            nft.close()

    run_in_netns(f"/run/netns/{netns}", go)


def transfer(c: str, port: int, mode: str) -> tuple[float, float]:
    """(MB/s, CPU seconds per GB of both processes) for one 1 GiB transfer."""
    before = os.times()
    done = subprocess.run(
        ["ip", "netns", "exec", c, PY, "-c", CLIENT_CODE, SERVER, str(port), mode, str(SIZE)],
        check=True,
        capture_output=True,
        text=True,
    )
    after = os.times()
    seconds = float(done.stdout.strip())
    client_cpu = (after.children_user - before.children_user) + (
        after.children_system - before.children_system
    )
    return SIZE / seconds / 1e6, client_cpu


def tcp_ports(netns: str) -> set[int]:
    """Source ports of the TCP flows the guest's conntrack holds."""
    flows = run_in_netns(f"/run/netns/{netns}", lambda: conntrack.flows(CLIENT))
    return {f.sport for f in flows if f.proto == "tcp"}


def proc_cpu(pid: int) -> float:
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()  # noqa: SIM115
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def main(rounds: int) -> dict[str, Any]:
    out: dict[str, dict[str, list[tuple[float, float]]]] = {
        v: {"upload": [], "download": []} for v in ("tracked", "untracked")
    }
    entries: dict[str, int] = {}
    with world() as (c, s):
        port = 9100
        sink = subprocess.Popen(
            ["ip", "netns", "exec", s, PY, "-c", SINK, SERVER, str(port), str(SIZE)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert sink.stdout is not None and sink.stdout.readline() == "ready\n"
            for _ in range(rounds):
                for v in ("tracked", "untracked"):
                    apply(c, variant(v))
                    before = tcp_ports(c)
                    for mode, key in (("u", "upload"), ("d", "download")):
                        s0 = proc_cpu(sink.pid)
                        rate, ccpu = transfer(c, port, mode)
                        cpu = ccpu + proc_cpu(sink.pid) - s0
                        out[v][key].append((rate, cpu / (SIZE / 1e9)))
                    # The variant is what it says: its transfers left entries in the guest's
                    # conntrack (tracked) or none (untracked).
                    entries[v] = entries.get(v, 0) + len(tcp_ports(c) - before)
        finally:
            sink.kill()  # ours, by its pid
            sink.wait()
    result: dict[str, Any] = {"rounds": rounds, "loadavg": os.getloadavg(), "tcp_entries": entries}
    for v, ways in out.items():
        result[v] = {
            k: {
                "median_MB_s": statistics.median(r for r, _ in runs),
                "cpu_s_per_GB": statistics.median(x for _, x in runs),
                "runs": runs,
            }
            for k, runs in ways.items()
        }
    return result


if __name__ == "__main__":
    res = main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
    print(json.dumps(res, indent=1))
    for k in ("upload", "download"):
        t, u = res["tracked"][k], res["untracked"][k]
        print(
            f"{k:9} tracked {t['median_MB_s']:6.0f} MB/s {t['cpu_s_per_GB']:.3f} s/GB | "
            f"untracked {u['median_MB_s']:6.0f} MB/s {u['cpu_s_per_GB']:.3f} s/GB",
            file=sys.stderr,
        )
