"""The model server, driven by the official openai SDK, plus its pure reply logic."""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
import openai
import pytest

from sandgate.world.servers.chatwire import (
    SCRIPT_DONE,
    Script,
    choose_reply,
    completion_chunks,
    tokens,
)
from sandgate.world.servers.launch import Running, read_log, start, wait_log

SCRIPT = {
    "conversations": [
        {
            "match": "task-7",
            "turns": [
                {
                    "tool_calls": [
                        {"name": "shell", "arguments": {"cmd": "ls -la /workspace"}},
                        {"name": "read_file", "arguments": '{"path": "README.md"}'},
                    ]
                },
                {"content": "All done: two tools ran."},
            ],
        }
    ]
}
TOOLS: Any = [
    {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
    for n in ("shell", "read_file")
]


# --- pure: which reply, which chunks ---------------------------------------------------


def test_tokens_rejoin_to_the_text() -> None:
    text = "  hello,  big\nworld \t"
    assert "".join(tokens(text)) == text
    assert tokens("a b") == ["a ", "b"]


def test_script_turns_follow_the_assistant_count() -> None:
    script = Script.model_validate(SCRIPT)
    chat: list[dict[str, Any]] = [{"role": "user", "content": "do task-7 please"}]
    first = choose_reply(script, chat)
    assert first.finish_reason == "tool_calls"
    assert [name for _, name, _ in first.tool_calls] == ["shell", "read_file"]
    assert json.loads(first.tool_calls[0][2]) == {"cmd": "ls -la /workspace"}
    chat += [{"role": "assistant", "tool_calls": []}, {"role": "tool", "content": "x"}]
    assert choose_reply(script, chat).content == "All done: two tools ran."
    chat += [{"role": "assistant", "content": "All done"}]
    assert choose_reply(script, chat).content == SCRIPT_DONE


def test_example_exchanges_before_the_task_do_not_count() -> None:
    """aider sends made-up few-shot pairs (user, assistant) before the real task message."""
    script = Script.model_validate(SCRIPT)
    chat: list[dict[str, Any]] = [
        {"role": "system", "content": "you edit files"},
        {"role": "user", "content": "Change get_factorial() to use math.factorial"},
        {"role": "assistant", "content": "Here is the change..."},
        {"role": "user", "content": "I am not sharing any files yet."},
        {"role": "assistant", "content": "Ok."},
        {"role": "user", "content": "do task-7 please"},
    ]
    assert [name for _, name, _ in choose_reply(script, chat).tool_calls] == ["shell", "read_file"]
    chat += [{"role": "assistant", "content": "ran"}, {"role": "user", "content": "and?"}]
    assert choose_reply(script, chat).content == "All done: two tools ran."


def test_echo_when_nothing_matches() -> None:
    script = Script.model_validate(SCRIPT)
    parts = [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]
    assert choose_reply(script, [{"role": "user", "content": parts}]).content == "echo: hi there"
    assert choose_reply(None, [{"role": "user", "content": "x"}]).kind == "echo"


def test_tool_call_chunks_look_like_openai() -> None:
    reply = choose_reply(Script.model_validate(SCRIPT), [{"role": "user", "content": "task-7"}])
    chunks = list(completion_chunks(reply, chat_id="c", model="m", created=0, prompt_tokens=1))
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0] == {"role": "assistant", "content": None}
    head = deltas[1]["tool_calls"][0]
    assert head["index"] == 0 and head["id"].startswith("call_") and head["type"] == "function"
    assert head["function"] == {"name": "shell", "arguments": ""}
    args = "".join(
        d["tool_calls"][0]["function"]["arguments"]
        for d in deltas
        if "tool_calls" in d and d["tool_calls"][0]["index"] == 0
    )
    assert json.loads(args) == {"cmd": "ls -la /workspace"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


# --- the server, over HTTP ---------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    tmp = tmp_path_factory.mktemp("model")
    (tmp / "script.json").write_text(json.dumps(SCRIPT))
    args = ["--listen", "127.0.0.1:0", "--log", str(tmp / "log.jsonl")]
    args += ["--script", str(tmp / "script.json"), "--require-key", "sk-world"]
    with start("model", args) as running:
        running.ready["log"] = str(tmp / "log.jsonl")
        yield running


def _base(server: Running) -> str:
    return f"http://{server.ready['listen'][0]}"


def _client(server: Running, key: str = "sk-world") -> openai.OpenAI:
    # trust_env=False: no proxy from the environment may carry test traffic elsewhere
    http = httpx2.Client(trust_env=False, timeout=10)  # the client class openai 3 takes
    return openai.OpenAI(
        base_url=_base(server) + "/v1", api_key=key, max_retries=0, http_client=http
    )


def test_ready_line(server: Running) -> None:
    assert server.ready["server"] == "model"
    assert server.ready["listen"][0].startswith("127.0.0.1:")


def test_models_and_key_check(server: Running) -> None:
    assert [m.id for m in _client(server).models.list()] == ["sg-test-model"]
    with pytest.raises(openai.AuthenticationError):
        _client(server, "sk-wrong").models.list()
    record = wait_log(server.ready["log"], lambda r: r.get("status") == 401)
    assert record["authorization"] == "Bearer sk-wrong"


def test_non_stream_completion_logs_the_key(server: Running) -> None:
    result = _client(server).chat.completions.create(
        model="m1", messages=[{"role": "user", "content": "hello world"}]
    )
    assert result.choices[0].message.content == "echo: hello world"
    assert result.usage is not None and result.usage.completion_tokens == 3
    record = wait_log(server.ready["log"], lambda r: r.get("model") == "m1")
    assert record["authorization"] == "Bearer sk-world"
    assert record["headers"]["authorization"] == "Bearer sk-world"


def test_stream_completion(server: Running) -> None:
    stream = _client(server).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "one two three"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "echo: one two three"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4


def test_tool_calls_non_stream_then_final_turn(server: Running) -> None:
    client = _client(server)
    messages: list[Any] = [{"role": "user", "content": "Please do task-7."}]
    first = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    calls = first.choices[0].message.tool_calls or []
    assert first.choices[0].finish_reason == "tool_calls"
    assert [c.function.name for c in calls] == ["shell", "read_file"]  # type: ignore[union-attr]
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages += [{"role": "tool", "tool_call_id": c.id, "content": "ok"} for c in calls]
    second = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    assert second.choices[0].message.content == "All done: two tools ran."


def test_tool_calls_streamed_are_assembled_by_the_sdk(server: Running) -> None:
    with _client(server).chat.completions.stream(
        model="m", messages=[{"role": "user", "content": "task-7"}], tools=TOOLS
    ) as stream:
        final = stream.get_final_completion()
    calls = final.choices[0].message.tool_calls or []
    assert [c.function.name for c in calls] == ["shell", "read_file"]
    assert json.loads(calls[0].function.arguments) == {"cmd": "ls -la /workspace"}
    assert json.loads(calls[1].function.arguments) == {"path": "README.md"}
    assert final.choices[0].finish_reason == "tool_calls"


def test_lockstep_with_the_sdk_acking_each_chunk(server: Running) -> None:
    stream = _client(server).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "a b c d"}],
        stream=True,
        extra_headers={"x-sg-lockstep": "1"},
    )
    seen = []
    with httpx.Client(base_url=_base(server), trust_env=False) as side:
        for n, chunk in enumerate(stream):
            sid = chunk.id.removeprefix("chatcmpl-")
            seen.append(chunk.choices[0].delta.content or "")
            assert side.post(f"/lockstep/{sid}/ack/{n}").status_code == 200
        status = side.get(f"/lockstep/{sid}").json()
    assert "".join(seen) == "echo: a b c d"
    assert status["done"] and status["acked"] == len(seen) - 1


def _lines(resp: httpx.Response, out: queue.Queue[str]) -> None:
    try:
        for line in resp.iter_lines():
            if line:
                out.put(line)
    except httpx.HTTPError:
        pass  # the test closed the response


def test_lockstep_waits_for_each_ack(server: Running) -> None:
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "x y"}]}
    headers = {"authorization": "Bearer sk-world", "x-sg-lockstep": "1", "x-sg-lockstep-id": "t1"}
    lines: queue.Queue[str] = queue.Queue()
    with (
        httpx.Client(base_url=_base(server), timeout=10, trust_env=False) as client,
        client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as resp,
    ):
        assert resp.headers["x-sg-lockstep-id"] == "t1"
        threading.Thread(target=_lines, args=(resp, lines), daemon=True).start()
        first = json.loads(lines.get(timeout=5).removeprefix("data: "))
        assert first["id"] == "chatcmpl-t1"
        with pytest.raises(queue.Empty):  # no ack, no second event
            lines.get(timeout=0.4)
        with httpx.Client(base_url=_base(server), trust_env=False) as side:
            assert side.get("/lockstep/t1").json()["sent"] == 1
            assert side.post("/lockstep/t1/ack/1").status_code == 409  # not written yet
            assert side.post("/lockstep/t1/ack/0").status_code == 200
            second = json.loads(lines.get(timeout=5).removeprefix("data: "))
            assert second["choices"][0]["delta"] == {"content": "echo: "}
            n = 1
            while True:
                assert side.post(f"/lockstep/t1/ack/{n}").status_code == 200
                if (line := lines.get(timeout=5)) == "data: [DONE]":
                    break
                assert line.startswith("data: {")
                n += 1
            assert side.get("/lockstep/t1").json()["done"]
    assert any(r.get("event") == "lockstep_ack" for r in read_log(server.ready["log"]))


def test_bad_request_and_unknown_route(server: Running) -> None:
    with httpx.Client(
        base_url=_base(server), headers={"authorization": "Bearer sk-world"}, trust_env=False
    ) as c:
        assert c.post("/v1/chat/completions", content=b"{nope").status_code == 400
        assert c.post("/v1/chat/completions", json={"messages": "x"}).status_code == 400
        assert c.get("/v1/nothing").status_code == 404
        assert c.get("/health").json() == {"ok": True}


def test_lockstep_gives_up_without_acks_and_exits_on_sigterm(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    args = ["--listen", "127.0.0.1:0", "--lockstep", "--lockstep-timeout", "0.3", "--log", str(log)]
    with start("model", args) as running:
        body = {"stream": True, "messages": [{"role": "user", "content": "a b c"}]}
        url = f"http://{running.ready['listen'][0]}/v1/chat/completions"
        with httpx.Client(trust_env=False, timeout=5) as client:
            lines = [ln for ln in client.post(url, json=body).text.splitlines() if ln]
        assert len(lines) == 1  # event 0 only: no ack came, so nothing more and no [DONE]
        assert wait_log(log, lambda r: r["event"] == "lockstep_timeout")["waiting_for"] == 0
        assert running.stop() == 0
