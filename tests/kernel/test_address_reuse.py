"""A guest's address is given to a later guest once it leaves: the later one must not inherit
the flows the gateway tracked for the first. Attacker's side: a session allowed to reach a host
opens a UDP flow to it and leaves; a session whose policy refuses that host, given the same
address, sends from the same port to the same host. Had the flow's conntrack entry outlived the
first guest, ``ct state established`` would carry the datagram out with no verdict."""

from __future__ import annotations

import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandgate.events.schema import Kind
from sandgate.net import ns
from sandgate.session.runner import RunResult
from sandgate.session.stack import Stack
from tests.kernel.conftest import Runner

pytestmark = pytest.mark.kernel

HOST, PORT, SPORT = "203.0.113.30", 7312, 47001  # a "public" host of the test world
CLIENT = f"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", {SPORT}))
s.connect(("{HOST}", {PORT}))
print(s.getsockname()[0], flush=True)
s.settimeout(1)
s.send(sys.argv[1].encode())
try:
    print("echo", s.recv(64).decode(), flush=True)
except OSError as exc:
    print("no echo", type(exc).__name__, flush=True)
"""


class UdpEcho:
    """A UDP echo server on HOST, in the test world's wan namespace; it keeps what it got."""

    def __init__(self, netns: str) -> None:
        self.sock = ns.run_in(netns, self._bind)
        self.got: list[bytes] = []
        threading.Thread(target=self._serve, daemon=True).start()

    @staticmethod
    def _bind() -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind((HOST, PORT))
        return sock

    def _serve(self) -> None:
        while True:
            try:
                data, peer = self.sock.recvfrom(64)
                self.got.append(data)
                self.sock.sendto(data, peer)
            except OSError:
                return


def _output(result: RunResult) -> list[str]:
    return Path(result.report.output or "").read_text().splitlines() or [""]


@pytest.fixture
def echo(stack: Stack) -> Iterator[UdpEcho]:
    assert stack.world is not None
    wan = next(n for n in stack.world.namespaces if n.endswith("-wan"))
    server = UdpEcho(wan)
    try:
        yield server
    finally:
        server.sock.close()


def test_a_reused_address_inherits_no_flow(stack: Stack, sandbox: Runner, echo: UdpEcho) -> None:
    assert stack.world is not None
    folder = Path(tempfile.mkdtemp(prefix="sg-reuse-"))
    folder.chmod(0o755)
    try:
        work = folder / "work"
        work.mkdir()
        work.chmod(0o777)
        (work / "client.py").write_text(CLIENT)
        original = stack.world.policy.read_text()
        refusing = folder / "refusing.toml"
        refusing.write_text(
            original.replace(
                "deny = [\n", f'deny = [\n  {{ host = "{HOST}", name = "not this one" }},\n', 1
            )
        )
        client = ["python3", "/work/client.py"]

        first = sandbox(*client, "open", workdir=work)
        address, answer = _output(first)[:2]
        assert answer == "echo open", _output(first)  # the flow was made

        # The next sessions of the refusing policy, until one is given the same address (the
        # first free slot: within the warm pool's size and a few).
        for attempt in range(8):
            later = sandbox(*client, f"later{attempt}", workdir=work, policy=str(refusing))
            if _output(later)[0] == address:
                break
        else:
            pytest.fail(f"no later session was given {address}")
        assert [d for d in echo.got if d.startswith(b"later")] == [], echo.got
        assert _output(later)[1].startswith("no echo"), _output(later)
        refused = [e for e in sandbox.events(later) if e.kind is Kind.CONN and e.dst == HOST]
        assert refused and all(e.verdict == "deny" for e in refused), refused
    finally:
        shutil.rmtree(folder, ignore_errors=True)
