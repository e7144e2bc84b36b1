"""Value types of the query and operations surface, shared by the providers and the CLI.

They are plain frozen dataclasses so that SQL rows, file scans, ``--json`` output and the
HTTP layer all speak the same shapes without importing a storage backend.
"""

from __future__ import annotations

import enum
import math
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

from memstore.document import VISIBILITIES, as_utc, format_timestamp
from memstore.errors import InvalidFactError, QueryError
from memstore.record import (
    DEFAULT_IMPORTANCE,
    DEFAULT_SOURCE_KIND,
    FALLBACK_TYPE,
    MEMORY_TYPES,
    SOURCE_KINDS,
    checked_tag,
)
from memstore.retention import Candidate, FactSignals, RetentionPolicy
from memstore.scope import Scope, normalize_agent_name, validate_user_id


class _AnyAgent(enum.Enum):
    ANY = "any"


ANY_AGENT = _AnyAgent.ANY
"""Agent filter meaning "every agent and the user's own memory" (``None`` means the latter only)."""

AgentFilter = str | None | _AnyAgent

MAX_PAGE_SIZE = 1000
MAX_SCORED_FACTS = 100_000
"""Ordering by score reads every matching fact: past this many, the query must be narrowed."""

FactOrder = Literal["newest", "score", "last_accessed", "access_count"]
FACT_ORDERS: tuple[FactOrder, ...] = ("newest", "score", "last_accessed", "access_count")
SearchMode = Literal["fulltext", "semantic", "hybrid"]
SEARCH_MODES: tuple[SearchMode, ...] = ("fulltext", "semantic", "hybrid")


@dataclass(frozen=True)
class FactFilter:
    """Which facts a query covers. Every field narrows; the default covers every live fact.

    ``user_id=None`` means every user. ``text`` is a case-insensitive substring filter; ranked
    full-text search is a separate call (``search_facts``). Naive datetimes are taken as UTC, and
    aware ones are converted to UTC.
    """

    user_id: str | None = None
    agent_name: AgentFilter = ANY_AGENT
    category: str | None = None
    min_confidence: float | None = None
    text: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    visibility: str | None = None
    """``private``, ``shared`` or ``public``: only facts with that visibility."""
    memory_type: str | None = None
    """Only facts of this record type (``memstore.record.MEMORY_TYPES``)."""
    tag: str | None = None
    """Only facts carrying this tag (exactly, after stripping)."""
    min_importance: float | None = None
    source_kind: str | None = None
    """Only facts of this source kind (``memstore.record.SOURCE_KINDS``)."""
    fact_id: str | None = None
    """Only the fact with this id (one per scope: the same id may exist in several scopes)."""

    def __post_init__(self) -> None:
        validate_user_id(self.user_id)
        if self.visibility is not None and self.visibility not in VISIBILITIES:
            raise QueryError(f"visibility must be one of {', '.join(VISIBILITIES)}, got {self.visibility!r}")
        if isinstance(self.agent_name, str):
            object.__setattr__(self, "agent_name", normalize_agent_name(self.agent_name))
        _check_fraction("min_confidence", self.min_confidence)
        _check_fraction("min_importance", self.min_importance)
        if self.memory_type is not None and self.memory_type not in MEMORY_TYPES:
            raise QueryError(
                f"memory_type must be one of {', '.join(MEMORY_TYPES)}, got {self.memory_type!r}"
            )
        if self.source_kind is not None and self.source_kind not in SOURCE_KINDS:
            raise QueryError(
                f"source_kind must be one of {', '.join(SOURCE_KINDS)}, got {self.source_kind!r}"
            )
        if self.fact_id is not None and not (isinstance(self.fact_id, str) and 0 < len(self.fact_id) <= 64):
            raise QueryError("fact_id must be an id of 1 to 64 characters")
        if self.tag is not None:
            try:
                object.__setattr__(self, "tag", checked_tag(self.tag))
            except InvalidFactError as exc:
                raise QueryError(f"tag: {exc.message.partition(': ')[2]}") from None
        # Normalised to UTC here, at the boundary: SQLite stores UTC stamps without an offset and
        # compares them as text, so an instant given with +08:00 must be converted, not relabelled.
        for name in ("created_after", "created_before"):
            object.__setattr__(self, name, as_utc(getattr(self, name)))
        if self.created_after and self.created_before and self.created_after > self.created_before:
            raise QueryError("created_after is later than created_before")

    def matches_scope(self, scope: Scope) -> bool:
        user_id, agent_name = scope
        if self.user_id is not None and user_id != self.user_id:
            return False
        return self.agent_name is ANY_AGENT or agent_name == self.agent_name


def _check_fraction(name: str, value: object) -> None:
    if value is not None and not (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 <= value <= 1
    ):
        raise QueryError(f"{name} must be between 0 and 1, got {value!r}")


def check_paging(limit: int, offset: int) -> None:
    if not 1 <= limit <= MAX_PAGE_SIZE:
        raise QueryError(f"limit must be between 1 and {MAX_PAGE_SIZE}, got {limit}")
    if offset < 0:
        raise QueryError(f"offset must not be negative, got {offset}")


@dataclass(frozen=True)
class FactRecord:
    """One live fact with the scope it belongs to; ``rank`` is set by full-text search (higher is better).

    The retention signals are read-only: ``score`` is the eviction score under the configured
    policy at query time (``memstore.retention``), which ``max_facts`` keeps the highest of, and
    ``decay`` the decay score at the same time. The record fields (``memstore.record``) read as
    their defaults for a fact that sets none; ``version`` counts the fact's changes where the
    provider keeps them (SQL), and is 1 elsewhere.
    """

    user_id: str | None
    agent_name: str | None
    fact_id: str
    content: str
    category: str
    confidence: float
    created_at: datetime | None
    source: str | None
    rank: float | None = None
    last_confirmed_at: datetime | None = None
    last_accessed_at: datetime | None = None
    access_count: int = 0
    score: float | None = None
    visibility: str = "private"
    """``private`` (the user's own), ``shared`` or ``public``: who else in the tenant reads it."""
    memory_type: str = FALLBACK_TYPE
    importance: float = DEFAULT_IMPORTANCE
    tags: tuple[str, ...] = ()
    source_kind: str = DEFAULT_SOURCE_KIND
    raw: str | None = None
    structured: dict[str, Any] | None = None
    version: int = 1
    decay: float | None = None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for name in ("created_at", "last_confirmed_at", "last_accessed_at"):
            data[name] = iso(getattr(self, name))
        data["tags"] = list(self.tags)
        return data

    def candidate(self) -> Candidate:
        signals = FactSignals(self.last_confirmed_at, self.last_accessed_at, self.access_count)
        return Candidate(
            self.fact_id, self.category, self.confidence, self.created_at, signals, self.importance
        )


def owners_words_kept(page: FactPage, reader: str | None) -> FactPage:
    """``page`` with another owner's ``raw`` and ``structured`` left out: sharing a fact shares its
    summary, never the words it came from (``reader`` None is an operator's listing, which keeps them)."""
    if reader is None or all(record.user_id == reader for record in page.facts):
        return page
    facts = [
        record if record.user_id == reader else replace(record, raw=None, structured=None)
        for record in page.facts
    ]
    return replace(page, facts=facts)


def with_scores(records: list[FactRecord], policy: RetentionPolicy, now: datetime) -> list[FactRecord]:
    """``records`` with ``score`` and ``decay`` filled in, in the same order."""
    scored = []
    for record in records:
        candidate = record.candidate()
        score, decay = policy.score(candidate, now).value, policy.decay(candidate, now).value
        scored.append(replace(record, score=round(score, 6), decay=round(decay, 6)))
    return scored


def by_score(records: list[FactRecord], policy: RetentionPolicy, now: datetime) -> list[FactRecord]:
    """Every record scored, highest score first (ties: the order given)."""
    if len(records) > MAX_SCORED_FACTS:
        raise QueryError(
            f"ordering by score reads every matching fact ({len(records)} match, at most "
            f"{MAX_SCORED_FACTS}); narrow the query, for example to one user or category"
        )
    scored = with_scores(records, policy, now)
    scored.sort(key=lambda record: -(record.score or 0.0))
    return scored


@dataclass(frozen=True)
class FactPage:
    """One page of a query plus the total number of matches, for paging UIs and scripts."""

    facts: list[FactRecord]
    total: int
    limit: int
    offset: int
    search_mode: str = "filter"
    """``filter`` (no text search), ``fulltext`` (index) or ``substring`` (index could not serve)."""

    @property
    def next_offset(self) -> int | None:
        following = self.offset + len(self.facts)
        return following if following < self.total else None

    def to_json(self) -> dict[str, Any]:
        return {
            "facts": [fact.to_json() for fact in self.facts],
            "total": self.total,
            "limit": self.limit,
            "offset": self.offset,
            "next_offset": self.next_offset,
            "search_mode": self.search_mode,
        }


@dataclass(frozen=True)
class MemoryStats:
    users: int
    scopes: int
    facts: int
    facts_by_category: dict[str, int] = field(default_factory=dict)
    database_bytes: int | None = None
    """Size on disk (SQLite file and WAL, PostgreSQL database, the file tree); None if unknown."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class HistoryEntry:
    """One audit row: a fact or section change with what it looked like before and after."""

    user_id: str | None
    agent_name: str | None
    revision: int
    changed_at: datetime
    entity: str
    entity_id: str
    action: str
    origin: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    detail: dict[str, Any] | None = None
    """Why a fact was deleted, when known: ``{"reason": "evicted", "score": ...}`` and the like."""
    version: int | None = None
    """The fact's version after this change (``None`` for sections and rows older than versions)."""

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["changed_at"] = iso(self.changed_at)
        return data


@dataclass(frozen=True)
class Relation:
    """One end of a relation as seen from a fact: its kind and the fact at the other end."""

    kind: str
    fact_id: str
    live: bool = True
    """Whether the fact at the other end is live (a superseded fact is usually deleted)."""


@dataclass(frozen=True)
class FactRelations:
    """A fact's relations both ways, within its scope: ``outgoing`` (this fact ``kind`` the
    other, e.g. it ``supersedes`` it) and ``incoming`` (the other fact ``kind`` this one)."""

    fact_id: str
    outgoing: list[Relation] = field(default_factory=list)
    incoming: list[Relation] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "fact_id": self.fact_id,
            "outgoing": [{"kind": r.kind, "target": r.fact_id, "live": r.live} for r in self.outgoing],
            "incoming": [{"kind": r.kind, "source": r.fact_id, "live": r.live} for r in self.incoming],
        }


def iso(value: datetime | None) -> str | None:
    return None if value is None else format_timestamp(value)
