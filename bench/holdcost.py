"""What the process hold's lookup costs a flow: ``ProcessFinder.find`` CPU per new flow.

    PYTHONPATH=src:. python -m bench.holdcost [FLOWS] [--json] [--against PROCATTR_PY]   (root)

Makes a namespace (sg-holdcost-PID, removed after) with loopback up, 20 idle processes (a
sandbox's shells and helpers) and one client three parents below the sandbox's root. Per flow
the client opens a fresh UDP socket connected to 127.0.0.1:53 (no packet is sent), as glibc's
stub resolver does per lookup, and the finder looks it up by its 5-tuple, as the hold does
with a flow's first packet:

- ``stub``: the same process, a new socket each flow (``pip install`` resolving names);
- ``fork``: a new child process each flow (``curl`` per request, a shell loop).

Prints CPU µs per flow (the calling thread's, ``time.thread_time``), p50 of five rounds, the
finder's counters, and its /proc calls a flow (one more round, counted: a figure the machine's
load does not move). ``--against`` loads another copy of gateway/logs/procattr.py and
alternates its rounds with this one's (11 each), for a paired before/after on a busy machine.
A lookup that finds no process is a failure (exit 1).
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from sandgate.gateway.logs.procattr import ProcessFinder

CLIENT = r"""
import os, socket, sys
if int(sys.argv[1]) > 0:  # a chain of parents above the client, as a shell and an agent make
    pid = os.fork()
    if pid == 0:
        os.execv(sys.executable, [sys.executable, "-I", "-c", sys.argv[2],
                                  str(int(sys.argv[1]) - 1), sys.argv[2]])
    os.waitpid(pid, 0)
    sys.exit(0)
held = None
for line in sys.stdin:
    if held is not None:
        held.close()
    if line.startswith("fork"):
        up_r, up_w = os.pipe()
        down_r, down_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.connect(("127.0.0.1", 53))
            os.write(up_w, b"%d\n" % s.getsockname()[1])
            os.read(down_r, 1)  # hold the socket until the parent is told to go on
            os._exit(0)
        port = os.read(up_r, 64)
        held = None
        print(port.decode().strip(), flush=True)
        sys.stdin.readline()
        os.write(down_w, b"x")
        os.waitpid(pid, 0)
        for fd in (up_r, up_w, down_r, down_w):
            os.close(fd)
        continue
    held = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    held.connect(("127.0.0.1", 53))
    print(held.getsockname()[1], flush=True)
"""


DEPTH = 3  # parents between the sandbox's root and the client


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


_COUNTED = ("open", "read", "close", "readlink", "stat", "listdir", "scandir")


def _proc_calls(
    client: subprocess.Popen[str], mode: str, flows: int, path: str, kind: type[ProcessFinder]
) -> dict[str, float]:
    """One more round, counting the finder's file-system calls a flow (os.open, read, stat...;
    the diag socket's send and recv, two a flow, are not counted). Unlike CPU time, the
    count does not move with the machine's load."""
    assert client.stdin is not None and client.stdout is not None
    counts: dict[str, int] = dict.fromkeys(_COUNTED, 0)
    counting = [False]
    originals = {name: getattr(os, name) for name in _COUNTED}

    def counted(name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            if counting[0]:
                counts[name] += 1
            return originals[name](*args, **kwargs)

        return call

    with kind(os.stat(path).st_ino, client.pid, netns_path=path) as finder:
        finder.prime()
        try:
            for name in _COUNTED:
                setattr(os, name, counted(name))
            for _ in range(flows):
                client.stdin.write(mode + "\n")
                client.stdin.flush()
                port = int(client.stdout.readline())
                counting[0] = True
                finder.find("udp", port, "127.0.0.1", 53, "127.0.0.1")
                counting[0] = False
                if mode == "fork":
                    client.stdin.write("go\n")
                    client.stdin.flush()
        finally:
            for name, original in originals.items():
                setattr(os, name, original)
    per = {name: round(n / flows, 2) for name, n in counts.items() if n}
    per["total"] = round(sum(counts.values()) / flows, 1)
    return per


def _older(path: str) -> type[ProcessFinder]:
    """``ProcessFinder`` from another copy of gateway/logs/procattr.py (e.g. main's, saved with
    ``git show main:src/sandgate/gateway/logs/procattr.py``), for paired runs."""
    spec = importlib.util.spec_from_file_location("_procattr_against", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    kind: type[ProcessFinder] = module.ProcessFinder
    return kind


def _round(
    kind: type[ProcessFinder], client: subprocess.Popen[str], mode: str, flows: int, path: str
) -> tuple[float, int, dict[str, Any]]:
    """CPU µs a flow of one round with a new finder, the flows it missed, its counters."""
    assert client.stdin is not None and client.stdout is not None
    missed = 0
    with kind(os.stat(path).st_ino, client.pid, netns_path=path) as finder:
        finder.prime()
        spent = 0.0
        for _ in range(flows):
            client.stdin.write(mode + "\n")
            client.stdin.flush()
            port = int(client.stdout.readline())
            began = time.thread_time()
            info = finder.find("udp", port, "127.0.0.1", 53, "127.0.0.1")
            spent += time.thread_time() - began
            missed += info is None
            if mode == "fork":
                client.stdin.write("go\n")
                client.stdin.flush()
        return spent / flows * 1e6, missed, dict(vars(finder.stats))


def measure(
    flows: int = 300,
    rounds: int = 5,
    modes: tuple[str, ...] = ("stub", "fork"),
    against: str | None = None,
) -> dict[str, Any]:
    """``against``: another procattr.py, whose rounds alternate with this one's."""
    kinds: dict[str, type[ProcessFinder]] = {"this": ProcessFinder}
    if against is not None:
        kinds["against"] = _older(against)
    ns = f"sg-holdcost-{os.getpid()}"
    path = f"/run/netns/{ns}"
    _run("ip", "netns", "add", ns)
    procs: list[subprocess.Popen[Any]] = []
    try:
        _run("ip", "-n", ns, "link", "set", "lo", "up")
        enter = ["ip", "netns", "exec", ns]
        procs += [subprocess.Popen([*enter, "sleep", "600"]) for _ in range(20)]
        client = subprocess.Popen(
            [*enter, sys.executable, "-I", "-c", CLIENT, str(DEPTH), CLIENT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(client)
        assert client.stdin is not None and client.stdout is not None
        out: dict[str, Any] = {"flows": flows, "rounds": rounds, "modes": {}}
        for mode in modes:
            per_round: dict[str, list[float]] = {label: [] for label in kinds}
            missed = 0
            stats: dict[str, Any] = {}
            for i in range(rounds):
                order = list(kinds.items())
                for label, kind in order if i % 2 == 0 else order[::-1]:
                    cpu, lost, counters = _round(kind, client, mode, flows, path)
                    per_round[label].append(cpu)
                    missed += lost
                    if label == "this":
                        stats = counters
            result: dict[str, Any] = {}
            for label, kind in kinds.items():
                result[label] = {
                    "proc_calls_per_flow": _proc_calls(client, mode, flows, path, kind),
                    "cpu_us_per_flow": round(statistics.median(per_round[label]), 1),
                    "cpu_us_per_flow_rounds": [round(x, 1) for x in per_round[label]],
                }
            out["modes"][mode] = {
                **result["this"],
                "missed": missed,
                "last_round": {
                    k: (round(v, 4) if isinstance(v, float) else v) for k, v in stats.items()
                },
            }
            if "against" in result:
                out["modes"][mode]["against"] = result["against"]
        out["load_average"] = [round(x, 2) for x in os.getloadavg()]
        return out
    finally:
        for p in procs:
            p.kill()
            p.wait()
        subprocess.run(["ip", "netns", "del", ns], check=False)


def main(argv: list[str]) -> int:
    flows = int(next((a for a in argv if a.isdigit()), "300"))
    against = argv[argv.index("--against") + 1] if "--against" in argv else None
    result = measure(flows, 11 if against else 5, against=against)
    if "--json" in argv:
        print(json.dumps(result))
    else:
        print(f"load average {result['load_average']}")
        for mode, r in result["modes"].items():
            print(
                f"{mode:5} {r['cpu_us_per_flow']:7.1f} µs CPU a flow  rounds "
                f"{r['cpu_us_per_flow_rounds']}  missed {r['missed']}  /proc calls a flow "
                f"{r['proc_calls_per_flow']}"
            )
            if "against" in r:
                a = r["against"]
                print(
                    f"  against {a['cpu_us_per_flow']:7.1f} µs CPU a flow  rounds "
                    f"{a['cpu_us_per_flow_rounds']}  /proc calls a flow {a['proc_calls_per_flow']}"
                )
    return 1 if any(r["missed"] for r in result["modes"].values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
