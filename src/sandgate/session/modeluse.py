"""A session's use of the model server, read from the server's own log (issue 15, part 5).

The model server is the one place the agent's prompt goes. Its log has a line per request
(world/servers/meter.py: tokens where the server reports them, first-token delay and the gaps
between streamed chunks); the lines that fall in the session's window are its use:

    requests          every request to the server (models list, health, completions)
    completions       chat completions among them; streamed how many
    tokens_in/out     summed where the server reported them (None: it never did)
    first_token_ms    median and max over the streamed completions
    p99_gap_ms        the 99th percentile of every pause between chunks, the session's streams
                      together (seed 002's "6 minutes instead of 17 s" shows as seconds and
                      gaps, at a glance)
    seconds           the completions' time at the server, summed
    errors, aborted   answers >= 400; streams that stopped before their end

Attribution is by time window: the server sees every session's requests from the gateway's
uplink address (10.77.0.2, the gateway fronts and forwards them), so sessions run at the same
time on one world cannot be told apart here; a suite runs them one after another.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from sandgate import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

__all__ = ["ModelUse", "read_log", "summarize"]

_COMPLETION = "/chat/completions"


@dataclass(frozen=True)
class ModelUse:
    """A session's model requests and tokens, as the proxy counted them."""

    requests: int = 0
    completions: int = 0
    streamed: int = 0
    tokens_in: int | None = None
    tokens_out: int | None = None
    first_token_ms: float | None = None  # median
    first_token_max_ms: float | None = None
    p99_gap_ms: float | None = None
    max_gap_ms: float | None = None
    seconds: float = 0.0
    errors: int = 0
    aborted: int = 0

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        """One line for a report: '3 requests, 2 completions (2 streamed), 812 -> 40 tokens,
        first token 12 ms, p99 gap 5.1 ms, 0.4 s at the model'."""
        if not self.requests:
            return "no request to the model server"
        parts = [f"{self.requests} request(s), {self.completions} completion(s)"]
        if self.streamed:
            parts[0] += f" ({self.streamed} streamed)"
        if self.tokens_in is not None or self.tokens_out is not None:
            parts.append(f"{self.tokens_in or 0} -> {self.tokens_out or 0} tokens")
        if self.first_token_ms is not None:
            parts.append(f"first token {self.first_token_ms:g} ms")
        if self.p99_gap_ms is not None:
            parts.append(f"p99 chunk gap {self.p99_gap_ms:g} ms")
        parts.append(f"{self.seconds:g} s at the model")
        if self.errors:
            parts.append(f"{self.errors} error(s)")
        if self.aborted:
            parts.append(f"{self.aborted} stream(s) cut off")
        return ", ".join(parts)


def _p99(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]  # nearest rank


def summarize(
    records: Iterable[dict[str, Any]],
    start: float,
    end: float,
) -> ModelUse:
    """The log lines of ``request`` events with ``start <= ts <= end``."""
    mine = [
        r for r in records
        if r.get("event") == "request" and isinstance(r.get("ts"), int | float)
        and start <= float(r["ts"]) <= end
    ]  # fmt: skip
    comps = [r for r in mine if _COMPLETION in str(r.get("target", ""))]
    streamed = [r for r in comps if r.get("stream")]

    def total(key: str) -> int | None:
        got = [int(r[key]) for r in comps if isinstance(r.get(key), int | float)]
        return sum(got) if got else None

    firsts = [float(r["first_token_ms"]) for r in streamed if r.get("first_token_ms") is not None]
    first_ms = None
    if firsts:  # ~3-8 ms to import: only a session that streamed from the model pays it
        import statistics

        first_ms = round(statistics.median(firsts), 2)
    gaps = [float(g) for r in streamed for g in r.get("gaps_ms") or ()]
    return ModelUse(
        requests=len(mine),
        completions=len(comps),
        streamed=len(streamed),
        tokens_in=total("prompt_tokens"),
        tokens_out=total("completion_tokens"),
        first_token_ms=first_ms,
        first_token_max_ms=max(firsts) if firsts else None,
        p99_gap_ms=_p99(gaps),
        max_gap_ms=max(gaps) if gaps else None,
        seconds=round(sum(float(r.get("ms") or 0) for r in comps) / 1000, 3),
        errors=sum(1 for r in mine if int(r.get("status") or 0) >= 400),
        aborted=sum(1 for r in streamed if r.get("aborted")),
    )


def read_log(path: Path) -> Iterator[dict[str, Any]]:
    """The log's JSON lines; a torn or foreign line is skipped, a missing file is empty."""
    try:
        f = open(path, encoding="utf-8", errors="replace")  # noqa: SIM115
    except OSError:
        return
    with f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                yield record
