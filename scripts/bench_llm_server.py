#!/usr/bin/env python3
"""A stand-in LLM endpoint for the queue benchmark: OpenAI-compatible, it answers after a set delay.

It runs as its own process, so its threads take no CPU time or GIL from the measured workers. The
delay is part of the base URL (``http://127.0.0.1:PORT/d1000/v1`` answers after 1000 ms), so one
server serves every variant. Each reply is a valid memory update that adds one fact naming the
conversation the prompt shows, so every processed conversation changes the document and saves.

    python scripts/bench_llm_server.py    # prints "port N", serves until stdin closes
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_PATH = re.compile(r"^/d(\d+)/v1/chat/completions/?$")
MARKER = "bench conversation"
_MARKER = re.compile(MARKER + r" ([\w.-]+)")


def memory_update(body: dict[str, Any]) -> str:
    """One new fact per conversation, taken from the marker inside the prompt's conversation."""
    prompt = "\n".join(str(message.get("content", "")) for message in body.get("messages", []))
    found = _MARKER.search(prompt.split("<conversation>", 1)[-1])
    name = found.group(1) if found else "unknown"
    fact = {
        "content": f"The user of {MARKER} {name} keeps meeting notes in Markdown files",
        "category": "preference",
        "confidence": 0.9,
    }
    return json.dumps({"user": {}, "history": {}, "newFacts": [fact], "factsToRemove": []})


class Handler(BaseHTTPRequestHandler):
    disable_nagle_algorithm = True
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the benchmark's output is its table."""

    def do_POST(self) -> None:
        started = time.monotonic()
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        route = _PATH.match(self.path)
        if route is None:
            self._send(404, {"error": {"message": f"unknown path {self.path}"}})
            return
        content = memory_update(body)
        time.sleep(max(0.0, int(route.group(1)) / 1000 - (time.monotonic() - started)))
        self._send(
            200,
            {
                "id": "chatcmpl-bench",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", "bench"),
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

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def main() -> int:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    print(f"port {server.server_address[1]}", flush=True)
    sys.stdin.read()  # the benchmark closes our stdin (or exits) when it is done
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
