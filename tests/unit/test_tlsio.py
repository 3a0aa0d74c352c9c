"""tlsio.TlsStream's reads against what was sent: ciphertext cut at random places.

The stream decrypts every whole record it holds and asks OpenSSL for more only when something
is held (a read on empty BIOs could only say "want read"); it reads the kernel into one buffer
per thread and can hand plaintext up without a copy (``recv_view``). Here a peer on a real
socket sends TLS records split anywhere (inside headers, one byte at a time, many records in one
send), with TLS 1.3 tickets after the handshake and a close_notify at the end, and the stream
must deliver exactly the bytes sent, in order, and then the end.
"""

from __future__ import annotations

import contextlib
import random
import socket
import ssl
import threading
from pathlib import Path

import pytest

from sandgate.gateway.proxy.ca import make_ca
from sandgate.gateway.proxy.tlsio import TlsStream

NAME = "tlsio.test"


@pytest.fixture(scope="module")
def contexts(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    ca = make_ca("tlsio CA", days=1)
    cert, key = ca.issue([NAME], days=1)
    folder: Path = tmp_path_factory.mktemp("tlsio")
    (folder / "c.pem").write_bytes(cert + ca.cert_pem)
    (folder / "k.pem").write_bytes(key)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(folder / "c.pem", folder / "k.pem")
    client = ssl.create_default_context(cadata=ca.cert_pem.decode())
    return server, client


def plaintext(seed: int) -> list[bytes]:
    """The peer's writes: sizes around a record's (16 KiB), tiny and large."""
    rng = random.Random(seed)
    out = []
    for _ in range(60):
        size = rng.choice((1, 7, 100, 5000, 16384, 16385, 70000))
        out.append(rng.randbytes(size))
    return out


def send_cut(
    sock: socket.socket, tls: ssl.SSLObject, out: ssl.MemoryBIO, seed: int, read: threading.Event
) -> None:
    """The peer: the writes, their records sent in random pieces; once everything was read
    (nothing more will come to wake a stream that held plaintext back), a close_notify."""
    rng = random.Random(seed)
    pending = bytearray()
    for data in plaintext(seed):
        tls.write(data)
        pending += out.read()
        while pending and rng.random() < 0.7:  # pieces: some tiny, some across records
            cut = rng.choice((1, 2, 5, 6, 300, 16389, 40000, len(pending)))
            sock.sendall(pending[:cut])
            del pending[:cut]
    sock.sendall(pending)
    pending.clear()
    read.wait(10)
    with contextlib.suppress(ssl.SSLWantReadError):  # the peer's close_notify is not awaited
        tls.unwrap()
    pending += out.read()
    while pending:
        cut = rng.choice((1, 3, 1000, len(pending)))
        sock.sendall(pending[:cut])
        del pending[:cut]


def handshake(
    sock: socket.socket, tls: ssl.SSLObject, inc: ssl.MemoryBIO, out: ssl.MemoryBIO
) -> None:
    while True:
        try:
            tls.do_handshake()
            break
        except ssl.SSLWantReadError:
            if out.pending:
                sock.sendall(out.read())
            data = sock.recv(65536)
            if not data:
                raise EOFError from None
            inc.write(data)
    if out.pending:
        sock.sendall(out.read())


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("stream_side", ["client", "server"])
def test_reads_deliver_exactly_what_was_sent_however_it_is_cut(
    contexts: tuple[ssl.SSLContext, ssl.SSLContext], seed: int, stream_side: str
) -> None:
    server_ctx, client_ctx = contexts
    mine, theirs = socket.socketpair()
    mine.settimeout(5)  # a stream that held plaintext back would wait here in vain
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    if stream_side == "client":  # the peer is the server: its tickets come after the handshake
        peer = server_ctx.wrap_bio(inc, out, server_side=True)
        stream = TlsStream(mine, client_ctx, server_side=False, server_hostname=NAME)
    else:
        peer = client_ctx.wrap_bio(inc, out, server_side=False, server_hostname=NAME)
        stream = TlsStream(mine, server_ctx, server_side=True)
    sent = b"".join(plaintext(seed))
    read = threading.Event()

    def run_peer() -> None:
        handshake(theirs, peer, inc, out)
        send_cut(theirs, peer, out, seed, read)

    thread = threading.Thread(target=run_peer, daemon=True)
    thread.start()
    stream.handshake(20)
    got = bytearray()
    rng = random.Random(seed + 100)
    while len(got) < len(sent):
        n = rng.choice((1, 10, 16384, 1 << 20))
        piece = stream.recv_view(n) if rng.random() < 0.5 else stream.recv(n)
        assert 0 < len(piece) <= n
        got += piece
    assert bytes(got) == sent
    read.set()
    assert stream.recv() == b""  # the close_notify
    assert stream.recv() == b""  # the end stays the end
    thread.join(10)
    stream.close()
    theirs.close()
