"""The test world's model server when it is a real model: llama.cpp behind a metering relay.

    python -m sandgate.world.servers.llmrelay --config relay.json --log model.jsonl

``{"listen": ["10.77.0.10:8000"], "upstream": ["ARGV", "..."], "upstream_port": 8001,
"start_timeout": 180}``: the relay starts the upstream (world/llm.py's ``server_argv``, on
127.0.0.1 of the same namespace) as its child, waits until it answers ``/v1/models``, prints
READY, and forwards every ``/v1/...`` request to it. Each request gets the model server's log
line (httpio's common fields; for completions ``model``, ``stream``, ``messages``,
``prompt_tokens``/``completion_tokens`` where the upstream reports ``usage``, and for a
stream meter.py's ``first_token_ms``, ``gaps_ms``, ``chunks``, ``aborted``).

llama-cpp-python's function-calling chat format cannot stream a reply when the model may
choose a tool ("Automatic streaming tool choice is not supported"), so a streamed request that
carries ``tools`` is asked upstream unstreamed and its answer sent on as SSE chunks (content,
then each tool call), as an OpenAI server would stream it. A stream the upstream stops before
``data: [DONE]`` (or that breaks) is cut off and logged ``aborted``; the session reports it.
SIGTERM stops the upstream too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field

from sandgate.world.servers.httpio import Request, Response, bound_addrs, json_response, start_http
from sandgate.world.servers.meter import timed_stream
from sandgate.world.servers.runtime import (
    JsonLog,
    announce_ready,
    close_servers,
    merged_config,
    parse_addr,
    run,
)

__all__ = ["RelayConfig", "main", "sse_from_completion"]

_HOP = {"host", "content-length", "connection", "transfer-encoding", "keep-alive", "upgrade"}


class RelayConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    listen: list[str] = Field(min_length=1)
    upstream: list[str] = Field(min_length=1)  # argv of the OpenAI-compatible server
    upstream_port: int = 8001
    start_timeout: float = 180.0
    log: str | None = None


def sse_from_completion(result: dict[str, Any]) -> list[bytes]:
    """A ``chat.completion`` as the SSE events of its stream (one content chunk, then one
    chunk per tool call, then the finish chunk with usage, then [DONE])."""
    base = {k: result.get(k) for k in ("id", "created", "model")}
    base["object"] = "chat.completion.chunk"
    choice = (result.get("choices") or [{}])[0]
    message = choice.get("message") or {}

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        body = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return b"data: " + json.dumps({**body, **extra}).encode() + b"\n\n"

    out = [chunk({"role": "assistant", "content": message.get("content") or ""})]
    for i, call in enumerate(message.get("tool_calls") or []):
        out.append(chunk({"tool_calls": [{"index": i, **call}]}))
    usage = {"usage": result["usage"]} if result.get("usage") else {}
    out.append(chunk({}, choice.get("finish_reason") or "stop", **usage))
    return [*out, b"data: [DONE]\n\n"]


class Relay:
    def __init__(self, config: RelayConfig, client: httpx.AsyncClient) -> None:
        self.config = config
        self.client = client

    async def handle(self, req: Request) -> Response:
        if req.path == "/health":
            return json_response(200, {"ok": True})
        if not req.path.startswith("/v1/"):
            return json_response(404, {"error": {"message": f"no route for {req.path}"}})
        body = await req.body()
        headers = [(k, v) for k, v in req.headers if k.lower() not in _HOP]
        log: dict[str, Any] = {}
        payload: dict[str, Any] = {}
        if req.path.endswith("/chat/completions") and req.method == "POST":
            with contextlib.suppress(ValueError):
                payload = json.loads(body)
            if isinstance(payload, dict):
                msgs = payload.get("messages")
                log.update(
                    model=payload.get("model"),
                    stream=bool(payload.get("stream")),
                    messages=len(msgs) if isinstance(msgs, list) else None,
                    tools=len(payload.get("tools") or []),
                )
        started = time.monotonic()
        if log.get("stream") and log.get("tools"):
            return await self._restream(req, payload, headers, log, started)
        upstream = self.client.build_request(req.method, req.target, headers=headers, content=body)
        try:
            resp = await self.client.send(upstream, stream=True)
        except httpx.HTTPError as exc:
            return self._down(exc, log)
        out_headers = [(k, v) for k, v in resp.headers.items() if k.lower() not in _HOP]
        if not log.get("stream"):
            data = await resp.aread()
            await resp.aclose()
            self._usage(data, log)
            r = Response(resp.status_code, out_headers, data)
            r.log.update(log)
            return r
        r = Response(resp.status_code, out_headers)
        r.log.update(log)
        r.body = timed_stream(self._relay_stream(resp, r.log), r.log, started)
        return r

    async def _relay_stream(
        self, resp: httpx.Response, log: dict[str, Any]
    ) -> AsyncIterator[bytes]:
        done, tail = False, b""
        try:
            async for data in resp.aiter_raw():
                tail = (tail + data)[-4096:]
                if b"data: [DONE]" in tail:
                    done = True
                for line in data.split(b"\n"):  # a usage chunk, if the upstream sends one
                    if line.startswith(b"data: {") and b'"usage"' in line:
                        self._usage(line[6:], log)
                yield data
        except httpx.HTTPError as exc:
            log["upstream_error"] = type(exc).__name__
        except GeneratorExit:  # the client left: not the model server's failure
            log["client_left"] = done = True
            raise
        finally:
            await resp.aclose()
            log["aborted"] = not done

    async def _restream(
        self, req: Request, payload: dict[str, Any], headers: list[tuple[str, str]],
        log: dict[str, Any], started: float,
    ) -> Response:  # fmt: skip
        log["restreamed"] = True
        unstreamed = {k: v for k, v in payload.items() if k not in ("stream", "stream_options")}
        try:
            resp = await self.client.post(req.target, headers=headers, json=unstreamed)
        except httpx.HTTPError as exc:
            return self._down(exc, log)
        self._usage(resp.content, log)
        if resp.status_code != 200:
            r = Response(resp.status_code, [("content-type", "application/json")], resp.content)
            r.log.update(log)
            return r
        events = sse_from_completion(resp.json())

        async def body() -> AsyncIterator[bytes]:
            for event in events:
                yield event

        r = Response(200, [("content-type", "text/event-stream"), ("cache-control", "no-cache")])
        r.log.update(log)
        r.body = timed_stream(body(), r.log, started)
        return r

    @staticmethod
    def _usage(data: bytes, log: dict[str, Any]) -> None:
        try:
            usage = json.loads(data).get("usage")
        except (ValueError, AttributeError):
            return
        if isinstance(usage, dict):
            for key in ("prompt_tokens", "completion_tokens"):
                if isinstance(usage.get(key), int):
                    log[key] = usage[key]

    @staticmethod
    def _down(exc: Exception, log: dict[str, Any]) -> Response:
        r = json_response(502, {"error": {"message": f"the model server is down: {exc}"}})
        r.log.update(log, upstream_error=type(exc).__name__, aborted=bool(log.get("stream")))
        return r


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


async def _wait_upstream(
    client: httpx.AsyncClient, proc: subprocess.Popen[bytes], timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"llmrelay: the model server exited ({proc.returncode}) at start")
        with contextlib.suppress(httpx.HTTPError):
            if (await client.get("/v1/models", timeout=2)).status_code == 200:
                return
        await asyncio.sleep(0.3)
    raise SystemExit(f"llmrelay: the model server did not answer within {timeout:g} s")


async def serve(config: RelayConfig, stop: asyncio.Event) -> None:
    log = JsonLog(config.log, "model")
    proc = subprocess.Popen(
        config.upstream, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        # a relay that is killed takes the model server along (no thread runs yet)
        preexec_fn=_die_with_parent,  # noqa: PLW1509
    )  # fmt: skip
    base = f"http://127.0.0.1:{config.upstream_port}"
    try:
        timeout = httpx.Timeout(600, connect=5)
        async with httpx.AsyncClient(base_url=base, timeout=timeout, trust_env=False) as client:
            waiting = asyncio.ensure_future(_wait_upstream(client, proc, config.start_timeout))
            stopping = asyncio.ensure_future(stop.wait())
            await asyncio.wait({waiting, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if not waiting.done():  # SIGTERM while the model loads
                waiting.cancel()
                return
            waiting.result()
            relay = Relay(config, client)
            servers = await start_http(
                [parse_addr(a, 8000) for a in config.listen], relay.handle, log
            )
            listen = bound_addrs(servers)
            log.write("ready", listen=listen, upstream=base)
            announce_ready("llmrelay", listen=listen, upstream=base, pid_upstream=proc.pid)
            await stop.wait()
            await close_servers(servers)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()


def parse_args(argv: list[str] | None = None) -> RelayConfig:
    p = argparse.ArgumentParser(prog="python -m sandgate.world.servers.llmrelay")
    p.add_argument("--config", help="JSON file with the settings")
    p.add_argument("--listen", action="append", help="HOST[:PORT], repeatable (port 8000)")
    p.add_argument("--log", help="JSON-lines log file")
    return RelayConfig.model_validate(merged_config(p.parse_args(argv)))


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    return run(lambda stop: serve(config, stop))


if __name__ == "__main__":
    raise SystemExit(main())
