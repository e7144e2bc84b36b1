"""Queries and maintenance for ``FileMemoryStorage``, answered by scanning the document tree.

There is no index and no audit trail: every query reads each matching scope (through the
provider's mtime-validated cache), search is substring matching, and ``history`` reports
that the file provider keeps none. Fine for a laptop; use the SQL provider at scale.
"""

from __future__ import annotations

import logging
import shutil
from abc import abstractmethod
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from memstore.config import get_memory_config
from memstore.document import DEFAULT_CATEGORY, VISIBILITIES, coerce_confidence, parse_timestamp
from memstore.errors import MemstoreError
from memstore.retention import RetentionPolicy
from memstore.scope import Scope, validate_user_id
from memstore.storage.base import MemoryStorage
from memstore.storage.file.layout import discover_tree
from memstore.storage.records import (
    FactFilter,
    FactOrder,
    FactPage,
    FactRecord,
    HistoryEntry,
    MemoryStats,
    by_score,
    with_scores,
)
from memstore.storage.search_text import substring_terms

logger = logging.getLogger(__name__)


class FileOperations(MemoryStorage):
    """``StorageOperations`` for a provider that keeps one JSON document per scope under ``base_dir``."""

    @property
    @abstractmethod
    def base_dir(self) -> Path: ...

    @property
    def _root(self) -> Path:
        return self.base_dir

    def list_scopes(self, user_id: str | None = None) -> list[Scope]:
        if not self._root.is_dir():
            return []
        entries, _ = discover_tree(self._root)
        scopes = [(entry.user_id, entry.agent_name) for entry in entries]
        if user_id is not None:
            scopes = [scope for scope in scopes if scope[0] == user_id]
        return sorted(scopes, key=lambda scope: (scope[0] or "", scope[1] or ""))

    def query_facts(
        self, where: FactFilter, *, search: str | None, limit: int, offset: int, order: FactOrder = "newest"
    ) -> FactPage:
        """Files keep no access or confirmation signals: those orders fall back to newest first."""
        facts = [fact for fact in self._facts(where) if _matches(fact, where)]
        policy, now = RetentionPolicy.of(get_memory_config()), datetime.now(UTC)
        if search is None and order == "score":
            ranked = by_score(facts, policy, now)
            return FactPage(ranked[offset : offset + limit], len(ranked), limit, offset, "filter")
        if search is None:
            mode = "filter"
            facts.sort(key=lambda fact: _timestamp(fact.created_at), reverse=True)
        else:
            mode = "substring"
            terms = [term.casefold() for term in substring_terms(search)]
            facts = [fact for fact in facts if all(term in fact.content.casefold() for term in terms)]
            facts.sort(key=lambda fact: fact.confidence, reverse=True)
        page = facts[offset : offset + limit]
        return FactPage(with_scores(page, policy, now), len(facts), limit, offset, mode)

    def stats(self) -> MemoryStats:
        scopes = self.list_scopes()
        by_category: dict[str, int] = {}
        for fact in self._facts(FactFilter()):
            by_category[fact.category] = by_category.get(fact.category, 0) + 1
        size = sum(path.stat().st_size for path in self._root.rglob("*.json")) if self._root.is_dir() else 0
        users = len({user for user, _ in scopes if user is not None})
        return MemoryStats(
            users, len(scopes), sum(by_category.values()), dict(sorted(by_category.items())), size
        )

    def history(self, where: FactFilter, *, fact_id: str | None, limit: int) -> list[HistoryEntry]:
        raise MemstoreError("the file provider keeps no audit history; use the SQL provider (the default)")

    def erase_user(self, user_id: str) -> dict[str, int]:
        validate_user_id(user_id)
        user_dir = self._root / "users" / user_id
        scopes = self.list_scopes(user_id)
        facts = sum(len(self._facts_of(scope)) for scope in scopes)
        if user_dir.is_dir():
            shutil.rmtree(user_dir)
        for scope in scopes:  # forget cached copies; the files are gone
            self.reload(scope[1], user_id=scope[0])
        logger.warning(
            "erased user %s from the file provider; it cannot fence updates still queued in running "
            "gateways, which may write new memory for this user",
            user_id,
        )
        return {"files": len(scopes), "facts": facts}

    def vacuum(self, cutoff: datetime) -> dict[str, int]:
        return {}

    def _facts(self, where: FactFilter) -> Iterator[FactRecord]:
        for scope in self.list_scopes(where.user_id):
            if where.matches_scope(scope):
                yield from self._facts_of(scope)

    def _facts_of(self, scope: Scope) -> list[FactRecord]:
        user_id, agent_name = scope
        facts = self.load(agent_name, user_id=user_id).get("facts")
        records = []
        for fact in facts if isinstance(facts, list) else []:
            if isinstance(fact, dict) and isinstance(fact.get("content"), str):
                records.append(_record(user_id, agent_name, fact))
        return records


def _record(user_id: str | None, agent_name: str | None, fact: dict[str, Any]) -> FactRecord:
    return FactRecord(
        user_id=user_id,
        agent_name=agent_name,
        fact_id=str(fact.get("id", "")),
        content=fact["content"],
        category=str(fact.get("category") or DEFAULT_CATEGORY),
        confidence=coerce_confidence(fact.get("confidence")),
        created_at=parse_timestamp(fact.get("createdAt")),
        source=fact.get("source") if isinstance(fact.get("source"), str) else None,
        visibility=fact["visibility"] if fact.get("visibility") in VISIBILITIES else "private",
    )


def _timestamp(value: datetime | None) -> float:
    return value.timestamp() if value is not None else float("-inf")


def _matches(fact: FactRecord, where: FactFilter) -> bool:
    if where.category is not None and fact.category != where.category:
        return False
    if where.visibility is not None and fact.visibility != where.visibility:
        return False
    if where.min_confidence is not None and fact.confidence < where.min_confidence:
        return False
    if where.text and where.text.casefold() not in fact.content.casefold():
        return False
    if where.created_after is not None and (fact.created_at is None or fact.created_at < where.created_after):
        return False
    return not (
        where.created_before is not None
        and (fact.created_at is None or fact.created_at >= where.created_before)
    )
