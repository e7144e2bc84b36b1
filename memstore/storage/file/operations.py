"""Queries and maintenance for ``FileMemoryStorage``, answered by scanning the document tree.

There is no index and no audit trail: every query reads each matching scope (through the
provider's mtime-validated cache), search is substring matching, and ``history`` reports
that the file provider keeps none. Fine for a laptop; use the SQL provider at scale.
"""

from __future__ import annotations

import logging
import shutil
from abc import abstractmethod
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from memstore.config import get_memory_config
from memstore.document import DEFAULT_CATEGORY, VISIBILITIES, coerce_confidence, parse_timestamp
from memstore.errors import InvalidFactError, MemstoreError
from memstore.record import (
    DEFAULT_IMPORTANCE,
    DEFAULT_SOURCE_KIND,
    IMPORTANCE_KEY,
    RAW_KEY,
    RELATION_KINDS,
    RELATIONS_KEY,
    SOURCE_KIND_KEY,
    STRUCTURED_KEY,
    TAGS_KEY,
    TYPE_KEY,
    checked_importance,
    checked_raw,
    checked_source_kind,
    checked_structured,
    checked_tags,
    checked_type,
    default_type,
)
from memstore.retention import RetentionPolicy
from memstore.scope import Scope, resolve_scope, validate_user_id
from memstore.storage.base import MemoryStorage
from memstore.storage.file.layout import discover_tree
from memstore.storage.records import (
    FactFilter,
    FactOrder,
    FactPage,
    FactRecord,
    FactRelations,
    HistoryEntry,
    MemoryStats,
    Relation,
    by_score,
    with_scores,
)
from memstore.storage.search_text import (
    SearchMatch,
    any_terms,
    holds_term,
    inverse_document_frequency,
    substring_terms,
    text_terms,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")
D = TypeVar("D")


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
        self,
        where: FactFilter,
        *,
        search: str | None,
        limit: int,
        offset: int,
        order: FactOrder = "newest",
        match: SearchMatch = "any",
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
        elif match == "any":
            mode = "substring"
            facts = _any_term_ranked(facts, search)
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

    def fact_relations(
        self, fact_id: str, agent_name: str | None = None, *, user_id: str | None = None
    ) -> FactRelations:
        """From the scope's document: the fact's ``relations`` key, and the other facts' naming it."""
        user, agent = resolve_scope(agent_name, user_id)
        facts = self.load(agent, user_id=user).get("facts")
        facts = [fact for fact in facts if isinstance(fact, dict)] if isinstance(facts, list) else []
        ids = {fact.get("id") for fact in facts}
        found = FactRelations(fact_id)
        for fact in facts:
            for kind, target in _relations_of(fact):
                if fact.get("id") == fact_id:
                    found.outgoing.append(Relation(kind, target, live=target in ids))
                if target == fact_id and isinstance(source := fact.get("id"), str):
                    found.incoming.append(Relation(kind, source))
        found.outgoing.sort(key=lambda relation: (relation.kind, relation.fact_id))
        found.incoming.sort(key=lambda relation: (relation.kind, relation.fact_id))
        return found

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
    category = str(fact.get("category") or DEFAULT_CATEGORY)
    return FactRecord(
        user_id=user_id,
        agent_name=agent_name,
        fact_id=str(fact.get("id", "")),
        content=fact["content"],
        category=category,
        confidence=coerce_confidence(fact.get("confidence")),
        created_at=parse_timestamp(fact.get("createdAt")),
        source=fact.get("source") if isinstance(fact.get("source"), str) else None,
        visibility=fact["visibility"] if fact.get("visibility") in VISIBILITIES else "private",
        memory_type=_field(fact, TYPE_KEY, checked_type, default_type(category)),
        importance=_field(fact, IMPORTANCE_KEY, checked_importance, DEFAULT_IMPORTANCE),
        tags=tuple(sorted(_field(fact, TAGS_KEY, checked_tags, []))),
        source_kind=_field(fact, SOURCE_KIND_KEY, checked_source_kind, DEFAULT_SOURCE_KIND),
        raw=_field(fact, RAW_KEY, checked_raw, None),
        structured=_field(fact, STRUCTURED_KEY, checked_structured, None),
    )


def _field(fact: dict[str, Any], key: str, check: Callable[[object], T], default: D) -> T | D:
    """A record key as its check passes it; absent or unusable (a file another tool wrote), the default."""
    if key not in fact:
        return default
    try:
        return check(fact[key])
    except InvalidFactError:
        return default


def _relations_of(fact: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """The well-formed ``relations`` entries of a document fact (others are skipped, as on load)."""
    relations = fact.get(RELATIONS_KEY)
    for relation in relations if isinstance(relations, list) else []:
        if isinstance(relation, dict) and relation.get("type") in RELATION_KINDS:
            target = relation.get("target")
            if isinstance(target, str):
                yield relation["type"], target


def _timestamp(value: datetime | None) -> float:
    return value.timestamp() if value is not None else float("-inf")


def _matches(fact: FactRecord, where: FactFilter) -> bool:
    if where.category is not None and fact.category != where.category:
        return False
    if where.visibility is not None and fact.visibility != where.visibility:
        return False
    if where.min_confidence is not None and fact.confidence < where.min_confidence:
        return False
    if where.fact_id is not None and fact.fact_id != where.fact_id:
        return False
    if where.memory_type is not None and fact.memory_type != where.memory_type:
        return False
    if where.tag is not None and where.tag not in fact.tags:
        return False
    if where.min_importance is not None and fact.importance < where.min_importance:
        return False
    if where.source_kind is not None and fact.source_kind != where.source_kind:
        return False
    if where.text and where.text.casefold() not in fact.content.casefold():
        return False
    if where.created_after is not None and (fact.created_at is None or fact.created_at < where.created_after):
        return False
    return not (
        where.created_before is not None
        and (fact.created_at is None or fact.created_at >= where.created_before)
    )


def _any_term_ranked(facts: list[FactRecord], search: str) -> list[FactRecord]:
    """The facts holding any of the query's terms as a word (CJK: a character bigram), by the summed
    inverse document frequency of the terms each holds (as the SQL provider ranks), then confidence."""
    texts = [fact.content.casefold() for fact in facts]
    held = [(set(text_terms(text)), text) for text in texts]
    terms = any_terms(search, fold=str.casefold)  # both sides folded: "STRASSE" finds "Straße"
    weights = [
        inverse_document_frequency(len(facts), sum(holds_term(term, *words) for words in held))
        for term in terms
    ]
    scored = [
        (sum(weight for term, weight in zip(terms, weights, strict=True) if holds_term(term, *words)), fact)
        for fact, words in zip(facts, held, strict=True)
    ]
    scored = [(score, fact) for score, fact in scored if score > 0]
    scored.sort(key=lambda pair: (-pair[0], -pair[1].confidence))
    return [fact for _, fact in scored]
