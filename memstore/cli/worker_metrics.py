"""``memstore worker --metrics-port``: the worker's own ``/metrics``, for a fleet's scraper.

The LLM calls and extraction outcomes of a stand-alone worker happen in its process, so only it
can expose them; ``memstore serve`` shows its own. A standard-library HTTP server in a daemon
thread is enough for one scrape every few seconds and needs no web framework.
"""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from memstore.cli.listening import listen
from memstore.integrations.metrics import render_metrics

logger = logging.getLogger(__name__)


class _MetricsHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] != "/metrics":
            self.send_error(404, "only /metrics is served here")
            return
        try:
            body, content_type = render_metrics()
        except Exception:
            logger.exception("metrics: the scrape failed")
            self.send_error(500, "the scrape failed; see the worker's log")
            return
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Scrapes every few seconds would drown the worker's log; failures are logged above."""


def serve_metrics(host: str, port: int) -> ThreadingHTTPServer:
    """Serve ``GET /metrics`` on ``host:port`` until the process ends (exit 5 if it cannot listen)."""
    listener = listen(host, port)
    server = ThreadingHTTPServer((host, port), _MetricsHandler, bind_and_activate=False)
    server.socket.close()
    server.socket = listener
    server.server_address = listener.getsockname()[:2]
    server.server_activate()
    threading.Thread(target=server.serve_forever, name="memstore-metrics", daemon=True).start()
    return server
