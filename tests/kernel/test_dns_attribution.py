"""DNS questions are logged with the process that asked them (issue 13: the hold looks a flow
up once, not once per queued packet).

While a flow's first packet is held, every further packet of it is also ``NEW`` to conntrack
and queued behind it; a burst of questions from one socket queued hundreds of packets, each
looked up in /proc. The hold now looks up each flow once. These tests check that this keeps
who asked: two processes asking at once from their own sockets, each flow reported once with
its own process, and the same from inside a real sandbox through the gateway's resolver.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from sandgate.events.schema import FlowKey, Kind
from sandgate.gateway.logs.prochold import ProcessHold
from sandgate.net import ns

from .conftest import Runner

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")

BURST = 150
# Each asker: one socket, a burst of datagrams at once, then it waits (alive, so the hold can
# find it) until stdin closes. Prints its pid and source port.
ASKER = f"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.connect(("192.0.2.77", 53))
for i in range({BURST}):
    s.send(b"q%d" % i)
print(__import__("os").getpid(), s.getsockname()[1], flush=True)
sys.stdin.read()
"""


def _queued(name: str) -> int:
    out = subprocess.run(
        ["ip", "netns", "exec", name, "iptables", "-t", "mangle", "-L", "OUTPUT", "-v", "-x", "-n"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return sum(int(ln.split()[0]) for ln in out.splitlines() if "NFQUEUE" in ln and " 17 " in ln)


def test_a_burst_from_one_socket_is_one_flow_with_its_own_process() -> None:
    name = f"sg-nstest-{os.getpid()}-d"
    reports: list[tuple[FlowKey, int | None, dict[str, object] | None]] = []
    askers: list[subprocess.Popen[str]] = []
    try:
        ns.create(name)
        for cmd in ("link add sg-nstd0 type veth peer name sg-nstd1", "link set sg-nstd0 up",
                    "link set sg-nstd1 up", "addr add 192.0.2.9/24 dev sg-nstd0"):  # fmt: skip
            subprocess.run(["ip", "-n", name, *cmd.split()], check=True)
        hold = ProcessHold("g9", name, lambda key, uid, p: reports.append((key, uid, p)))
        hold.start()
        try:
            argv = ["ip", "netns", "exec", name, sys.executable, "-c", ASKER]
            for _ in range(2):
                askers.append(
                    subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                )
            ports = {}
            for p in askers:
                assert p.stdout is not None
                pid, port = p.stdout.readline().split()
                ports[int(port)] = int(pid)
            deadline = time.monotonic() + 10
            while len({k for k, _, _ in reports}) < 2 and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(0.2)  # what is still queued goes on
            queued = _queued(name)
        finally:
            hold.stop()
        # The premise: packets behind each flow's first were queued too.
        assert queued > len(ports), f"only {queued} packets were held: no burst to test"
        keys = [k for k, _, _ in reports]
        assert sorted(keys) == sorted(("g9", "udp", port, "192.0.2.77", 53) for port in ports)
        for key, uid, process in reports:
            assert uid == 0
            assert process is not None and process["pid"] == ports.get(key[2] or 0), (key, process)
            assert process["exe"] == os.path.realpath(sys.executable)
        assert hold.skipped == queued - len(ports)
    finally:
        for p in askers:
            p.kill()
            p.wait()
        ns.remove(name)


SANDBOX_ASKER = r"""
import socket, struct, sys
def question(name, qid):
    wire = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    return struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0) + wire + struct.pack("!HH", 1, 1)
server = next(l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver"))
tag = sys.argv[1]
burst = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
burst.connect((server, 53))
burst.settimeout(5)
for i in range(40):  # at once, from one socket, as a load generator does
    burst.send(question(f"b{i}.{tag}.example.com", i))
for _ in range(40):
    burst.recv(4096)
for i in range(5):  # one socket a question, as a stub resolver does
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(5)
        s.sendto(question(f"s{i}.{tag}.example.com", i), (server, 53))
        s.recv(4096)
"""


def test_dns_from_a_sandbox_is_logged_with_the_process_that_asked(sandbox: Runner) -> None:
    tag = f"t{os.getpid()}"
    r = sandbox("python3", "-c", SANDBOX_ASKER, tag, mode="open")
    assert r.exit_code == 0, r.message
    events = [e for e in sandbox.events(r, Kind.DNS) if e.name and f".{tag}." in e.name]
    names = {e.name for e in events}
    assert names == {f"b{i}.{tag}.example.com" for i in range(40)} | {
        f"s{i}.{tag}.example.com" for i in range(5)
    }
    pids = set()
    for e in events:
        process = e.details.get("process")
        assert isinstance(process, dict), (e.name, e.details)
        assert re.fullmatch(r".*/python3(\.\d+)?", str(process["exe"])), process
        assert e.uid is not None and e.pid == process["pid"]
        pids.add(process["pid"])
    assert len(pids) == 1, pids
