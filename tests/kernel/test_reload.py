"""Hot reload (`sandgate reload`): a session holding two long-lived TCP connections keeps the
one the new policy still allows and loses the one it refuses (a reset, and an event); a broken
file changes nothing and the CLI names its line; the watchdog's digest follows the reload."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandgate.events.schema import Kind
from sandgate.gateway import manage
from sandgate.net import ns
from sandgate.session.runner import RunOptions, RunResult, run_in
from sandgate.session.stack import Stack
from tests.kernel.conftest import Runner

pytestmark = pytest.mark.kernel

PORT = 7311
KEPT, CUT = "203.0.113.10", "203.0.113.30"  # two "public" hosts of the test world
CLIENT = f"""
import socket, time
socks = {{}}
for name, host in (("kept", "{KEPT}"), ("cut", "{CUT}")):
    socks[name] = socket.create_connection((host, {PORT}), timeout=3)
log = open("/work/log", "a", buffering=1)
while socks:
    for name, s in list(socks.items()):
        try:
            s.sendall(b"x")
            if s.recv(1) != b"x":
                raise OSError("no echo")
            log.write(name + " ok\\n")
        except OSError as exc:
            log.write(f"{{name}} error {{type(exc).__name__}}\\n")
            socks.pop(name).close()
    time.sleep(0.1)
"""


class Echo:
    """A TCP echo server on the test world's public hosts, in its wan namespace: the listening
    sockets are made there, served from here."""

    def __init__(self, netns: str, addresses: tuple[str, ...] = (KEPT, CUT), port: int = PORT):
        self.listeners = [ns.run_in(netns, lambda a=a: self._listen(a, port)) for a in addresses]
        self.conns: list[socket.socket] = []
        for sock in self.listeners:
            threading.Thread(target=self._accept, args=(sock,), daemon=True).start()

    @staticmethod
    def _listen(address: str, port: int) -> socket.socket:
        sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        sock.listen()
        return sock

    def _accept(self, sock: socket.socket) -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        with conn:
            while True:
                try:
                    data = conn.recv(4096)
                except OSError:
                    return
                if not data:
                    return
                conn.sendall(data)

    def close(self) -> None:
        for sock in [*self.listeners, *self.conns]:
            sock.close()


@pytest.fixture
def echo(stack: Stack) -> Iterator[Echo]:
    assert stack.world is not None
    wan = next(n for n in stack.world.namespaces if n.endswith("-wan"))
    server = Echo(wan)
    try:
        yield server
    finally:
        server.close()


def _snapshot(stack: Stack) -> dict[str, object]:
    with stack.gateway.client() as c:
        return c.call("snapshot", verify=True)  # the rules hashed now


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _wait(path: Path, line: str, after: int = 0, within: float = 15) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if line in _lines(path)[after:]:
            return
        time.sleep(0.05)
    raise AssertionError(f"no {line!r} after line {after}: {_lines(path)[after:][-10:]}")


def _wait_prefix(path: Path, prefix: str, within: float) -> str:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        for line in _lines(path):
            if line.startswith(prefix):
                return line
        time.sleep(0.05)
    raise AssertionError(f"no line {prefix!r}...: {_lines(path)[-10:]}")


def test_reload_cuts_what_the_new_policy_refuses(stack: Stack, sandbox: Runner, echo: Echo) -> None:
    assert stack.world is not None
    folder = Path(tempfile.mkdtemp(prefix="sg-reload-"))
    folder.chmod(0o777)
    work = folder / "work"
    work.mkdir()
    work.chmod(0o777)
    policy = folder / "p.toml"
    original = stack.world.policy.read_text()
    policy.write_text(original)
    (work / "client.py").write_text(CLIENT)
    stop = threading.Event()
    box: list[RunResult] = []
    opts = RunOptions(
        command=["python3", "/work/client.py"],
        world="test",
        workdir=work,
        timeout=90,
        stop=stop,
        store=str(sandbox.store_path),
        policy=str(policy),
    )
    runner = threading.Thread(target=lambda: box.append(run_in(stack, opts)), daemon=True)
    runner.start()
    log = work / "log"
    try:
        _wait(log, "kept ok")
        _wait(log, "cut ok")

        # A broken file: nothing changes, and the CLI says which line.
        before = _snapshot(stack)
        broken = folder / "broken.toml"
        broken.write_text(original.replace('internet = "open"', 'internet = "opne"', 1))
        command = [sys.executable, "-m", "sandgate", "reload", "--instance", stack.instance]
        cli = subprocess.run(
            [*command, "--policy", str(broken)],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert cli.returncode == 2, cli.stdout + cli.stderr
        assert "broken.toml:11" in cli.stderr and "internet" in cli.stderr, cli.stderr
        assert _snapshot(stack)["digest"] == before["digest"]
        mark = len(_lines(log))
        _wait(log, "cut ok", after=mark)

        # A file no guest uses: valid, says so, changes nothing.
        unused = folder / "unused.toml"
        unused.write_text(original)
        r = manage.reload(stack.instance, unused)
        assert (r.guests, r.changed, r.cut) == (0, 0, 0)

        # The real reload: CUT is denied now.
        policy.write_text(
            original.replace(
                "deny = [\n", f'deny = [\n  {{ host = "{CUT}", name = "not any more" }},\n', 1
            )
        )
        r = manage.reload(stack.instance, policy)
        assert (r.guests, r.changed, r.cut) == (1, 1, 1)
        after = _snapshot(stack)
        assert after["digest"] != before["digest"]
        assert after["expected"] == after["digest"]  # the watchdog follows the reload
        # The guest's socket was destroyed (ECONNABORTED here, a reset for the server).
        assert _wait_prefix(log, "cut error", within=5) in (
            "cut error ConnectionAbortedError",
            "cut error ConnectionResetError",
        )
        mark = len(_lines(log))
        _wait(log, "kept ok", after=mark)  # the other one keeps going
        time.sleep(0.5)
        assert "cut ok" not in _lines(log)[mark:]
    finally:
        stop.set()
        runner.join(60)
        shutil.rmtree(folder, ignore_errors=True)
    assert box, "the session did not end"
    events = sandbox.events(box[0])
    cuts = [e for e in events if e.kind is Kind.CONN and (e.details or {}).get("reload")]
    assert [(e.dst, e.port, e.verdict, e.reason) for e in cuts] == [
        (CUT, PORT, "deny", "deny.rule")
    ]
    assert cuts[0].rule is not None
    notices = [e for e in events if e.kind is Kind.NOTICE]
    assert any((e.details or {}).get("policy") == "reloaded" for e in notices)
