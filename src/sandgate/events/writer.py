"""The store's writer process: the gateway's batches are chained and stored here, not in its own.

Why a process: the chain's hashing and SQLite's inserts are Python work, and on a writer thread
they take the GIL from the event loop. Under the resolver's load every wake of the loop (a
question, an answer) then waits for the writer to let go and the writer for the loop: ~1.5
futex calls an event, and a batch cost ~35-40 µs an event in the gateway against ~12 alone
(issue 13, uncached DNS, measured with ``bench.resolverloop``). In a process of its own the
same work costs what it costs alone, and the loop is never held.

The protocol, on the child's stdin and stdout (both ours, so no framing against a foe):

- a batch: 4 bytes of length (network order), then ``marshal`` of a list of rows, each row the
  tuple ``Event.raw_row()`` gives (str, int, float, None, and the details as plain data: what
  marshal carries exactly). The child encodes the details as the store's JSON (``encode_row``),
  which was ~2-4 µs an event of the daemon's GIL; a row with a detail marshal cannot carry
  (an enum, an object) is encoded by the daemon and sent as ``Event.row()`` gives it;
- its answer: one line, ``ok`` or ``error <text>``, once the batch is committed or refused.

``python -m sandgate.events.writer STORE`` runs the child; ``Child`` starts and feeds it. A
child that dies is not restarted: the batch it had and every later one is stored in the
daemon's own process, as before (events are never dropped for a writer's sake).
"""

from __future__ import annotations

import marshal
import os
import struct
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from sandgate.events.schema import encode_row

if TYPE_CHECKING:
    from sandgate.events.schema import Event

_LENGTH = struct.Struct("!I")
NICE = 10
Row = tuple[Any, ...]


def frame(rows: Sequence[Row]) -> bytes:
    body = marshal.dumps(list(rows))
    return _LENGTH.pack(len(body)) + body


def _marshals(row: Row) -> bool:
    try:
        marshal.dumps(row)
    except ValueError:
        return False
    return True


def read_frame(f: IO[bytes]) -> list[Row] | None:
    """The next batch, or None at the end of the stream (a cut batch is the end too)."""
    head = f.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        return None
    (size,) = _LENGTH.unpack(head)
    body = f.read(size)
    if len(body) < size:
        return None
    rows = marshal.loads(body)
    if not isinstance(rows, list):
        raise ValueError("a batch is a list of rows")
    return [tuple(r) for r in rows]


def serve(store_path: Path, inp: IO[bytes], out: IO[bytes]) -> None:
    """The child's loop: store each batch, answer each."""
    from sandgate.events.store import Store

    store = Store(store_path)
    try:
        while (rows := read_frame(inp)) is not None:
            try:
                store.add_rows([encode_row(r) for r in rows])
                out.write(b"ok\n")
            except Exception as exc:  # the daemon prints it; the writer goes on
                text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
                out.write(f"error {text}\n".encode())
            out.flush()
    finally:
        store.close()


class Child:
    """The daemon's side: one child, fed one batch at a time from the sink's writer thread."""

    def __init__(self, store_path: Path, fallback: Callable[[list[Row]], object]) -> None:
        self._fallback = fallback
        self._proc: subprocess.Popen[bytes] | None = None
        package_root = str(Path(__file__).resolve().parents[2])  # this checkout's code
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        try:
            self._proc = subprocess.Popen(  # started now; it imports while the daemon goes on
                [sys.executable, "-m", "sandgate.events.writer", str(store_path)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
                close_fds=True,
            )
        except OSError as exc:
            print(f"sandgate: the store's writer process did not start: {exc}", file=sys.stderr)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @staticmethod
    def pack(events: Sequence[Event]) -> tuple[bytes, list[Row]]:
        """A batch's frame and rows, their details left for the child to encode where marshal
        carries them. The sink makes it on the event loop's thread (gateway/sink.py: why)."""
        rows = [e.raw_row() for e in events]
        try:
            return frame(rows), rows
        except ValueError:  # a detail marshal cannot carry: that row is encoded here
            rows = [r if _marshals(r) else encode_row(r) for r in rows]
            return frame(rows), rows

    def add(self, rows: list[Row]) -> None:
        """Store ``rows``; returns once they are committed (or refused, which is printed)."""
        self.send(frame(rows), rows)

    def send(self, body: bytes, rows: list[Row]) -> None:
        """Store a packed batch (``pack``): ``rows`` are what the fallback stores."""
        proc = self._proc
        if proc is not None:
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.write(body)
                proc.stdin.flush()
                answer = proc.stdout.readline()
            except (OSError, ValueError):
                answer = b""
            if answer == b"ok\n":
                return
            if answer.startswith(b"error "):
                print(f"sandgate: the store refused a batch: {answer[6:].decode().strip()}",
                      file=sys.stderr)  # fmt: skip
                return
            # The child is gone. Had it committed this batch before dying, the fallback stores
            # it twice (a chain that verifies, one batch repeated): never none.
            print("sandgate: the store's writer process ended; storing in the daemon",
                  file=sys.stderr)  # fmt: skip
            self._reap()
        self._fallback([encode_row(r) for r in rows])

    def close(self, timeout: float = 10.0) -> None:
        """End of input: the child stores what it has and exits; killed past ``timeout``."""
        proc = self._proc
        if proc is None:
            return
        try:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(timeout=timeout)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self._reap()

    def _reap(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for f in (proc.stdin, proc.stdout):
            if f is not None:
                f.close()


def main() -> None:
    import signal

    # Only the end of its input ends the child: a Ctrl-C to the daemon's terminal reaches its
    # whole group, and the daemon still hands over its last batch as it stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Storing can wait; the loop's answers cannot: on a full machine a woken event loop takes
    # the core from this process, not the other way round (its batches still get ~10 % of a
    # core against one busy task, and all of an idle one).
    os.nice(NICE)
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # nothing printed by accident can garble an answer
    serve(Path(sys.argv[1]), sys.stdin.buffer, answers)


if __name__ == "__main__":
    main()
