"""A session's model use (issue 15, part 5): requests, tokens, first token, p99 chunk gap,
read from the model server's own log. The server is the real one, on loopback."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx2
import openai

from sandgate.session.modeluse import ModelUse, read_log, summarize
from sandgate.world.servers.launch import start, wait_log


def _req(ts: float, target: str = "/v1/chat/completions", **kw: Any) -> dict[str, Any]:
    return {"ts": ts, "event": "request", "target": target, "status": 200, "ms": 100.0, **kw}


def test_summary_of_a_window() -> None:
    records = [
        _req(5.0, stream=True, prompt_tokens=999),  # before the session
        _req(10.0, "/v1/models"),
        _req(11.0, stream=True, prompt_tokens=800, completion_tokens=30,
             first_token_ms=40.0, gaps_ms=[1.0] * 98 + [50.0, 400.0]),
        _req(12.0, stream=False, prompt_tokens=12, completion_tokens=2, ms=2000.0),
        _req(13.0, stream=True, first_token_ms=60.0, gaps_ms=[2.0], aborted=True),
        _req(14.0, status=503),
        {"ts": 14.5, "event": "ready"},
        _req(30.0, stream=True, completion_tokens=999),  # after it
    ]  # fmt: skip
    use = summarize(records, 10.0, 20.0)
    assert (use.requests, use.completions, use.streamed) == (5, 4, 2)
    assert (use.tokens_in, use.tokens_out) == (812, 32)
    assert (use.first_token_ms, use.first_token_max_ms) == (50.0, 60.0)
    # 101 gaps: the 99th percentile (nearest rank, the 100th value) is the 50 ms pause
    assert (use.p99_gap_ms, use.max_gap_ms) == (50.0, 400.0)
    assert use.seconds == 2.3 and use.errors == 1 and use.aborted == 1
    line = use.line()
    assert "5 request(s), 4 completion(s) (2 streamed)" in line
    assert "812 -> 32 tokens" in line and "p99 chunk gap 50 ms" in line
    assert "1 stream(s) cut off" in line


def test_no_tokens_reported_is_not_zero_tokens() -> None:
    use = summarize([_req(1.0, stream=False)], 0, 2)
    assert use.tokens_in is None and use.tokens_out is None and use.p99_gap_ms is None
    assert ModelUse().line() == "no request to the model server"


def test_read_log_skips_torn_lines(tmp_path: Path) -> None:
    log = tmp_path / "model.jsonl"
    log.write_text('{"ts": 1, "event": "request"}\n{"ts": 2, "ev\n[1, 2]\n')
    assert list(read_log(log)) == [{"ts": 1, "event": "request"}]
    assert list(read_log(tmp_path / "missing.jsonl")) == []


def test_the_model_server_meters_its_streams(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    args = ["--listen", "127.0.0.1:0", "--log", str(log), "--token-delay-ms", "5"]
    with start("model", args) as server:
        client = openai.OpenAI(
            base_url=f"http://{server.ready['listen'][0]}/v1",
            api_key="sk-none",
            max_retries=0,
            http_client=httpx2.Client(trust_env=False, timeout=10),
        )
        t0 = time.time()
        chunks = list(
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "one two three"}], stream=True
            )
        )
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a b"}])
        record = wait_log(str(log), lambda r: r.get("stream") is True and "gaps_ms" in r)
        wait_log(str(log), lambda r: r.get("stream") is False)
    assert record["chunks"] == len(chunks) + 1  # and data: [DONE]
    assert len(record["gaps_ms"]) == record["chunks"] - 1
    assert record["first_token_ms"] >= 0
    assert (record["prompt_tokens"], record["completion_tokens"]) == (3, 4)
    use = summarize(read_log(log), t0 - 1, time.time() + 1)
    assert (use.completions, use.streamed, use.tokens_in, use.tokens_out) == (2, 1, 5, 7)
    # each chunk after the first waits --token-delay-ms: a lower bound, never a speed test
    assert use.p99_gap_ms is not None and use.p99_gap_ms >= 4.0
