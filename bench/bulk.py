"""A bulk HTTP source for the throughput peer comparison: ``GET /`` sends ``size`` bytes with
``sendfile`` from a 64 MiB file read into the page cache beforehand, over and over (the kernel
does the work, so the server is not the limit; a cold file would be: the first pass over it
costs the server a core).

    python bulk.py ADDRESS PORT SIZE PATH      (run inside a bench namespace)
"""

from __future__ import annotations

import socket
import sys
import threading

BLOCK = 64 << 20


def serve(conn: socket.socket, size: int, path: str) -> None:
    with conn:
        head = b""
        while b"\r\n\r\n" not in head:
            data = conn.recv(4096)
            if not data:
                return
            head += data
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % size)
        left = size
        with open(path, "rb") as f:
            while left > 0:
                sent = conn.sendfile(f, 0, min(left, BLOCK))
                if not sent:
                    return
                left -= sent


def main() -> None:
    address, port, size, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    with open(path, "wb") as f:
        f.write(b"\0" * BLOCK)
    with open(path, "rb") as f:
        while f.read(1 << 20):
            pass
    listener = socket.create_server((address, port))
    print("READY", flush=True)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve, args=(conn, size, path), daemon=True).start()


if __name__ == "__main__":
    main()
