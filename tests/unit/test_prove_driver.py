"""The probe driver's TCP verdict: "allow" only for a socket the kernel says is connected.

A flaky ``block 192.88.99.2/32: LEAK`` (and once ``block 192.0.0.170/31``) in
tests/kernel/test_prove.py: the gateway had seen one SYN and refused it, yet Python's
``connect()`` (with a timeout: poll, then ``SO_ERROR == 0``) had returned. These tests use
real loopback sockets; only the racy return of ``connect()`` is forced, by a socket whose
``connect`` returns without connecting."""

from __future__ import annotations

import socket
import struct
import time
from typing import Any

import pytest

from sandgate.prove import driver


class _ReturnsUnconnected(socket.socket):
    """A real TCP socket whose connect() returns as Python's does in that race."""

    def connect(self, address: Any) -> None:
        return None


def test_a_connect_that_returns_unconnected_is_not_a_leak(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(driver.socket, "socket", _ReturnsUnconnected)
    observed, detail = driver.tcp({"address": "192.88.99.2", "port": 9})
    assert observed == "silent"  # the gateway's record decides, as for a timeout
    assert "unconnected" in detail["error"]
    observed, _ = driver.tls({"address": "192.88.99.2", "port": 443})
    assert observed == "deny"


def test_a_real_connection_is_allowed() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        observed, detail = driver.tcp({"address": "127.0.0.1", "port": port})
    assert observed == "allow" and "error" not in detail


def test_a_connection_reset_at_once_still_reached_the_far_end() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname(), timeout=2)
        try:
            conn, _ = server.accept()
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()  # a reset
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                try:
                    client.getpeername()
                except OSError:
                    break
                time.sleep(0.01)
            assert driver.unconnected(client) == (
                "allow",
                "reset by the destination after connecting",
            )
        finally:
            client.close()


def test_a_fresh_socket_is_unconnected() -> None:
    with socket.socket() as s:
        assert driver.unconnected(s) == ("silent", "connect() returned an unconnected socket")
