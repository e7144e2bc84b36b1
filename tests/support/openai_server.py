"""A local OpenAI-compatible chat-completions and embeddings server for tests.

The real ``openai`` client talks to it over HTTP, so requests go through the same code
path as production. Tests script the replies and read back what the server received.
"""

from __future__ import annotations

import base64
import json
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Generic, Protocol, TypeVar

from tests.support.embedding_vectors import DIMENSION, term_vector

# A reply is the assistant message content, or a callable that builds it (or an error) from the request body.
Reply = str | Callable[[dict[str, Any]], "str | ScriptedError"]
# Seconds to wait before answering: fixed, or computed from the request body (slow or timing-out endpoints).
Delay = float | Callable[[dict[str, Any]], float]


@dataclass
class ScriptedError:
    """Answer one request with an HTTP error instead of a completion."""

    status: int
    message: str = "scripted error"
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class OpenAIStubServer:
    """State shared between the test and the handler thread."""

    base_url: str = ""
    requests: list[dict[str, Any]] = field(default_factory=list)
    default_reply: Reply | None = None
    delay: Delay = 0.0
    embedding_requests: list[dict[str, Any]] = field(default_factory=list)
    embedding_dimension: int = DIMENSION
    embedding_delay: float = 0.0
    embedding_trickle: float = 0.0
    """Seconds between the bytes of an embeddings reply: slow overall, yet no single read waits long."""
    embedding_raw: tuple[bytes, str] | None = None
    """A body and content type to answer every embeddings request with (a proxy's page, non-JSON...)."""
    _replies: deque[Reply | ScriptedError] = field(default_factory=deque)
    _embedding_failure: ScriptedError | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def fail_embeddings(self, status: int | None) -> None:
        """Answer every embeddings request with ``status`` from now on (``None``: answer again)."""
        with self._lock:
            self._embedding_failure = None if status is None else ScriptedError(status, "embeddings down")

    def embeddings(self, body: dict[str, Any]) -> list[list[float]] | ScriptedError:
        """The inputs' vectors (``embedding_vectors.term_vector``), or the scripted failure."""
        with self._lock:
            self.embedding_requests.append(body)
            if self._embedding_failure is not None:
                return self._embedding_failure
        raw = body.get("input", [])
        texts = [raw] if isinstance(raw, str) else list(raw)
        return [term_vector(str(text), self.embedding_dimension) for text in texts]

    def script(self, *replies: Reply | ScriptedError) -> None:
        """Queue replies, consumed one per request in order; then ``default_reply`` applies."""
        with self._lock:
            self._replies.extend(replies)

    def next_reply(self, body: dict[str, Any]) -> Reply | ScriptedError:
        with self._lock:
            self.requests.append(body)
            if self._replies:
                return self._replies.popleft()
        if self.default_reply is None:
            return ScriptedError(500, "no scripted reply left")
        return self.default_reply

    def prompts(self) -> list[str]:
        """The user-visible text of every request received, in order."""
        with self._lock:
            return [
                "\n".join(str(message.get("content", "")) for message in body.get("messages", []))
                for body in self.requests
            ]


def _make_handler(state: OpenAIStubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        disable_nagle_algorithm = True
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            """Keep pytest output clean."""

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"{}")
            if self.path.rstrip("/").endswith("/embeddings"):
                self._embeddings(body)
                return
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._send(404, {"error": {"message": f"unknown path {self.path}"}})
                return
            reply = state.next_reply(body)
            delay = state.delay(body) if callable(state.delay) else state.delay
            if delay > 0:
                time.sleep(delay)
            content = reply(body) if callable(reply) else reply
            if isinstance(content, ScriptedError):
                error = {"error": {"message": content.message, "type": "scripted"}}
                self._send(content.status, error, content.headers)
                return
            self._send(
                200,
                {
                    "id": "chatcmpl-test",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": body.get("model", "test-model"),
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": content},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                },
            )

        def _embeddings(self, body: dict[str, Any]) -> None:
            vectors = state.embeddings(body)
            if state.embedding_delay > 0:
                time.sleep(state.embedding_delay)
            if isinstance(vectors, ScriptedError):
                self._send(vectors.status, {"error": {"message": vectors.message, "type": "scripted"}})
                return
            if state.embedding_raw is not None:
                self._send_bytes(200, *state.embedding_raw)
                return
            data = [
                {
                    "object": "embedding",
                    "index": index,
                    "embedding": (
                        base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
                        if body.get("encoding_format") == "base64"
                        else vector
                    ),
                }
                for index, vector in enumerate(vectors)
            ]
            usage = {"prompt_tokens": 1, "total_tokens": 1}
            reply = {"object": "list", "data": data, "model": body.get("model", ""), "usage": usage}
            self._send(200, reply, trickle=state.embedding_trickle)

        def _send(
            self,
            status: int,
            payload: dict[str, Any],
            headers: dict[str, str] | None = None,
            *,
            trickle: float = 0.0,
        ) -> None:
            data = json.dumps(payload).encode("utf-8")
            self._send_bytes(status, data, "application/json", headers, trickle=trickle)

        def _send_bytes(
            self,
            status: int,
            data: bytes,
            content_type: str,
            headers: dict[str, str] | None = None,
            *,
            trickle: float = 0.0,
        ) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            try:
                self.end_headers()
                if trickle > 0:
                    for start in range(0, len(data), 64):
                        self.wfile.write(data[start : start + 64])
                        self.wfile.flush()
                        time.sleep(trickle)
                else:
                    self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                # The client gave up (its timeout) or died (a SIGKILLed gateway) while we waited.
                self.close_connection = True

    return Handler


class _HasBaseUrl(Protocol):
    base_url: str


StubState = TypeVar("StubState", bound=_HasBaseUrl)


class ServedStub(Generic[StubState]):
    """Context manager that serves a stub's ``state`` with ``handler`` on an ephemeral loopback port."""

    def __init__(self, state: StubState, handler: type[BaseHTTPRequestHandler]) -> None:
        self.state = state
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        host, port = self._server.server_address[:2]
        state.base_url = f"http://{host!s}:{port}/v1"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def __enter__(self) -> StubState:
        self._thread.start()
        return self.state

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class RunningServer(ServedStub[OpenAIStubServer]):
    """Serves an ``OpenAIStubServer`` on an ephemeral loopback port."""

    def __init__(self) -> None:
        state = OpenAIStubServer()
        super().__init__(state, _make_handler(state))
