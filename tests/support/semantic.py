"""Shared by the relevance tests: the test embedding model's name, fact and document builders, reads."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import text

from memstore.document import create_empty_memory
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import get_engine

MODEL = "test-embed"
STORED = f"openai:{MODEL}"
"""What the stored vectors name: the provider and its model."""


def fact(fact_id: str, content: str, confidence: float = 0.8, category: str = "context") -> dict[str, Any]:
    return {
        "id": fact_id,
        "content": content,
        "category": category,
        "confidence": confidence,
        "createdAt": "2026-07-14T15:35:46Z",
        "source": "thread-1",
    }


def doc(*facts: dict[str, Any]) -> dict[str, Any]:
    doc = create_empty_memory()
    doc["facts"] = list(facts)
    return doc


def backend(storage: SqlMemoryStorage) -> str:
    """What this machine's database offers: CI's Python cannot load SQLite extensions."""
    return storage.vectors.status().backend


def json_value(value: Any) -> Any:
    """A JSON column read through raw SQL: text on SQLite, decoded already on PostgreSQL."""
    return json.loads(value) if isinstance(value, str) else value


def vector_rows(storage: SqlMemoryStorage) -> dict[str, str]:
    with get_engine(storage.url).connect() as conn:
        rows = conn.execute(
            text(
                "SELECT f.fact_id, e.model FROM memory_fact_embeddings e"
                " JOIN memory_facts f ON f.id = e.fact_row_id"
            )
        ).all()
    return {row[0]: row[1] for row in rows}
