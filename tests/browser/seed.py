"""The memory the console tests look at, written through memstore's own API into a real database.

Each mutation test has its own user, so the tests of one module share one server and database in
any order: carol's fact is edited, dave's deleted, gina's changed by another writer during an
edit, erin's stale fact expired, and two dead queue rows are retried and purged. alice holds the
hostile text (markup and script in facts, a summary, a session turn, an agent document and a queue
error) and a history written by every kind of writer.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import select, update

from memstore.agent_doc import MAIN_DOC_PATH, DocScope
from memstore.config import MemoryConfig, set_memory_config
from memstore.ops.agent_docs import reset_agent_doc_stores, write_doc
from memstore.ops.facts import create_memory_fact_with_created_fact, update_memory_fact
from memstore.ops.sessions import append_turns
from memstore.storage.loader import get_memory_storage, reset_memory_storage
from memstore.storage.sessions.loader import reset_session_stores
from memstore.storage.sql.engine import dispose_engines, get_engine
from memstore.storage.sql.queue.table import QueuedConversation, enqueue
from memstore.storage.sql.schema.models import facts_table, queue_table, scopes_table

SCRIPT_FACT = "Alice likes tea <script>window.__pwned = 'script'</script>"
IMG_FACT = "Alice drives <img src=x onerror=\"window.__pwned = 'img'\"> a bike"
SUMMARY = "Works on <b>billing</b> <svg onload=\"window.__pwned='svg'\">"
QUEUE_ERROR = "LLM said <img src=x onerror=\"window.__pwned='queue'\">"
FILLER_FACTS = 90  # under max_facts (100), which would evict the rest


@dataclass(frozen=True)
class Seeded:
    alice_fact: str
    """alice's edited fact: its history has an insert by an operator, an update by the updater."""
    carol_fact: str
    dave_fact: str
    gina_fact: str
    """Changed behind the console's back while its edit dialog is open."""
    erin_stale: str
    erin_fresh: str
    dead_rows: tuple[int, int]


def seed(url: str, data_dir: Path) -> Seeded:
    """Fill the database at ``url``; the process's settings are restored afterwards."""
    set_memory_config(MemoryConfig(database_url=url, data_dir=str(data_dir)))
    reset_memory_storage()
    reset_session_stores()
    reset_agent_doc_stores()
    try:
        return _seed(url)
    finally:
        reset_memory_storage()
        reset_session_stores()
        reset_agent_doc_stores()
        dispose_engines()
        set_memory_config(None)


def _create(content: str, user: str, category: str = "context", **fields: object) -> str:
    _, fact = create_memory_fact_with_created_fact(content, category, user_id=user, **fields)  # type: ignore[arg-type]
    return str(fact["id"])


def _seed(url: str) -> Seeded:
    _create(SCRIPT_FACT, "alice", "preference")
    _create(IMG_FACT, "alice", tags=["hostile"])
    alice_fact = _create("Alice works at Acme", "alice", "knowledge", importance=0.8)
    update_memory_fact(alice_fact, "Alice works at Acme Corp as an engineer", user_id="alice")
    storage = get_memory_storage()
    document = storage.load(user_id="alice")
    document["user"]["workContext"] = {"summary": SUMMARY, "updatedAt": "2026-01-01T00:00:00Z"}
    for fact in document["facts"]:
        if fact["id"] == alice_fact:
            fact["confidence"] = 0.95
    storage.save(document, user_id="alice", origin="thread-42")  # what the queue's updater writes
    carol_fact = _create("Carol prefers window seats", "carol", "preference")
    dave_fact = _create("Dave has a dog named Rex", "dave")
    gina_fact = _create("Gina lives in Porto", "gina")
    erin_fresh = _create("Erin speaks Portuguese", "erin", confidence=0.95)
    erin_stale = _create("Erin once mentioned a rainy day", "erin", confidence=0.1)
    age_fact(url, "erin", erin_stale)
    frank = storage.load(user_id="frank")
    frank["facts"] = [
        {
            "id": f"fact_f{index:03d}",
            "content": f"Frank note number {index}",
            "category": "note",
            "confidence": 0.6,
            "createdAt": "2026-01-01T00:00:00Z",
        }
        for index in range(FILLER_FACTS)
    ]
    storage.save(frank, user_id="frank", origin="import")
    _create("Zoe is in tenant acme", "zoe", tenant_id="acme")
    append_turns(
        "alice",
        "s-1",
        [
            {"role": "user", "content": "Hi, <i>I live</i> in Lisbon."},
            {"role": "assistant", "content": "Welcome!"},
        ],
    )
    write_doc(
        DocScope("coder"),
        MAIN_DOC_PATH,
        "# Coder\nReview <script>x()</script> carefully.\n",
        expected_version=None,
        author="operator",
        actor="seed",
    )
    return Seeded(alice_fact, carol_fact, dave_fact, gina_fact, erin_stale, erin_fresh, _queue(url))


def age_fact(url: str, user: str, fact_id: str) -> None:
    """Make a fact two years old, so its decay score falls under the lifecycle's threshold."""
    scopes = select(scopes_table.c.id).where(scopes_table.c.user_id == user)
    with get_engine(url).begin() as conn:
        conn.execute(
            update(facts_table)
            .where(facts_table.c.fact_id == fact_id, facts_table.c.scope_id.in_(scopes))
            .values(created_at=datetime.now(UTC) - timedelta(days=730))
        )
        # A hand edit of a document's rows moves its scope's revision (docs/schema.md), so caches
        # and the derived snapshot stop being current.
        conn.execute(
            update(scopes_table)
            .where(scopes_table.c.id.in_(scopes))
            .values(revision=scopes_table.c.revision + 1)
        )


def _queue(url: str) -> tuple[int, int]:
    """Two dead conversations (with hostile errors) and two done in the last hour (the charts)."""
    now = datetime.now(UTC)
    with get_engine(url).begin() as conn:
        for index, user in enumerate(["alice", "bob", "carol", "dave"]):
            item = QueuedConversation(
                f"thread-{index}",
                user,
                None,
                [{"role": "user", "content": f"turn {index}"}],
                False,
                False,
                now,
            )
            enqueue(conn, item, owner="seed", now=now, due_at=now, latest_due_at=now)
        conn.execute(
            update(queue_table)
            .where(queue_table.c.thread_id.in_(["thread-0", "thread-1"]))
            .values(state="dead", attempts=5, last_error=QUEUE_ERROR)
        )
        for minutes, thread in ((3, "thread-2"), (10, "thread-3")):
            done = now - timedelta(minutes=minutes)
            conn.execute(
                update(queue_table)
                .where(queue_table.c.thread_id == thread)
                .values(state="done", completed_at=done, pending_since=done - timedelta(seconds=40))
            )
        dead = select(queue_table.c.id).where(queue_table.c.state == "dead").order_by(queue_table.c.thread_id)
        first, second = conn.execute(dead).scalars().all()
    return int(first), int(second)
