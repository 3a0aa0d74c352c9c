"""The model server's pure half: pick a reply for a chat, render it as OpenAI JSON.

Script file (`--script FILE.json`) schema::

    {
      "conversations": [
        {"match": "task-42",                      # substring of a user message
         "turns": [                               # turn k answers a chat holding k assistant turns
           {"tool_calls": [{"name": "shell", "arguments": {"cmd": "ls"}}]},
           {"content": "All done."}
         ]}
      ],
      "default": {"content": "..."}               # optional; otherwise echo
    }

A turn has `content` (string or null) and/or `tool_calls` (each `name`, `arguments` as
object or JSON string, optional `id`), and optionally `finish_reason`. The first
conversation whose `match` occurs in a user message wins (the first such message: a framework
may send made-up example exchanges before the task), and its turn k answers a chat holding k
assistant turns after that message; once its turns are used up the reply is `SCRIPT_DONE`.
With no match (or no script) the reply echoes the last user message: `echo: <text>`.
Everything here is deterministic except `created` and ids.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = [
    "SCRIPT_DONE",
    "Reply",
    "Script",
    "ToolCall",
    "choose_reply",
    "completion",
    "completion_chunks",
    "count_tokens",
    "tokens",
]

SCRIPT_DONE = "[sg-model] script finished"
_TOKEN = re.compile(r"\S+\s*|\s+")
_ARG_PIECE = 12  # OpenAI streams tool-call arguments in short fragments; so do we


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    arguments: dict[str, Any] | str = "{}"
    id: str | None = None

    def arguments_json(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments, separators=(",", ":"))


class Turn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    content: str | None = None
    tool_calls: list[ToolCall] = []
    finish_reason: str | None = None


class Conversation(BaseModel):
    model_config = ConfigDict(extra="forbid")
    match: str
    turns: list[Turn]


class Script(BaseModel):
    model_config = ConfigDict(extra="forbid")
    conversations: list[Conversation] = []
    default: Turn | None = None


@dataclass(frozen=True)
class Reply:
    content: str | None
    tool_calls: list[tuple[str, str, str]] = field(default_factory=list)  # (id, name, args)
    finish_reason: str = "stop"
    match: str | None = None  # which conversation answered, for the log
    turn: int | None = None
    kind: str = "echo"  # "echo", "script", "default" or "done", for the log


def tokens(text: str) -> list[str]:
    """Words with their trailing whitespace: joining them gives `text` back."""
    return _TOKEN.findall(text)


def _text(content: Any) -> str:
    # content is a string, or a list of parts of which the "text" ones count
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def count_tokens(messages: list[dict[str, Any]]) -> int:
    return sum(len(tokens(_text(m.get("content")))) for m in messages if isinstance(m, dict))


def _call_id(match: str, turn: int, index: int) -> str:
    digest = hashlib.sha256(f"{match}\0{turn}\0{index}".encode()).hexdigest()
    return f"call_{digest[:24]}"


def _from_turn(turn: Turn, match: str | None, number: int | None, kind: str) -> Reply:
    calls = [
        (tc.id or _call_id(match or "", number or 0, i), tc.name, tc.arguments_json())
        for i, tc in enumerate(turn.tool_calls)
    ]
    finish = turn.finish_reason or ("tool_calls" if calls else "stop")
    content = turn.content if turn.content is not None or calls else ""
    return Reply(content, calls, finish, match, number, kind)


def _first_user_with(messages: list[dict[str, Any]], match: str) -> int | None:
    for i, m in enumerate(messages):
        if m.get("role") == "user" and match in _text(m.get("content")):
            return i
    return None


def choose_reply(script: Script | None, messages: list[dict[str, Any]]) -> Reply:
    """The scripted (or echoed) assistant turn that answers `messages`."""
    users = [_text(m.get("content")) for m in messages if m.get("role") == "user"]
    if script is not None and users:
        for conv in script.conversations:
            start = _first_user_with(messages, conv.match)
            if start is not None:
                # only turns after the task's message count: a framework may put made-up
                # example exchanges before it (aider's few-shot "user"/"assistant" pairs)
                assistant_turns = sum(1 for m in messages[start:] if m.get("role") == "assistant")
                if assistant_turns >= len(conv.turns):
                    return Reply(SCRIPT_DONE, match=conv.match, turn=assistant_turns, kind="done")
                turn = conv.turns[assistant_turns]
                return _from_turn(turn, conv.match, assistant_turns, "script")
        if script.default is not None:
            return _from_turn(script.default, None, None, "default")
    return Reply(f"echo: {users[-1] if users else ''}")


def _usage(prompt: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt + completion_tokens,
    }


def reply_tokens(reply: Reply) -> int:
    return len(tokens(reply.content or "")) + sum(
        len(_pieces(args)) for _, _, args in reply.tool_calls
    )


def completion(
    reply: Reply, *, chat_id: str, model: str, created: int, prompt_tokens: int
) -> dict[str, Any]:
    """A non-streamed `chat.completion` object."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content, "refusal": None}
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
            for cid, name, args in reply.tool_calls
        ]
    return {
        "id": chat_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": reply.finish_reason}
        ],
        "usage": _usage(prompt_tokens, reply_tokens(reply)),
    }


def _pieces(text: str) -> list[str]:
    return [text[i : i + _ARG_PIECE] for i in range(0, len(text), _ARG_PIECE)] or [""]


def completion_chunks(
    reply: Reply,
    *,
    chat_id: str,
    model: str,
    created: int,
    prompt_tokens: int,
    include_usage: bool = False,
) -> Iterator[dict[str, Any]]:
    """The `chat.completion.chunk` objects of a streamed reply, one token per chunk.

    First a role chunk, then content tokens, then per tool call a chunk with index, id,
    type and name (arguments "") followed by argument fragments, then a chunk with only
    `finish_reason`, then (if asked for) a usage chunk with empty `choices`.
    """
    usage_field: dict[str, Any] = {"usage": None} if include_usage else {}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": chat_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "system_fingerprint": None,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
            **usage_field,
        }

    first: dict[str, Any] = {"role": "assistant", "content": "" if reply.content else None}
    yield chunk(first)
    for token in tokens(reply.content or ""):
        yield chunk({"content": token})
    for index, (cid, name, args) in enumerate(reply.tool_calls):
        head = {"index": index, "id": cid, "type": "function"}
        yield chunk({"tool_calls": [{**head, "function": {"name": name, "arguments": ""}}]})
        for piece in _pieces(args):
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    yield chunk({}, reply.finish_reason)
    if include_usage:
        yield {
            "id": chat_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "system_fingerprint": None,
            "choices": [],
            "usage": _usage(prompt_tokens, reply_tokens(reply)),
        }
