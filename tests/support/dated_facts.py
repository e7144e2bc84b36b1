"""Facts of a stored document dated relative to a fixed instant, for the lifecycle unit tests."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from memstore.document import format_timestamp


def dated_fact(
    fact_id: str | None,
    *,
    now: datetime,
    days: int,
    category: str = "knowledge",
    confidence: Any = 0.8,
    content: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A fact created ``days`` before ``now``; ``fact_id`` None leaves it id-less (a legacy fact)."""
    made: dict[str, Any] = {
        "content": content or f"fact {fact_id}",
        "category": category,
        "confidence": confidence,
        "createdAt": format_timestamp(now - timedelta(days=days)),
        "source": "t",
        **extra,
    }
    if fact_id is not None:
        made["id"] = fact_id
    return made
