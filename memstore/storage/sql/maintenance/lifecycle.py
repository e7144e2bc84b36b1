"""The lifecycle run's read: every live fact of a tenant with its retention signals, in batches.

``memstore lifecycle run`` used to reload each scope's document and read its signals (two reads
and a full decode per scope: 68 s over 100,000 facts in 1,000 scopes). It needs six columns of
each fact, so it reads them straight from ``memory_facts``: one statement counts the live facts
of every scope, then one statement per batch of scopes (about ``batch_facts`` facts, each batch
in its own short transaction) returns their rows in document order. A fact whose ``extra`` keeps
a raw value the columns cannot reproduce (``codec``'s ``$memstore`` entry: a ``createdAt`` like
``"2026-07-14"``, an importance finer than six decimals) is decoded by the codec, so every
candidate is exactly what ``candidate_of`` makes of the fact ``reload`` returns
(``tests/integration/test_lifecycle_scan.py`` compares the two).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Engine, Text, case, cast, func, select

from memstore.document import as_utc
from memstore.record import DEFAULT_IMPORTANCE, default_type
from memstore.retention import NO_SIGNALS, Candidate, FactSignals, ScopeFacts, candidate_from, candidate_of
from memstore.scope import Identity
from memstore.storage.sql.documents.codec import RESERVED_KEY, FactValues, Record, decode_fact
from memstore.storage.sql.documents.statements import user_is
from memstore.storage.sql.identity import reading
from memstore.storage.sql.schema.models import facts_table as _facts
from memstore.storage.sql.schema.models import scopes_table as _scopes

_EMPTY = ""
_LIVE = _facts.c.deleted_revision.is_(None)
# ``extra`` only where it keeps raw values (``$memstore``): decoding every fact's JSON was a fifth of
# the scan. A false match (the text in another key's value) only sends a fact the codec's way.
_RAW_EXTRA = case((cast(_facts.c.extra, Text).like(f'%"{RESERVED_KEY}"%'), _facts.c.extra), else_=None)
_FACT_COLUMNS: tuple[ColumnElement[Any], ...] = (
    _facts.c.scope_id,
    _facts.c.fact_id,
    _facts.c.content,
    _facts.c.category,
    _facts.c.confidence,
    _facts.c.created_at,
    _facts.c.importance,
    _facts.c.last_confirmed_at,
    _facts.c.last_accessed_at,
    _facts.c.access_count,
    _RAW_EXTRA,
)


@dataclass(frozen=True, slots=True)
class _Scope:
    row_id: int
    user_id: str | None
    agent_name: str | None
    live: int


class LiveFactScan:
    """The live facts of ``identity``'s tenant (of ``user_id`` only, when given), scope by scope.

    ``total`` (facts) and ``scopes`` are known once constructed, before any fact is read, so a
    progress bar has its end; iterating yields lists of ``ScopeFacts``, one list per batch.
    """

    def __init__(self, engine: Engine, identity: Identity, user_id: str | None, *, batch_facts: int) -> None:
        self._engine = engine
        self._identity = replace(identity, user_id=user_id)
        self._batch_facts = max(1, batch_facts)
        self._scopes = self._list_scopes(user_id)

    @property
    def scopes(self) -> int:
        return len(self._scopes)

    @property
    def total(self) -> int:
        return sum(scope.live for scope in self._scopes)

    def _list_scopes(self, user_id: str | None) -> list[_Scope]:
        """Every scope of the tenant with its live fact count, in ``list_scopes``' order."""
        # Correlated, so a run for one user counts that user's facts only (the scope_id index).
        live = (
            select(func.count())
            .where(_facts.c.scope_id == _scopes.c.id, _LIVE)
            .correlate(_scopes)
            .scalar_subquery()
        )
        query = (
            select(_scopes.c.id, _scopes.c.user_id, _scopes.c.agent_name, live.label("live"))
            .where(_scopes.c.tenant_id == self._identity.tenant_id)
            .order_by(func.coalesce(_scopes.c.user_id, _EMPTY), func.coalesce(_scopes.c.agent_name, _EMPTY))
        )
        if user_id is not None:
            query = query.where(user_is(user_id))
        with reading(self._engine, self._engine, self._identity) as conn:
            return [
                _Scope(row.id, row.user_id, row.agent_name, int(row.live or 0)) for row in conn.execute(query)
            ]

    def __iter__(self) -> Iterator[list[ScopeFacts]]:
        batch: list[_Scope] = []
        size = 0
        for scope in self._scopes:
            if batch and size + scope.live > self._batch_facts:
                yield self._read(batch)
                batch, size = [], 0
            batch.append(scope)
            size += scope.live
        if batch:
            yield self._read(batch)

    def _read(self, batch: Sequence[_Scope]) -> list[ScopeFacts]:
        """One short read: the live facts of ``batch``'s scopes, each scope's in document order."""
        found: dict[int, ScopeFacts] = {
            scope.row_id: ScopeFacts(scope.user_id, scope.agent_name, [], []) for scope in batch
        }
        wanted = [scope.row_id for scope in batch if scope.live]
        if wanted:
            query = (
                select(*_FACT_COLUMNS)
                .where(_facts.c.tenant_id == self._identity.tenant_id, _facts.c.scope_id.in_(wanted), _LIVE)
                .order_by(_facts.c.scope_id, _facts.c.position)
            )
            with reading(self._engine, self._engine, self._identity) as conn:
                rows = conn.execute(query).all()
            for row in rows:
                scope_facts = found[row[0]]
                candidate, content = _candidate(*row[1:])
                scope_facts.candidates.append(candidate)
                scope_facts.contents.append(content)
        return list(found.values())


def _candidate(
    fact_id: str,
    content: str,
    category: str,
    confidence: float,
    created_at: datetime | None,
    importance: float,
    last_confirmed_at: datetime | None,
    last_accessed_at: datetime | None,
    access_count: int,
    raw_extra: object,
) -> tuple[Candidate, str]:
    """A row as ``candidate_of`` reads the fact ``reload`` makes of it, and the fact's text."""
    signals = (
        FactSignals(as_utc(last_confirmed_at), as_utc(last_accessed_at), int(access_count))
        if last_confirmed_at is not None or last_accessed_at is not None or access_count
        else NO_SIGNALS  # most facts: one shared object instead of 100,000 equal ones
    )
    if isinstance(raw_extra, dict) and RESERVED_KEY in raw_extra:
        record = None if importance == DEFAULT_IMPORTANCE else Record(default_type(category), importance)
        values = FactValues(
            fact_id, content, category, confidence, as_utc(created_at), None, None, raw_extra, record=record
        )
        fact = decode_fact(values)  # grants and sources aside: a candidate reads neither
        return candidate_of(fact, {fact_id: signals}), str(fact.get("content", ""))
    return candidate_from(fact_id, category, confidence, as_utc(created_at), signals, importance), content
