#!/usr/bin/env python3
"""A worker process for the queue benchmark, driven one command per line on stdin.

- ``db N BASE_URL``: start a ``DatabaseUpdateQueue`` with N worker threads against BASE_URL.
- ``stop``: shut that queue down and print one JSON line: its stats and the CPU time the process
  used since ``db`` (every thread's: the workers, the heartbeat, the idle polls).
- ``memory N BASE_URL TAG``: the baseline: queue N conversations (``TAG-0`` ...) on a
  ``MemoryUpdateQueue`` in this process, drain it, print one JSON line.
- ``quit`` (or end of input): exit.

The process is started once per backend and reused across runs, so interpreter start-up and
imports stay out of every figure. Its ``MemoryUpdater``s are reused too (a queue's worker threads
take them from a pool and the pool gets them back at ``stop``), as a long-running worker keeps its
own: building one costs ~35 ms of CPU, mostly the OpenAI client's TLS context, paid once per
thread in production but once per run here if each run built its own. The benchmark warms the
pool with a discarded run. ``argv[1]`` is the database URL.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

from memstore.capture.conversation import ConversationContext
from memstore.config import MemoryConfig, get_memory_config, set_memory_config
from memstore.queue.database import DatabaseUpdateQueue
from memstore.queue.debounced import MemoryUpdateQueue
from memstore.update.updater import MemoryUpdater

MARKER = "bench conversation"  # bench_llm_server.MARKER: the server names the fact after it
DRAIN_TIMEOUT_SECONDS = 600.0


def bench_config(database_url: str, base_url: str | None = None) -> MemoryConfig:
    """The benchmark's queue config: the real LLM extractor against the local server.

    ``debounce_seconds`` is the maximum, so the probe turns the benchmark enqueues on the request
    path while workers run never come due during a run: they measure enqueueing, not extraction.
    """
    return MemoryConfig(
        database_url=database_url,
        model_name="bench-model",
        llm_base_url=base_url,
        extractor="llm",
        debounce_seconds=300,
        llm_timeout_seconds=60,
    )


def conversation(user: str, index: int) -> ConversationContext:
    """A short realistic exchange (~500 characters) that the server answers with one fact."""
    messages = [
        {"role": "user", "content": f"This is {MARKER} {user}. I keep my meeting notes in Markdown files."},
        {
            "role": "assistant",
            "content": "Noted. Markdown keeps notes portable; would you like a template with "
            "headings for attendees, decisions and action items?",
        },
        {"role": "user", "content": f"Yes please, and number the action items (request {index})."},
        {
            "role": "assistant",
            "content": "Here is a template: # Meeting, ## Attendees, ## Decisions, ## Action items "
            "with a numbered list, each item with an owner and a due date.",
        },
    ]
    return ConversationContext(f"thread-{user}", messages, None, user)


def _memory_run(count: int, tag: str) -> dict[str, Any]:
    queue = MemoryUpdateQueue()
    cpu = time.process_time()
    latencies = []
    for index in range(count):
        context = conversation(f"{tag}-{index}", index)
        begin = time.perf_counter()
        queue.submit(context)
        latencies.append((time.perf_counter() - begin) * 1000)
    start = time.perf_counter()
    queue.flush_nowait()
    drained = queue.wait_idle(DRAIN_TIMEOUT_SECONDS)
    elapsed = time.perf_counter() - start
    queue.shutdown(5.0)
    stats = queue.stats
    return {
        "drained": drained,
        "seconds": elapsed,
        "cpu_s": time.process_time() - cpu,
        "updated": stats.updated,
        "skipped": stats.skipped,
        "errors": stats.errors,
        "enqueue_ms": latencies,
    }


class _UpdaterPool:
    """Hands out idle updaters (new ones when none is idle) and takes them all back at the end."""

    def __init__(self) -> None:
        self._idle: list[MemoryUpdater] = []
        self._out: list[MemoryUpdater] = []
        self._lock = threading.Lock()

    def take(self) -> MemoryUpdater:
        with self._lock:
            updater = self._idle.pop() if self._idle else MemoryUpdater()
            self._out.append(updater)
            return updater

    def give_back(self) -> None:
        with self._lock:
            self._idle += self._out
            self._out.clear()


def _use_endpoint(database_url: str, base_url: str) -> None:
    """Keep the config object while the endpoint stays: a new one makes every updater rebuild."""
    if get_memory_config().llm_base_url != base_url:
        set_memory_config(bench_config(database_url, base_url))


def main(argv: list[str]) -> int:
    database_url = argv[1]
    set_memory_config(bench_config(database_url))
    pool = _UpdaterPool()
    queue: DatabaseUpdateQueue | None = None
    cpu = 0.0
    print("ready", flush=True)
    for line in sys.stdin:
        command, *args = line.split()
        if command == "db":
            _use_endpoint(database_url, args[1])
            cpu = time.process_time()
            queue = DatabaseUpdateQueue(database_url, pool.take, workers=int(args[0]))
        elif command == "stop" and queue is not None:
            queue.shutdown(get_memory_config().shutdown_timeout_seconds)
            pool.give_back()
            stats = queue.stats
            report = {"cpu_s": time.process_time() - cpu, "updated": stats.updated, "dead": stats.dead}
            report |= {"skipped": stats.skipped, "retries": stats.retries, "taken_over": stats.taken_over}
            print(json.dumps(report), flush=True)
            queue = None
        elif command == "memory":
            _use_endpoint(database_url, args[1])
            print(json.dumps(_memory_run(int(args[0]), args[2])), flush=True)
        elif command == "quit":
            break
        else:
            raise SystemExit(f"bench_queue_worker: unexpected command {line.strip()!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
