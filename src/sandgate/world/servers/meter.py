"""What a model server logs about each completion: tokens and streaming delays (issue 15).

The model server is the one place an agent's prompt goes; its own log line per request is
where a session's model use is read from (session/modeluse.py). A streamed body is wrapped so
that, when the last chunk has gone, the line holds:

    first_token_ms  request received -> first chunk handed to the connection
    gaps_ms         the pauses between chunks (at most MAX_GAPS, rounded to 0.01 ms)
    chunks          how many were sent
    aborted         the upstream stopped mid-stream (a relay's upstream died, no [DONE])

Token counts are the server's own (``usage``) where it reports them; None when it does not.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

__all__ = ["MAX_GAPS", "timed_stream"]

MAX_GAPS = 4096


async def timed_stream(
    body: AsyncIterable[bytes], log: dict[str, Any], started: float
) -> AsyncIterator[bytes]:
    """Yield ``body`` unchanged, recording its timing into ``log`` (the request's log line,
    written once the body is done or the client left)."""
    last: float | None = None
    gaps: list[float] = []
    log["chunks"] = 0
    try:
        async for chunk in body:
            now = time.monotonic()
            if last is None:
                log["first_token_ms"] = round((now - started) * 1000, 2)
            elif len(gaps) < MAX_GAPS:
                gaps.append(round((now - last) * 1000, 2))
            last = now
            log["chunks"] += 1
            yield chunk
    finally:
        log["gaps_ms"] = gaps
