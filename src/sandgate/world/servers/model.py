"""An OpenAI-compatible model server for the test world (plain HTTP, usually port 8000).

    python -m sandgate.world.servers.model --listen 10.77.0.10:8000 --log model.jsonl \\
        [--model NAME] [--token-delay-ms N] [--lockstep] [--lockstep-timeout S] \\
        [--require-key KEY ...] [--script FILE.json] [--log-bodies] [--config FILE.json]

`--config` holds the same settings as JSON (`{"listen": ["10.77.0.10:8000"],
"token_delay_ms": 5, "require_key": ["sk-test"], "script": "s.json" or {...}, ...}`);
flags win over the file. `--listen HOST` without a port means port 8000; port 0 picks a
free port. Once listening it prints `READY {"server": "model", "pid": N, "listen":
["10.77.0.10:8000"], "model": NAME}` and runs until SIGTERM.

Endpoints: `GET /v1/models`, `GET /v1/models/<id>`, `POST /v1/chat/completions` (with
`"stream": true` as SSE of `chat.completion.chunk` objects ending in `data: [DONE]`, and
`stream_options.include_usage`), `GET /health`, and the lock-step side channel
`/lockstep/...` (see `lockstep.py`: a stream is lock-step when the request carries
`x-sg-lockstep: 1` or the server runs with `--lockstep`; its id is in the response header
`x-sg-lockstep-id` and in every chunk's `id`, `chatcmpl-<stream id>`).

Log lines (`--log`): one `request` event per HTTP request with the common fields of
`httpio.log_request` (including every request header, so `headers.authorization`) plus,
for completions, `authorization`, `model`, `stream`, `lockstep`, `lockstep_id`,
`messages`, `reply` ("echo"/"script"/"done"), `match`, `turn`, `prompt_tokens`,
`completion_tokens`, and for a stream `first_token_ms`, `gaps_ms`, `chunks` (meter.py);
with `--log-bodies` also
`body` (the request JSON). Lock-step acks log `lockstep_ack`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import shutil
import ssl
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sandgate.gateway.proxy.ca import CA, write_pair
from sandgate.world.servers.chatwire import (
    Script,
    choose_reply,
    completion,
    completion_chunks,
    count_tokens,
)
from sandgate.world.servers.httpio import (
    Request,
    Response,
    bound_addrs,
    json_response,
    start_http,
)
from sandgate.world.servers.lockstep import ID_HEADER, LockstepRegistry, sse_event
from sandgate.world.servers.meter import timed_stream
from sandgate.world.servers.runtime import (
    JsonLog,
    announce_ready,
    close_servers,
    merged_config,
    parse_addr,
    run,
)

__all__ = ["ModelConfig", "ModelServer", "main"]

DEFAULT_PORT = 8000


class ModelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    listen: list[str] = Field(min_length=1)
    # HTTPS listeners (e.g. the test world's api.openai.com), with a leaf from the CA in ca_dir.
    tls_listen: list[str] = []
    tls_names: list[str] = []
    ca_dir: str | None = None
    log: str | None = None
    model: str = "sg-test-model"
    token_delay_ms: float = 0.0
    lockstep: bool = False
    lockstep_timeout: float = 30.0
    require_key: list[str] = []
    script: Script | str | None = None
    log_bodies: bool = False

    def load_script(self) -> Script | None:
        if isinstance(self.script, str):
            return Script.model_validate_json(Path(self.script).read_text(encoding="utf-8"))
        return self.script


def _error(status: int, message: str, code: str | None = None) -> Response:
    kind = "invalid_request_error" if status < 500 else "server_error"
    payload = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return json_response(status, payload)


class ModelServer:
    def __init__(self, config: ModelConfig, log: JsonLog) -> None:
        self.config = config
        self.log = log
        self.script = config.load_script()
        self.lockstep = LockstepRegistry(log, config.lockstep_timeout)
        self.delay = config.token_delay_ms / 1000.0

    async def handle(self, req: Request) -> Response:
        if (resp := self.lockstep.handle(req)) is not None:
            return resp
        if req.path == "/health":
            return json_response(200, {"ok": True})
        if not req.path.startswith("/v1/"):
            return _error(404, f"no route for {req.path}")
        auth = req.header("authorization")
        if self.config.require_key and auth not in {f"Bearer {k}" for k in self.config.require_key}:
            resp = _error(401, "Incorrect API key provided", "invalid_api_key")
            resp.log["authorization"] = auth
            return resp
        if req.path == "/v1/models" and req.method == "GET":
            return json_response(200, {"object": "list", "data": [self._model_obj()]})
        if req.path == f"/v1/models/{self.config.model}" and req.method == "GET":
            return json_response(200, self._model_obj())
        if req.path == "/v1/chat/completions" and req.method == "POST":
            resp = await self._chat(req)
            resp.log["authorization"] = auth
            return resp
        return _error(404, f"no route for {req.method} {req.path}")

    def _model_obj(self) -> dict[str, Any]:
        return {"id": self.config.model, "object": "model", "created": 0, "owned_by": "sandgate"}

    async def _chat(self, req: Request) -> Response:
        started = time.monotonic()
        try:
            body = json.loads(await req.body())
        except ValueError:
            return _error(400, "request body is not JSON")
        messages = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            return _error(400, "'messages' must be a list of objects", "invalid_messages")
        reply = choose_reply(self.script, messages)
        model = str(body.get("model") or self.config.model)
        stream = bool(body.get("stream"))
        lockstep = stream and (self.config.lockstep or req.header("x-sg-lockstep") == "1")
        log: dict[str, Any] = {
            "model": model,
            "stream": stream,
            "lockstep": lockstep,
            "messages": len(messages),
            "reply": reply.kind,
            "match": reply.match,
            "turn": reply.turn,
        }
        if self.config.log_bodies:
            log["body"] = body
        created, prompt_tokens = int(time.time()), count_tokens(messages)
        usage = completion(
            reply, chat_id="", model=model, created=created, prompt_tokens=prompt_tokens
        )["usage"]
        log["prompt_tokens"] = usage["prompt_tokens"]  # meter.py: the session's model use
        log["completion_tokens"] = usage["completion_tokens"]
        if not stream:
            chat_id = f"chatcmpl-{secrets.token_hex(12)}"
            result = completion(
                reply, chat_id=chat_id, model=model, created=created, prompt_tokens=prompt_tokens
            )
            if self.delay:
                await asyncio.sleep(self.delay * result["usage"]["completion_tokens"])
            resp = json_response(200, result)
            resp.log.update(log)
            return resp
        ls_stream = self.lockstep.open(req) if lockstep else None
        chat_id = f"chatcmpl-{ls_stream.id if ls_stream else secrets.token_hex(12)}"
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        chunks = completion_chunks(
            reply,
            chat_id=chat_id,
            model=model,
            created=created,
            prompt_tokens=prompt_tokens,
            include_usage=include_usage,
        )
        events = [sse_event(json.dumps(c, separators=(",", ":"))) for c in chunks]
        events.append(sse_event("[DONE]"))
        headers = [
            ("content-type", "text/event-stream; charset=utf-8"),
            ("cache-control", "no-cache"),
            ("x-accel-buffering", "no"),
        ]
        if ls_stream is not None:
            headers.append((ID_HEADER, ls_stream.id))
            log["lockstep_id"] = ls_stream.id
        resp = Response(200, headers)
        resp.log.update(log)
        resp.body = timed_stream(
            self.lockstep.events(ls_stream, events, self.delay), resp.log, started
        )
        return resp


def parse_args(argv: list[str] | None = None) -> ModelConfig:
    p = argparse.ArgumentParser(prog="python -m sandgate.world.servers.model")
    p.add_argument("--config", help="JSON file with the settings below")
    p.add_argument("--listen", action="append", help="HOST[:PORT], repeatable (port 8000)")
    p.add_argument("--log", help="JSON-lines log file")
    p.add_argument("--model", help="model id to report")
    p.add_argument("--token-delay-ms", type=float, help="pause before each streamed event")
    p.add_argument("--lockstep", action="store_true", default=None, help="all streams lock-step")
    p.add_argument("--lockstep-timeout", type=float, help="seconds to wait for an ack")
    p.add_argument("--require-key", action="append", help="accept only Bearer KEY (repeatable)")
    p.add_argument("--script", help="scripted replies, JSON (see chatwire.py)")
    p.add_argument("--log-bodies", action="store_true", default=None, help="log request JSON")
    return ModelConfig.model_validate(merged_config(p.parse_args(argv)))


async def serve(config: ModelConfig, stop: asyncio.Event) -> None:
    log = JsonLog(config.log, "model")
    server = ModelServer(config, log)
    addrs = [parse_addr(a, DEFAULT_PORT) for a in config.listen]
    servers = await start_http(addrs, server.handle, log)
    if config.tls_listen:
        servers += await start_http(
            [parse_addr(a, 443) for a in config.tls_listen], server.handle, log, _tls(config)
        )
    listen = bound_addrs(servers)
    log.write("ready", listen=listen)
    announce_ready("model", listen=listen, model=config.model)
    await stop.wait()
    await close_servers(servers)
    log.close()


def _tls(config: ModelConfig) -> ssl.SSLContext:
    if not config.ca_dir:
        raise SystemExit("model server: tls_listen needs ca_dir")
    ca = CA.load(config.ca_dir)
    ips = [parse_addr(a, 443)[0] for a in config.tls_listen]
    cert_pem, key_pem = ca.issue(config.tls_names, ips)
    folder = Path(tempfile.mkdtemp(prefix="sg-model-tls-"))
    cert, key = write_pair(folder, "leaf", cert_pem + ca.cert_pem, key_pem)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    ctx.set_alpn_protocols(["http/1.1"])
    shutil.rmtree(folder)
    return ctx


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    return run(lambda stop: serve(config, stop))


if __name__ == "__main__":
    raise SystemExit(main())
