"""Helpers for the durable-queue acceptance tests: the scripted LLM, gateway processes, and
what the database holds afterwards (facts, the audit trail, queue rows).

Every conversation says ``remember <token>``; the scripted LLM answers with the fact
``fact <token>`` and rewrites the scope's ``topOfMind`` summary to ``latest <token>``. So each
conversation leaves one checkable fact and one summary rewrite in ``memory_history``: a
conversation applied twice shows up as a second rewrite even when the fact is deduplicated.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import get_engine
from memstore.storage.sql.schema.models import claims_table, history_table, queue_table, scopes_table
from tests.reliability.llm_script import fact, prompt_conversation, update_reply
from tests.support.openai_server import OpenAIStubServer

ROOT = Path(__file__).resolve().parents[2]
TOKEN = re.compile(r"remember (\S+)")
Scope = tuple[str | None, str | None]
Conversation = tuple[str, str, str | None, str]
"""``(thread_id, user_id, agent_name, text)``."""


def token_reply(body: dict[str, Any]) -> str:
    """The update a model would make of the conversation in ``body``: one fact and a summary per token."""
    tokens = TOKEN.findall(prompt_conversation(body))
    summary = {"topOfMind": {"summary": f"latest {tokens[-1]}", "shouldUpdate": True}} if tokens else {}
    return update_reply([fact(f"fact {token}") for token in tokens], user=summary)


def conversation(user: str, agent: str | None, thread: str) -> Conversation:
    return (thread, user, agent, f"Please remember {thread} for later.")


def expected_facts(conversations: list[Conversation]) -> dict[Scope, set[str]]:
    expected: dict[Scope, set[str]] = {}
    for thread, user, agent, _text in conversations:
        expected.setdefault((user, agent), set()).add(f"fact {thread}")
    return expected


def llm_config(server: OpenAIStubServer, **extra: Any) -> dict[str, Any]:
    return {
        "extractor": "llm",
        "llm_base_url": server.base_url,
        "model_name": "stub-model",
        "llm_timeout_seconds": 30.0,
        **extra,
    }


def stored_facts(url: str, scopes: list[Scope]) -> dict[Scope, list[str]]:
    """Each scope's live facts, as a list: a duplicate would show twice."""
    storage = SqlMemoryStorage(url)
    return {
        (user, agent): [f["content"] for f in storage.reload(agent, user_id=user)["facts"]]
        for user, agent in scopes
    }


def lost_facts(url: str, conversations: list[Conversation]) -> list[str]:
    expected = expected_facts(conversations)
    stored = stored_facts(url, list(expected))
    return sorted(f for scope, facts in expected.items() for f in facts - set(stored[scope]))


def audit_counts(url: str) -> tuple[Counter[str], Counter[Scope]]:
    """How often each fact was inserted, and how often each scope's ``topOfMind`` was rewritten."""
    scope = (scopes_table.c.user_id, scopes_table.c.agent_name)
    joined = history_table.join(scopes_table, history_table.c.scope_id == scopes_table.c.id)
    with get_engine(url).connect() as conn:
        facts = conn.execute(
            select(history_table.c.after)
            .select_from(joined)
            .where(history_table.c.entity == "fact", history_table.c.action == "insert")
        ).scalars()
        inserted = Counter(str(after["content"]) for after in facts)
        rewrites = conn.execute(
            select(*scope, func.count())
            .select_from(joined)
            .where(history_table.c.entity == "section", history_table.c.entity_id == "topOfMind")
            .group_by(*scope)
        ).all()
    return inserted, Counter({(user, agent): int(count) for user, agent, count in rewrites})


def queue_rows(url: str) -> Counter[str]:
    """Queue rows by state, plus ``claims`` for the scope claims still held (a released claim
    stays, expired, as its scope's last service)."""
    live = claims_table.c.lease_expires_at >= datetime.now(UTC)
    with get_engine(url).connect() as conn:
        by_state = select(queue_table.c.state, func.count()).group_by(queue_table.c.state)
        states = Counter({str(state): int(count) for state, count in conn.execute(by_state)})
        held = select(func.count()).select_from(claims_table).where(live)
        states["claims"] = int(conn.execute(held).scalar_one())
    return states


@contextmanager
def gateway(
    tmp_path: Path,
    name: str,
    config: dict[str, Any],
    conversations: list[Conversation],
    *,
    workers: int,
    pace: float = 0.0,
) -> Iterator[subprocess.Popen[str]]:
    """A ``tests.support.queue_gateway`` process; killed on the way out if the test left it running."""
    log_dir = tmp_path / "updates"
    log_dir.mkdir(exist_ok=True)
    spec = tmp_path / f"{name}.json"
    spec.write_text(
        json.dumps(
            {
                "config": {"data_dir": str(tmp_path / "data"), **config},
                "workers": workers,
                "conversations": conversations,
                "pace": pace,
                "log_dir": str(log_dir),
            }
        ),
        encoding="utf-8",
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MEMSTORE_CONFIG", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.support.queue_gateway", str(spec)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)
        assert process.stdout is not None
        process.stdout.close()


def wait_queued(process: subprocess.Popen[str]) -> None:
    """Block until the gateway says its conversations are in the queue."""
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line.startswith("queued "), f"gateway exited ({process.poll()}) before queueing: {line!r}"


def wait_drained(url: str, timeout: float) -> bool:
    """Wait until no process's conversation waits or runs in the queue at ``url``."""
    deadline = time.monotonic() + timeout
    while True:
        rows = queue_rows(url)
        if not rows.get("pending") and not rows.get("leased"):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
