"""A local OpenAI-compatible chat-completions server whose scripted replies may call tools.

``OpenAIStubServer`` answers with text only; an agent that uses tools needs assistant messages
with ``tool_calls``. A scripted turn is an assistant message, or a callable that builds one from
the request body (so a turn can use what an earlier tool answered, such as a document's version).
The real ``openai`` client (through ``langchain_openai.ChatOpenAI``) talks to it over HTTP.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.support.openai_server import ServedStub

Message = dict[str, Any]
Turn = Message | Callable[[dict[str, Any]], Message]
_call_ids = itertools.count(1)


def say(text: str) -> Message:
    return {"role": "assistant", "content": text}


def call(name: str, **arguments: Any) -> Message:
    """An assistant message calling one tool with ``arguments``."""
    function = {"name": name, "arguments": json.dumps(arguments)}
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": f"call_{next(_call_ids)}", "type": "function", "function": function}],
    }


def tool_results(body: dict[str, Any]) -> list[str]:
    """The text of every tool message in a request, oldest first."""
    return [str(message["content"]) for message in body["messages"] if message["role"] == "tool"]


def system_prompt(body: dict[str, Any]) -> str:
    first = body["messages"][0]
    assert first["role"] == "system", first
    return str(first["content"])


@dataclass
class ToolCallingStub:
    base_url: str = ""
    requests: list[dict[str, Any]] = field(default_factory=list)
    _turns: deque[Turn] = field(default_factory=deque)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def script(self, *turns: Turn) -> None:
        """Queue turns, one per request in order; a request past the last one gets a 500."""
        with self._lock:
            self._turns.extend(turns)

    def next_message(self, body: dict[str, Any]) -> Message | None:
        with self._lock:
            self.requests.append(body)
            turn = self._turns.popleft() if self._turns else None
        return turn(body) if callable(turn) else turn


def _handler(state: ToolCallingStub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            """Keep pytest output clean."""

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
            message = state.next_message(body) if self.path.endswith("/chat/completions") else None
            if message is None:
                self._send(500, {"error": {"message": "no scripted turn left", "type": "scripted"}})
                return
            choice = {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
            }
            self._send(
                200,
                {
                    "id": "chatcmpl-tools",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": body.get("model", "test-model"),
                    "choices": [choice],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                },
            )

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


@contextmanager
def running_tool_stub() -> Iterator[ToolCallingStub]:
    state = ToolCallingStub()
    with ServedStub(state, _handler(state)) as served:
        yield served
