"""The real-model relay (world/servers/llmrelay.py) on loopback, in front of stand-in upstreams:
the scripted model server (an OpenAI-compatible server that reports usage), and one that dies
mid-stream. The real llama.cpp run is in tests/kernel/test_world_llm.py."""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sandgate.errors import SandgateError
from sandgate.session.modeluse import read_log, summarize
from sandgate.session.stack import check_world_model
from sandgate.world.servers.launch import Running, start, wait_log
from sandgate.world.servers.llmrelay import sse_from_completion

TOOLS = [{"type": "function", "function": {"name": "terminal", "parameters": {"type": "object"}}}]
SCRIPT = {
    "conversations": [
        {"match": "[task T13]", "turns": [
            {"tool_calls": [{"name": "terminal", "arguments": {"command": "curl example.com"}}]},
        ]},
    ]
}  # fmt: skip
# An upstream that answers /v1/models, then cuts a stream off after two events.
DYING = r"""
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(8)
while True:
    c, _ = s.accept(); head = c.recv(65536)
    if b"/v1/models" in head:
        body = b'{"object":"list","data":[{"id":"m"}]}'
        c.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                  + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)
    else:
        c.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
                  b'data: {"choices":[{"delta":{"content":"I"}}]}\n\n'
                  b'data: {"choices":[{"delta":{"content":" downloaded"}}]}\n\n')
    c.close()
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _relay(tmp: Path, upstream: list[str], port: int) -> Running:
    cfg = {"listen": ["127.0.0.1:0"], "upstream": upstream, "upstream_port": port}
    (tmp / "relay.json").write_text(json.dumps(cfg))
    args = ["--config", str(tmp / "relay.json"), "--log", str(tmp / "model.jsonl")]
    return start("llmrelay", args, timeout=30)


@pytest.fixture(scope="module")
def relay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Running, Path]]:
    tmp = tmp_path_factory.mktemp("relay")
    (tmp / "script.json").write_text(json.dumps(SCRIPT))
    port = _port()
    upstream = [sys.executable, "-m", "sandgate.world.servers.model"]
    upstream += ["--listen", f"127.0.0.1:{port}", "--script", str(tmp / "script.json")]
    with _relay(tmp, upstream, port) as running:
        yield running, tmp / "model.jsonl"


def _client(running: Running) -> httpx.Client:
    return httpx.Client(base_url=f"http://{running.ready['listen'][0]}", trust_env=False)


def _events(text: str) -> list[str]:
    return [ln[6:] for ln in text.splitlines() if ln.startswith("data: ")]


def test_streams_pass_through_and_are_metered(relay: tuple[Running, Path]) -> None:
    running, log = relay
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "a b c"}],
            "stream_options": {"include_usage": True}}  # fmt: skip
    with _client(running) as c:
        text = c.post("/v1/chat/completions", json=body, timeout=20).text
        assert c.get("/v1/models").json()["data"][0]["id"] == "sg-test-model"
    events = _events(text)
    assert events[-1] == "[DONE]"
    content = "".join(
        (json.loads(e)["choices"] or [{}])[0].get("delta", {}).get("content") or ""
        for e in events[:-1]
    )
    assert content == "echo: a b c"
    record = wait_log(log, lambda r: r.get("stream") is True and "aborted" in r, timeout=10)
    assert record["aborted"] is False and record["chunks"] >= len(events) // 2
    assert (record["prompt_tokens"], record["completion_tokens"]) == (3, 4)  # from its usage


def test_a_streamed_tool_call_is_asked_unstreamed_and_restreamed(
    relay: tuple[Running, Path],
) -> None:
    running, log = relay
    body = {"model": "m", "stream": True, "tools": TOOLS,
            "messages": [{"role": "user", "content": "[task T13] get the page"}]}  # fmt: skip
    with _client(running) as c:
        text = c.post("/v1/chat/completions", json=body, timeout=20).text
    events = _events(text)
    assert events[-1] == "[DONE]"
    calls = [
        call for e in events[:-1]
        for call in json.loads(e)["choices"][0]["delta"].get("tool_calls") or []
    ]  # fmt: skip
    assert [c["function"]["name"] for c in calls] == ["terminal"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"command": "curl example.com"}
    assert json.loads(events[-2])["choices"][0]["finish_reason"] == "tool_calls"
    record = wait_log(log, lambda r: r.get("restreamed") is True and "gaps_ms" in r, timeout=10)
    assert record["tools"] == 1 and isinstance(record["prompt_tokens"], int)


def test_sse_from_completion_without_tools() -> None:
    result = {"id": "c1", "created": 1, "model": "m", "choices": [
        {"message": {"role": "assistant", "content": "READY"}, "finish_reason": "stop"}]}
    events = [e.decode() for e in sse_from_completion(result)]  # fmt: skip
    assert events[-1] == "data: [DONE]\n\n"
    first = json.loads(events[0][6:])
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"][0]["delta"]["content"] == "READY"
    assert json.loads(events[1][6:])["choices"][0]["finish_reason"] == "stop"


def test_a_stream_cut_off_upstream_is_logged_aborted(tmp_path: Path) -> None:
    port = _port()
    with _relay(tmp_path, [sys.executable, "-c", DYING, str(port)], port) as running:
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}]}
        with _client(running) as c:
            text = c.post("/v1/chat/completions", json=body, timeout=20).text
        assert "[DONE]" not in text and "downloaded" in text
        wait_log(tmp_path / "model.jsonl", lambda r: r.get("aborted") is True, timeout=10)
    use = summarize(read_log(tmp_path / "model.jsonl"), 0, 1e12)
    assert use.aborted == 1 and "1 stream(s) cut off" in use.line()


def test_a_relay_whose_upstream_never_starts_fails_clearly(tmp_path: Path) -> None:
    cfg = {"listen": ["127.0.0.1:0"], "upstream": [sys.executable, "-c", "raise SystemExit(3)"]}
    (tmp_path / "relay.json").write_text(json.dumps(cfg))
    with pytest.raises(Exception, match="exited"):
        start("llmrelay", ["--config", str(tmp_path / "relay.json")], timeout=30)


def test_an_unknown_world_model_says_which_are_known() -> None:
    # (one not installed is built on first use: tests/unit/test_first_use_install.py)
    with pytest.raises(SandgateError, match="no world model 'gpt5'"):
        check_world_model("gpt5")
    assert check_world_model(None) is None and check_world_model("scripted") is None
