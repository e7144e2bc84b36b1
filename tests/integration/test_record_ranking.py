"""The record's importance and decay score on real databases: as ranking signals of injection
(with and without a query), and in the lifecycle rule that expires what decayed."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text

from memstore.config import MemoryConfig
from memstore.document import format_timestamp
from memstore.gateway.middleware import MemoryMiddleware
from memstore.ops.embeddings import embed_facts
from memstore.ops.lifecycle import LIFECYCLE_ORIGIN, run_lifecycle
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import get_engine
from tests.support.semantic import doc

USER = "alice"
NOW = datetime.now(UTC).replace(microsecond=0)


def _fact(
    number: int, content: str, confidence: float, *, age_days: float = 10, **record: Any
) -> dict[str, Any]:
    return {
        "id": f"fact_{number:08x}",
        "content": content,
        "category": "knowledge",
        "confidence": confidence,
        "createdAt": format_timestamp(NOW - timedelta(days=age_days)),
        "source": "thread-1",
        **record,
    }


def _order(block: str) -> list[str]:
    return [line.split("] ", 1)[1] for line in block.splitlines() if line.startswith("- [")]


def _context(query: str | None = None) -> list[str]:
    return _order(MemoryMiddleware().memory_context(user_id=USER, query=query))


def _set_signals(url: str, fact_id: str, **columns: Any) -> None:
    assignments = ", ".join(f"{name} = :{name}" for name in columns)
    with get_engine(url).begin() as conn:
        conn.execute(
            text(f"UPDATE memory_facts SET {assignments} WHERE fact_id = :fact_id"),
            {**columns, "fact_id": fact_id},
        )


def test_importance_orders_injection_without_a_query_only_when_weighted(
    sql_storage: SqlMemoryStorage, isolated_config: MemoryConfig
) -> None:
    sql_storage.save(
        doc(
            _fact(1, "User once tried a standing desk", 0.95, importance=0.2),
            _fact(2, "User works in Lisbon", 0.9),
            _fact(3, "User is allergic to peanuts", 0.7, importance=1.0),
        ),
        user_id=USER,
    )
    by_confidence = ["User once tried a standing desk", "User works in Lisbon", "User is allergic to peanuts"]
    assert _context() == by_confidence
    isolated_config.relevance_importance_weight = 1.0
    assert _context() == list(reversed(by_confidence))


def test_decay_orders_injection_by_what_is_fresh_or_used(
    sql_storage: SqlMemoryStorage, isolated_config: MemoryConfig
) -> None:
    sql_storage.save(
        doc(
            _fact(1, "User used Perl long ago", 0.95, age_days=400),
            _fact(2, "User deploys with Helm", 0.8, age_days=400),
            _fact(3, "User started learning Zig", 0.8, age_days=2),
        ),
        user_id=USER,
    )
    _set_signals(sql_storage.url, "fact_00000002", access_count=6, last_accessed_at=NOW - timedelta(days=1))
    assert _context()[0] == "User used Perl long ago"
    isolated_config.relevance_decay_weight = 1.0
    assert _context() == ["User started learning Zig", "User deploys with Helm", "User used Perl long ago"]


def test_importance_breaks_a_tie_of_relevance_with_a_query(
    semantic: SqlMemoryStorage, isolated_config: MemoryConfig
) -> None:
    semantic.save(
        doc(
            _fact(1, "User drinks green tea in the morning", 0.8, importance=0.9),
            _fact(2, "User drinks green tea after lunch", 0.8, importance=0.3),
            _fact(3, "User lives in Berlin", 0.8),
        ),
        user_id=USER,
    )
    isolated_config.relevance_fusion = "rrf"  # by rank, a tie of relevance is a few ranks apart
    embed_facts()
    assert _context("green tea")[0] == "User drinks green tea after lunch"  # the closer vector
    isolated_config.relevance_importance_weight = 2.0
    shown = _context("green tea")
    assert shown[0] == "User drinks green tea in the morning" and shown[-1] == "User lives in Berlin"


def _deletions(url: str) -> list[tuple[str, str, dict[str, Any]]]:
    with get_engine(url).connect() as conn:
        rows = conn.execute(
            text("SELECT entity_id, origin, detail FROM memory_history WHERE action = 'delete' ORDER BY id")
        ).all()
    return [
        (row.entity_id, row.origin, json.loads(row.detail) if isinstance(row.detail, str) else row.detail)
        for row in rows
    ]


def test_the_decay_rule_keeps_an_important_fact_and_expires_an_unimportant_one_of_the_same_age(
    sql_url: str, isolated_config: MemoryConfig
) -> None:
    assert isolated_config.expire_below is None  # off by default
    isolated_config.expire_below = 0.2  # the design's threshold
    storage = SqlMemoryStorage(sql_url)
    # 150 days old, never confirmed or used: the half-life is 90 days x (0.5 + importance).
    important = _fact(1, "User is allergic to peanuts", 0.9, age_days=150, importance=1.0)
    ordinary = _fact(2, "User works in Lisbon", 0.9, age_days=150)
    unimportant = _fact(3, "User watched a snooker match", 0.9, age_days=150, importance=0.0)
    assert storage.save(doc(important, ordinary, unimportant), user_id=USER)
    before = storage.reload(user_id=USER)

    dry = run_lifecycle(dry_run=True, user_id=USER, now=NOW, storage=storage)
    [expiring] = dry.expiring
    assert expiring.fact_id == unimportant["id"] and expiring.importance == 0.0
    assert expiring.decay.value == pytest.approx(0.9 * 2 ** (-150 / 45), abs=1e-4)
    assert dry.removed == 0 and storage.reload(user_id=USER) == before and _deletions(sql_url) == []

    run = run_lifecycle(dry_run=False, user_id=USER, now=NOW, storage=storage)
    assert run.removed == 1
    assert [fact.to_json() for fact in run.expiring] == [fact.to_json() for fact in dry.expiring]
    assert [fact["id"] for fact in storage.reload(user_id=USER)["facts"]] == [important["id"], ordinary["id"]]
    [(fact_id, origin, detail)] = _deletions(sql_url)
    assert (fact_id, origin) == (unimportant["id"], LIFECYCLE_ORIGIN)
    assert detail["reason"] == "expired" and detail["importance"] == 0.0
    assert detail["score"] == pytest.approx(0.9 * 2 ** (-150 / 45), abs=1e-5)
    assert detail["freshness"] == pytest.approx(2 ** (-150 / 45), abs=1e-5)
    assert detail["confidence"] == 0.9 and detail["heat"] == 0.0
