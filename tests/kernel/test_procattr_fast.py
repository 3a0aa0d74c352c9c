"""The process hold's fast lookup against its slow one, with real processes in a namespace.

One ``ProcessFinder`` lives across every flow (its caches warm: the last holders tried first,
their descriptors read in the order the last look left them, the socket -> holder map); for
each flow a new finder (nothing cached: the namespace's pid list built, every pid scanned,
the chain read) looks the same socket up. Both must say the same: pid, exe, cmdline, uid,
chain, parents, role. The flows cover a stub resolver's socket per question, a thread's
socket, a child's, a process that execs another binary after an earlier flow, a process whose
parent died (re-parented), and a sender gone before the lookup.

Namespace ``sg-tpf<pid>`` with only loopback (connected UDP sockets to 127.0.0.1:53 send
nothing); deleted at the end, even on failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest

from sandgate.gateway.logs.procattr import ProcessFinder, ProcInfo

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create namespaces"),
    pytest.mark.skipif(not shutil.which("ip"), reason="needs ip"),
]

BASH = shutil.which("bash") or "/bin/bash"

# Commands on stdin, one a line; each answers "PORT PID" (PORT 0: nothing to look up).
DRIVER = r"""
import ctypes, os, signal, socket, sys, threading
ctypes.CDLL(None).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: orphans below come back to us
BASH = sys.argv[1]
mine = None
kept = []  # sockets of threads, children's pipes
kids = {}  # name -> pid
execs = {}  # name -> (go, done, stdin, port) of a child that will exec

def udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect(("127.0.0.1", 53))
    return s

def spawn(name, body):
    # body runs in the child, returns the port it holds; the child then waits for SIGTERM
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.write(w, b"%d\n" % body())
        signal.pause()
        os._exit(0)
    os.close(w)
    port = int(os.read(r, 64))
    os.close(r)
    kids[name] = pid
    return port, pid

def answer(port, pid):
    print(port, pid, flush=True)

for line in sys.stdin:
    cmd, *args = line.split()
    if cmd == "sock":  # a stub resolver: the last socket closed, a new one opened
        if mine is not None:
            mine.close()
        mine = udp()
        answer(mine.getsockname()[1], os.getpid())
    elif cmd == "thread":
        got = []
        t = threading.Thread(target=lambda: got.append(udp()))
        t.start(); t.join()
        kept.append(got[0])
        answer(got[0].getsockname()[1], os.getpid())
    elif cmd == "child":
        def body():
            global held
            held = udp()
            return held.getsockname()[1]
        answer(*spawn(args[0], body))
    elif cmd == "execprep":  # a child with a socket, which will exec another binary
        s = udp()
        s.set_inheritable(True)
        go_r, go_w = os.pipe()
        done_r, done_w = os.pipe()  # close-on-exec: EOF once the exec is done
        in_r, in_w = os.pipe()  # bash's stdin, held open here
        pid = os.fork()
        if pid == 0:
            os.read(go_r, 1)
            os.dup2(in_r, 0)
            os.execv(BASH, [BASH, "-c", "read -r line"])
        port = s.getsockname()[1]
        s.close()
        kids[args[0]] = pid
        execs[args[0]] = (go_w, done_r, in_w, port)
        for fd in (go_r, done_w, in_r):
            os.close(fd)
        answer(port, pid)
    elif cmd == "exec":
        go_w, done_r, _in_w, port = execs[args[0]]
        os.write(go_w, b"x")
        while os.read(done_r, 64):
            pass
        answer(port, kids[args[0]])
    elif cmd == "nested":  # a middle process with a child holding a socket
        r, w = os.pipe()
        mid = os.fork()
        if mid == 0:
            os.close(r)
            inner = os.fork()
            if inner == 0:
                s = udp()
                os.write(w, b"%d %d\n" % (s.getsockname()[1], os.getpid()))
                signal.pause()
                os._exit(0)
            signal.pause()
            os._exit(0)
        os.close(w)
        port, inner = map(int, os.read(r, 64).split())
        os.close(r)
        kids[args[0]] = mid
        kids[args[0] + "-inner"] = inner
        answer(port, inner)
    elif cmd == "kill":
        pid = kids.pop(args[0])
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        answer(0, pid)
    elif cmd == "short":  # a sender gone before anyone looks
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            s = udp()
            os.write(w, b"%d\n" % s.getsockname()[1])
            os._exit(0)
        os.close(w)
        port = int(os.read(r, 64))
        os.close(r)
        os.waitpid(pid, 0)
        answer(port, pid)
    elif cmd == "rename":  # the comm of the driver changes (the chain's names are read anew)
        ctypes.CDLL(None).prctl(15, args[0].encode())  # PR_SET_NAME
        answer(0, os.getpid())
"""


class Driver:
    def __init__(self, ns: str) -> None:
        self.ns = ns
        self.path = f"/run/netns/{ns}"
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-I", "-c", DRIVER, BASH],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def do(self, *cmd: str) -> tuple[int, int]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(" ".join(cmd) + "\n")
        self.proc.stdin.flush()
        port, pid = self.proc.stdout.readline().split()
        return int(port), int(pid)


@pytest.fixture
def driver() -> Iterator[Driver]:
    ns = f"sg-tpf{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    d: Driver | None = None
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        d = Driver(ns)
        yield d
    finally:
        if d is not None:
            d.proc.kill()
            d.proc.wait()
        # the driver's children are killed with the namespace's processes
        pids = subprocess.run(
            ["ip", "netns", "pids", ns], check=False, capture_output=True, text=True
        )
        for pid in pids.stdout.split():
            subprocess.run(["kill", "-9", pid], check=False)
        subprocess.run(["ip", "netns", "del", ns], check=False)


def _both(warm: ProcessFinder, d: Driver, port: int) -> tuple[ProcInfo | None, ProcInfo | None]:
    fast = warm.find("udp", port, "127.0.0.1", 53, "127.0.0.1")
    inode = os.stat(d.path).st_ino
    with ProcessFinder(inode, d.proc.pid, netns_path=d.path) as cold:
        slow = cold.find("udp", port, "127.0.0.1", 53, "127.0.0.1")
    return fast, slow


def test_the_warm_lookup_says_what_the_cold_one_says(driver: Driver) -> None:
    d = driver
    inode = os.stat(d.path).st_ino
    with ProcessFinder(inode, d.proc.pid, netns_path=d.path) as warm:
        warm.prime()
        checked = 0

        def same(port: int, pid: int | None) -> ProcInfo | None:
            nonlocal checked
            fast, slow = _both(warm, d, port)
            assert fast == slow, (fast, slow)
            if pid is not None:
                assert fast is not None and fast.pid == pid
            checked += 1
            return fast

        # a stub resolver: a new socket a question, the same process (the recent holder)
        for _ in range(20):
            same(*d.do("sock"))
        assert warm.stats.recent_hits >= 15
        # a thread's socket: the process is named
        port, pid = d.do("thread")
        assert same(port, pid) is not None
        # children, each a new process (the pid list brought up to date)
        for i in range(5):
            same(*d.do("child", f"c{i}"))
            same(*d.do("sock"))  # and back to the stub: its socket found again
        # (a) a process that execs another binary after an earlier flow
        port, pid = d.do("execprep", "x")
        before = same(port, pid)
        assert before is not None and before.exe is not None and "python" in before.exe
        assert d.do("exec", "x") == (port, pid)
        info = same(port, pid)
        assert info is not None and info.exe == os.path.realpath(BASH)
        assert info.cmdline[:2] == [BASH, "-c"] and info.chain[0] == (pid, "bash")
        port, pid = d.do("child", "after-exec")  # a new process beside it
        same(port, pid)
        # (c) a parent that died: the child is re-parented to the driver (a subreaper)
        port, inner = d.do("nested", "n")
        first = same(port, inner)
        assert first is not None and len(first.chain) == 3
        d.do("kill", "n")
        again = same(port, inner)
        assert again is not None and [p for p, _ in again.chain] == [inner, d.proc.pid]
        # an ancestor renamed: the chain carries its name now
        port, pid = d.do("child", "r1")
        d.do("rename", "renamed")
        info = same(port, pid)
        assert info is not None and info.chain[-1][1] == "renamed"
        # (e) a sender gone before the lookup: neither finds it
        for _ in range(3):
            port, _pid = d.do("short")
            fast, slow = _both(warm, d, port)
            assert fast is None and slow is None
        # the stub again, after all that
        for _ in range(5):
            same(*d.do("sock"))
        assert checked >= 40
