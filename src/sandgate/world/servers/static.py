"""Bodies that come from files or from a formula, streamed in large chunks.

`/bytes/<n>` content: byte i of the body is `i % 256`. It is served from one prebuilt
1 MiB block, so a 1 GiB download costs 1024 writes and no per-byte Python work, and a
client can check any range without a reference copy.
"""

from __future__ import annotations

import asyncio
import mimetypes
from collections.abc import AsyncIterator
from pathlib import Path

from sandgate.world.servers.httpio import Response

__all__ = ["BLOCK", "byte_pattern", "file_response", "pattern_response"]

CHUNK = 1 << 20
BLOCK = bytes(range(256)) * (CHUNK // 256)


def byte_pattern(start: int, length: int) -> bytes:
    """The `/bytes` content from offset `start`, `length` bytes long (for checking)."""
    return bytes((start + i) % 256 for i in range(length))


async def _pattern(n: int) -> AsyncIterator[bytes]:
    full, rest = divmod(n, CHUNK)
    for _ in range(full):
        yield BLOCK
    if rest:
        yield BLOCK[:rest]


def pattern_response(n: int) -> Response:
    headers = [("content-type", "application/octet-stream"), ("content-length", str(n))]
    return Response(200, headers, _pattern(n))


async def _read_file(path: Path) -> AsyncIterator[bytes]:
    loop = asyncio.get_running_loop()
    with path.open("rb") as f:
        # reads go to a thread: a slow disk must not stall every other connection
        while chunk := await loop.run_in_executor(None, f.read, CHUNK):
            yield chunk


def file_response(
    path: Path,
    content_type: str | None = None,
    status: int = 200,
    headers: dict[str, str] | None = None,
) -> Response:
    size = path.stat().st_size
    ctype = content_type or mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    extra = {"content-type": ctype, **(headers or {}), "content-length": str(size)}
    return Response(status, list(extra.items()), _read_file(path))
