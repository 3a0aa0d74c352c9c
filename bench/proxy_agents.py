"""Clients that stay put for ``bench/run proxy``: one per side, told one step at a time.

The bench interleaves its paths (round 1: every path once, round 2: again, ...) so that a
neighbour's load on the shared cores falls on all of them alike, not on whichever ran last. So a
client must not be a session per measurement: each side (the peer guest, the server's own
namespace, a sandbox with the ``pass`` profile, one with ``inspect``) runs one ``agent.sh``
for the whole bench, which reads a line of bash from ``cmd.fifo``, runs it and answers on
``done.fifo``. A sandbox's agent is an ordinary ``run_in`` session (on a thread); the others
run in their namespace with ``ip netns exec``.

Every measurement is a ``step`` (``SCRIPT_LIB``): the command runs with bash's ``time``, its
output and errors go to files, and one ``STEP`` line records when it ran, so the CPU sampled
meanwhile can be attributed to it (``read_steps``).
"""

from __future__ import annotations

import os
import select
import shlex
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import BenchNet, stop
from sandgate.session.runner import RunOptions, run_in
from sandgate.session.stack import Stack

SCRIPT_LIB = r"""
TIMEFORMAT='%R %U %S'
i=0
step() {  # kind tag command...: run it, timed, its output in files, one STEP line
  kind=$1; tag=$2; shift 2
  i=$((i+1))
  f="$W/$i-$kind-$tag"
  s=$(date +%s.%N)
  { time "$@" > "$f.out" 2> "$f.err" ; } 2> "$f.time"
  echo "STEP $i $kind $tag $s $(date +%s.%N) $(tr '\n' ' ' < "$f.time")" >> "$W/steps.txt"
}
cfg() {  # count url: a curl config fetching url count times, bodies discarded
  awk -v n="$1" -v u="$2" \
    'BEGIN { for (k = 0; k < n; k++) printf "url = \"%s\"\noutput = \"/dev/null\"\n", u }'
}
rtt() {  # tag max budget_s url curl...: 20 probes, then as many as fit the budget (max, >= 50)
  tag=$1; max=$2; budget=$3; url=$4; shift 4
  cfg 21 "$url" > "$W/probe-$tag.cfg"
  "$@" -K "$W/probe-$tag.cfg" > "$W/probe-$tag.txt" 2>&1
  med=$(tail -n +2 "$W/probe-$tag.txt" | awk '{ print $3 }' | sort -g | sed -n 10p)
  n=$(awk -v m="${med:-0}" -v max="$max" -v b="$budget" \
    'BEGIN { n = max; if (m > 0 && b / m < n) n = int(b / m); if (n < 50) n = 50; print n }')
  cfg $((n + 1)) "$url" > "$W/rt-$tag.cfg"
  step rtt "$tag" "$@" -K "$W/rt-$tag.cfg"
}
"""
AGENT = (
    "W=$1\n"
    + SCRIPT_LIB
    + r"""
exec 3<> "$W/cmd.fifo"
echo ready > "$W/done.fifo"
while IFS= read -r line <&3; do
  [ "$line" = quit ] && break
  eval "$line"
  echo done > "$W/done.fifo"
done
"""
)


def words(args: Iterable[str]) -> str:
    """Quote for bash, except ``$W/…`` (the work directory, known only where the agent runs)."""
    return " ".join(f'"{a}"' if a.startswith("$W/") else shlex.quote(a) for a in args)


@dataclass
class Agent:
    """One side's client: ``do(line)`` runs a line of bash there and waits for it to finish."""

    side: str
    work: Path
    alive: Callable[[], bool] = field(default=lambda: False)
    pid: int = 0  # the process started in a namespace (0: a sandbox session)
    finish: Callable[[], None] = field(default=lambda: None)
    _cmd: int = -1
    _done: int = -1

    @classmethod
    def prepare(cls, side: str, work: Path, uid: int) -> Agent:
        work.mkdir(mode=0o755)
        (work / "agent.sh").write_text(AGENT)
        for fifo in ("cmd.fifo", "done.fifo"):
            os.mkfifo(work / fifo, 0o600)
            os.chown(work / fifo, uid, uid)
        os.chown(work, uid, uid)
        agent = cls(side, work)
        # Both ends read-write here: opening never blocks, and the agent's exit is no EOF.
        agent._cmd = os.open(work / "cmd.fifo", os.O_RDWR)
        agent._done = os.open(work / "done.fifo", os.O_RDWR | os.O_NONBLOCK)
        return agent

    def start_in_netns(self, net: BenchNet, netns: str, wrap: list[str] | None = None) -> None:
        """``wrap``: the agent runs inside this command (srt), which starts it itself."""
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        argv = wrap or ["bash", str(self.work / "agent.sh"), str(self.work)]
        with open(self.work / "agent.log", "wb") as log:
            proc = net.spawn_in(
                netns,
                argv,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.alive = lambda: proc.poll() is None
        self.pid = proc.pid

        def finish() -> None:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                stop(proc)

        self.finish = finish
        self._wait("ready", 30)

    def start_on_thread(self, target: Callable[[], None], cancel: Callable[[], None]) -> None:
        """``target`` runs the agent (a sandbox session) until it quits; ``cancel`` ends it."""
        thread = threading.Thread(target=target, name=f"agent-{self.side}", daemon=True)
        thread.start()
        self.alive = thread.is_alive

        def finish() -> None:
            thread.join(10)
            if thread.is_alive():  # still busy with a step: end the session
                cancel()
                thread.join(30)

        self.finish = finish
        self._wait("ready", 60)

    def start_session(self, stack: Stack, opts: RunOptions, failures: list[str]) -> None:
        """The agent as one sandbox session on ``stack``, on a thread; a session that fails or
        ends badly is reported in ``failures`` (with the figures), its absence noticed here."""
        assert opts.stop is not None

        def session() -> None:
            try:
                result = run_in(stack, opts)
            except Exception as exc:
                failures.append(f"{self.side} session: {exc!r}")
                return
            if result.exit_code != 0:
                failures.append(
                    f"{self.side} session ended with {result.exit_code}: {result.message}"
                )

        self.start_on_thread(session, opts.stop.set)

    def do(self, line: str, timeout: float = 300) -> None:
        os.write(self._cmd, (line + "\n").encode())
        self._wait("done", timeout)

    def _wait(self, word: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        buf = b""
        while not buf.endswith(b"\n"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the {self.side} client did not answer in {timeout:g} s")
            ready, _, _ = select.select([self._done], [], [], 0.2)
            if ready:
                buf += os.read(self._done, 64)
            elif not self.alive():
                raise RuntimeError(f"the {self.side} client ended (see {self.work})")
        if buf.strip() != word.encode():
            raise RuntimeError(f"the {self.side} client said {buf!r}, not {word}")

    def close(self) -> None:
        if self._cmd >= 0:
            if self.alive():
                os.write(self._cmd, b"quit\n")
                self.finish()
            os.close(self._cmd)
            os.close(self._done)
            self._cmd = self._done = -1


@dataclass
class Step:
    n: int
    kind: str
    key: str
    start: float
    end: float
    real: float
    cpu: float  # the client's user + system seconds
    out: str
    err: str


def read_steps(work: Path) -> list[Step]:
    steps: list[Step] = []
    path = work / "steps.txt"
    if not path.exists():
        return steps
    for line in path.read_text().splitlines():
        f = line.split()
        if f[:1] != ["STEP"] or len(f) < 9:
            continue
        out = work / f"{f[1]}-{f[2]}-{f[3]}.out"
        err = work / f"{f[1]}-{f[2]}-{f[3]}.err"
        steps.append(
            Step(
                n=int(f[1]),
                kind=f[2],
                key=f[3],
                start=float(f[4]),
                end=float(f[5]),
                real=float(f[6]),
                cpu=float(f[7]) + float(f[8]),
                out=out.read_text() if out.exists() else "",
                err=err.read_text(errors="replace") if err.exists() else "",
            )
        )
    return steps
