"""A local rerank endpoint (``POST .../rerank``, the Cohere/Jina shape) for tests.

memstore's rerank client talks to it over real HTTP. By default it scores each document by the
query words it contains (so the order is decidable by hand); tests can script a status, a raw
body, a delay or a scoring function, and read back what the server received.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.support.openai_server import ServedStub

_WORD = re.compile(r"\w+")


def shared_words(query: str, document: str) -> float:
    """How many distinct words of ``query`` appear in ``document`` (case-insensitive)."""
    wanted = set(_WORD.findall(query.casefold()))
    return float(len(wanted & set(_WORD.findall(document.casefold()))))


@dataclass
class RerankStubServer:
    """State shared between the test and the handler thread."""

    base_url: str = ""
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    score: Callable[[str, str], float] = shared_words
    delay: float = 0.0
    status: int = 200
    raw: bytes | None = None
    """A body to answer with instead of the scores (malformed replies)."""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, body: dict[str, Any], headers: dict[str, str]) -> None:
        with self._lock:
            self.requests.append(body)
            self.headers.append(headers)


def _make_handler(state: RerankStubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        disable_nagle_algorithm = True
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            """Keep pytest output clean."""

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"{}")
            state.record(body, {name.lower(): value for name, value in self.headers.items()})
            if state.delay > 0:
                time.sleep(state.delay)
            if not self.path.rstrip("/").endswith("/rerank"):
                self._send(404, b'{"error": "unknown path"}')
            elif state.status != 200:
                self._send(state.status, b'{"error": "scripted"}')
            elif state.raw is not None:
                self._send(200, state.raw)
            else:
                documents = body.get("documents", [])
                results = [
                    {"index": index, "relevance_score": state.score(body.get("query", ""), document)}
                    for index, document in enumerate(documents)
                ]
                results.sort(key=lambda item: -item["relevance_score"])
                top = body.get("top_n") or len(results)
                reply = {"id": "rerank-test", "results": results[:top]}
                self._send(200, json.dumps(reply).encode("utf-8"))

        def _send(self, status: int, data: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            try:
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client gave up (its timeout)

    return Handler


class RunningRerankServer(ServedStub[RerankStubServer]):
    """Serves a ``RerankStubServer`` on an ephemeral loopback port."""

    def __init__(self) -> None:
        state = RerankStubServer()
        super().__init__(state, _make_handler(state))
