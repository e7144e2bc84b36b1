"""A gateway process for the durable-queue tests: it queues conversations and runs queue workers.

Run as ``python -m tests.support.queue_gateway SPEC.json``. The spec gives the memstore config
(``MemoryConfig`` values: the database, the local LLM server, the queue settings), the number
of workers, the conversations to queue (``[thread_id, user_id, agent_name, text]``), a pause
between them, and a directory for the log of every update this process runs.

The updater is the real ``MemoryUpdater``, wrapped only to append one JSON line per call to
``<log_dir>/<pid>.jsonl``: scope, thread, monotonic start and end (one clock for every process
on the machine), and the outcome. A saved update ends when its save commits: that transaction
also gives the scope's claim back, so another worker may start the scope while this ``process``
is still returning. The process prints ``queued N`` once its conversations are
written, then runs until SIGTERM (a clean shutdown, exit 0) or until it is killed.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import event

from memstore.capture.conversation import ConversationContext
from memstore.config import MemoryConfig, set_memory_config
from memstore.queue.database import DatabaseUpdateQueue
from memstore.storage.sql.engine import get_engine
from memstore.storage.sql.queue.table import QueueLease
from memstore.update.updater import MemoryUpdater


@dataclass(frozen=True)
class UpdateRecord:
    """One ``process`` call as a gateway logged it."""

    user_id: str | None
    agent_name: str | None
    thread_id: str
    start: float
    end: float
    pid: int
    outcome: str

    @property
    def scope(self) -> tuple[str | None, str | None]:
        return (self.user_id, self.agent_name)


_commits = threading.local()
"""The monotonic time of this thread's latest commit on the queue's database."""


def _committing(_conn: Any) -> None:
    _commits.at = time.monotonic()


class LoggingUpdater:
    """``MemoryUpdater.process`` with each call's interval appended to a log file."""

    def __init__(self, log: Path) -> None:
        self._inner = MemoryUpdater()
        self._fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def process(self, context: ConversationContext, lease: QueueLease | None = None) -> bool:
        start = time.monotonic()
        _commits.at = None
        outcome = "error"
        try:
            saved = self._inner.process(context, lease)
            outcome = "saved" if saved else "nothing"
            return saved
        except Exception as exc:
            outcome = type(exc).__name__
            raise
        finally:
            entry = {
                "user_id": context.user_id,
                "agent_name": context.agent_name,
                "thread_id": context.thread_id,
                "start": start,
                "end": (_commits.at if outcome == "saved" else None) or time.monotonic(),
                "pid": os.getpid(),
                "outcome": outcome,
            }
            os.write(self._fd, (json.dumps(entry) + "\n").encode())


def read_records(log_dir: Path) -> list[UpdateRecord]:
    """Every update logged by the gateways that wrote to ``log_dir``."""
    return [
        UpdateRecord(**json.loads(line))
        for path in sorted(log_dir.glob("*.jsonl"))
        for line in path.read_text(encoding="utf-8").splitlines()
        if line
    ]


def main(spec_path: str) -> None:
    spec: dict[str, Any] = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    set_memory_config(MemoryConfig(**spec["config"]))
    event.listen(get_engine(spec["config"]["database_url"]), "commit", _committing)
    log = Path(spec["log_dir"]) / f"{os.getpid()}.jsonl"
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _signum, _frame: stop.set())
    queue = DatabaseUpdateQueue(
        spec["config"]["database_url"], lambda: LoggingUpdater(log), workers=int(spec["workers"])
    )
    for thread_id, user_id, agent_name, text in spec["conversations"]:
        messages = [{"role": "user", "content": text}, {"role": "assistant", "content": "Noted."}]
        queue.add_nowait(thread_id=thread_id, messages=messages, agent_name=agent_name, user_id=user_id)
        if stop.wait(float(spec.get("pace", 0.0))):
            break
    print(f"queued {len(spec['conversations'])}", flush=True)
    while not stop.wait(0.2):
        pass
    queue.shutdown(5.0)


if __name__ == "__main__":
    main(sys.argv[1])
