"""TLS on memory BIOs for inspection: many records per system call, both ways.

``ssl.SSLSocket`` reads one TLS record (at most 16 KiB of plaintext) per ``recv`` and makes one
``send`` per record it writes, so an inspected 1 GiB transfer cost ~65k reads and ~65k writes
each way with h11 and our own code run once per record. ``TlsStream`` keeps OpenSSL on memory
BIOs (``ssl.SSLObject``): ``recv`` takes what the kernel has (up to ``RAW``) in one call and
decrypts every whole record in it; ``sendall`` encrypts everything it is given and hands the
records to the kernel in one call. Records are decrypted into one buffer per thread (no bytes
object per record, no join): OpenSSL alone, 256 MiB on this machine, 0.37 → 0.17 s. Figures
through the proxy: docs/NOTES.md.

It looks enough like a socket for http1.py (``recv``, ``sendall``, ``settimeout``, ``pending``,
``fileno``, ``shutdown``, ``close``); errors are the ``ssl`` module's and ``OSError`` as before.
"""

from __future__ import annotations

import contextlib
import mmap
import socket
import ssl
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

# Ciphertext taken from the kernel per recv(), plaintext handed up per recv() at most (the
# sizes of a thread's two buffers). 512 KiB rather than 256: fewer reads, sends and wake-ups a
# GB (bench.proxyloop at load 3-6, paired: CPU a GB lower in 15 of 17 pairs, median 1.89 ->
# 1.66 s/GB in the 6 against main); 64 KiB and 1 MiB cost more.
RAW = 512 * 1024
PLAIN = 512 * 1024
SESSIONS = 256  # upstream TLS sessions kept for resumption (one per name and port)


class Stream(Protocol):
    """What http1.py reads and writes: a socket, or a ``TlsStream`` over one."""

    def recv(self, n: int, /) -> bytes: ...
    def sendall(self, data: bytes | bytearray | memoryview, /) -> None: ...
    def settimeout(self, value: float | None, /) -> None: ...
    def fileno(self) -> int: ...
    def shutdown(self, how: int, /) -> None: ...
    def close(self) -> None: ...


class TlsStream:
    """One TLS connection over a connected socket, OpenSSL on memory BIOs."""

    def __init__(
        self,
        sock: socket.socket,
        context: ssl.SSLContext,
        *,
        server_side: bool,
        server_hostname: str | None = None,
        session: ssl.SSLSession | None = None,
        on_close: Callable[[ssl.SSLSession | None], None] | None = None,
    ) -> None:
        self.sock = sock
        self._on_close = on_close  # keeps the session (a TLS 1.3 ticket comes after the handshake)
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self.tls = context.wrap_bio(
            self._in,
            self._out,
            server_side=server_side,
            server_hostname=server_hostname,
            session=session,
        )
        self._eof = False

    # -- the handshake ----------------------------------------------------------------------------

    def handshake(self, timeout: float | None = None) -> None:
        previous = self.sock.gettimeout()
        self.sock.settimeout(timeout)
        try:
            while True:
                try:
                    self.tls.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    self._flush()
                    if not self._fill():
                        raise ssl.SSLEOFError("EOF during the TLS handshake") from None
            self._flush()
        finally:
            self.sock.settimeout(previous)

    @property
    def session(self) -> ssl.SSLSession | None:
        return self.tls.session

    @property
    def session_reused(self) -> bool:
        return self.tls.session_reused

    def selected_alpn_protocol(self) -> str | None:
        return self.tls.selected_alpn_protocol()

    # -- data -------------------------------------------------------------------------------------

    def recv(self, n: int = PLAIN) -> bytes:
        """Up to ``n`` bytes of plaintext: every whole record already received, or the next
        ones to arrive (one blocking read). b"" at the end of the stream."""
        return bytes(self._plaintext(n))

    def recv_view(self, n: int = PLAIN) -> memoryview:
        """``recv`` without the copy: the plaintext stays in this thread's buffer, valid until
        this thread reads from any TlsStream again (a relay writes it out first)."""
        return self._plaintext(n)

    def pending(self) -> int:
        """Plaintext or ciphertext held here that select() on the socket cannot see."""
        return self.tls.pending() + self._in.pending

    def sendall(self, data: bytes | bytearray | memoryview) -> None:
        if data:
            self.tls.write(data)
        self._flush()

    # -- the socket underneath -------------------------------------------------------------------

    def fileno(self) -> int:
        return self.sock.fileno()

    def settimeout(self, value: float | None) -> None:
        self.sock.settimeout(value)

    def gettimeout(self) -> float | None:
        return self.sock.gettimeout()

    def setsockopt(self, level: int, option: int, value: int | bytes) -> None:
        self.sock.setsockopt(level, option, value)

    def shutdown(self, how: int) -> None:
        if how in (socket.SHUT_WR, socket.SHUT_RDWR):
            with contextlib.suppress(ssl.SSLError, OSError):
                self.tls.unwrap()  # close_notify: the peer can tell an end from a cut
                self._flush()
        self.sock.shutdown(how)

    def close(self) -> None:
        if self._on_close is not None:
            keep, self._on_close = self._on_close, None
            with contextlib.suppress(ssl.SSLError, ValueError):
                keep(self.tls.session)
        self.sock.close()

    def __enter__(self) -> TlsStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- inside -----------------------------------------------------------------------------------

    def _plaintext(self, n: int) -> memoryview:
        while True:
            got = self._decrypt(n)
            if got or self._eof or not self._fill():
                return got

    def _decrypt(self, n: int) -> memoryview:
        """Every whole record held, up to ``n`` bytes, decrypted into this thread's buffer
        (OpenSSL gives one record per read: no bytes object per record, no join)."""
        view = _buffer("plain", PLAIN)
        n = min(n, len(view))
        size = 0
        while size < n:
            if not self._in.pending and not self.tls.pending():
                break  # nothing held: SSL_read could only raise SSLWantReadError (~2.6 µs)
            try:
                got: int = self.tls.read(n - size, view[size:n])  # type: ignore[assignment]
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:  # close_notify
                self._eof = True
                break
            if not got:
                self._eof = True
                break
            size += got
        self._flush()  # a TLS 1.3 key update or ticket may want an answer
        return view[:size]

    def _fill(self) -> bool:
        """One read from the kernel into the incoming BIO; False at EOF."""
        raw = _buffer("raw", RAW)  # recv(RAW) would allocate (and shrink) RAW each time
        got = self.sock.recv_into(raw)
        if not got:
            self._eof = True
            self._in.write_eof()
            return False
        self._in.write(raw[:got])
        return True

    def _flush(self) -> None:
        if self._out.pending:
            self.sock.sendall(self._out.read())


_local = threading.local()


def _buffer(kind: str, size: int) -> memoryview:
    """This thread's buffer of that kind: decrypted plaintext, or ciphertext off the socket. Per
    thread, not per stream: a connection's two streams run on one thread, and what is in a
    buffer is copied out (into the BIO, into bytes) before the other stream uses it."""
    view: memoryview | None = getattr(_local, kind, None)
    if view is None:
        # Anonymous memory, not a bytearray: bytearray(n) zeroes every page, so each new
        # connection's thread would write and keep 1 MiB; the kernel backs only what is used.
        view = memoryview(mmap.mmap(-1, size))
        setattr(_local, kind, view)
    return view


class Sessions:
    """Upstream TLS sessions by (name, port), bounded (LRU), for resumption on the next dial."""

    def __init__(self, bound: int = SESSIONS) -> None:
        self._bound = bound
        self._held: OrderedDict[tuple[str, int], ssl.SSLSession] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, name: str, port: int) -> ssl.SSLSession | None:
        with self._lock:
            session = self._held.get((name, port))
            if session is not None:
                self._held.move_to_end((name, port))
            return session

    def put(self, name: str, port: int, session: ssl.SSLSession | None) -> None:
        if session is None:
            return
        with self._lock:
            self._held[(name, port)] = session
            self._held.move_to_end((name, port))
            while len(self._held) > self._bound:
                self._held.popitem(last=False)
