"""Tripwire listeners: banner, connection log, UDP echo."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandgate.world.servers.launch import start, wait_log
from sandgate.world.servers.listen import DEFAULT_BANNERS, parse_port_spec


def test_port_specs() -> None:
    assert parse_port_spec("22") == (22, DEFAULT_BANNERS[22])
    assert parse_port_spec("445") == (445, b"")
    assert parse_port_spec("0=hi\\r\\n") == (0, b"hi\r\n")
    with pytest.raises(ValueError, match="range"):
        parse_port_spec("70000")


@pytest.fixture(scope="module")
def nas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    log = tmp_path_factory.mktemp("listen") / "log.jsonl"
    args = ["--bind", "127.0.0.1", "--tcp", "0=SSH-2.0-sg-nas\\r\\n", "--tcp", "0"]
    args += ["--udp", "0", "--read-ms", "300", "--log", str(log)]
    with start("listen", args) as running:
        yield {**running.ready, "log": log}


def _addr(text: str) -> tuple[str, int]:
    host, port = text.rsplit(":", 1)
    return host, int(port)


def test_tcp_banner_and_log(nas: dict[str, Any]) -> None:
    with socket.create_connection(_addr(nas["tcp"][0]), timeout=3) as sock:
        sock.sendall(b"SSH-2.0-client\r\n")
        assert sock.recv(100) == b"SSH-2.0-sg-nas\r\n"
        local = sock.getsockname()
    src = f"{local[0]}:{local[1]}"
    port = _addr(nas["tcp"][0])[1]
    connect = wait_log(nas["log"], lambda r: r["event"] == "connect" and r["src"] == src)
    assert (connect["proto"], connect["port"]) == ("tcp", port)
    closed = wait_log(nas["log"], lambda r: r["event"] == "closed" and r["src"] == src)
    assert bytes.fromhex(closed["head"]) == b"SSH-2.0-client\r\n"


def test_silent_port_closes(nas: dict[str, Any]) -> None:
    with socket.create_connection(_addr(nas["tcp"][1]), timeout=3) as sock:
        assert sock.recv(100) == b""  # no banner; closed after the read window


def test_udp_echo_and_log(nas: dict[str, Any]) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(3)
        sock.sendto(b"nfs?", _addr(nas["udp"][0]))
        assert sock.recvfrom(100)[0] == b"nfs?"
    record = wait_log(nas["log"], lambda r: r["event"] == "datagram")
    assert record["size"] == 4 and record["proto"] == "udp"


def test_needs_a_port(tmp_path: Path) -> None:
    from sandgate.world.servers.launch import ServerFailed

    with pytest.raises(ServerFailed):
        start("listen", ["--bind", "127.0.0.1"])
