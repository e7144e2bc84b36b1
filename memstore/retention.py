"""Which facts memory keeps: the score that evicts at ``max_facts`` and the decay that expires.

Both read the same three signals of a fact (``FactSignals``): its confidence, when it was last
confirmed (re-stated by the extractor; creation counts as half a confirmation) and how often and
how recently it was injected or found by search. The storage cap, the updater's trim, manual
creates and ``memstore lifecycle run`` all rank with this one module, so they always agree.

- **Eviction score** (``hybrid``, DeerFlow's ``hybrid-v1``): ``w_c * confidence + w_f * freshness
  + w_a * heat``, where freshness halves every ``confirmation_half_life_days`` since the last
  confirmation (half of that since creation for a fact never confirmed), and heat is
  ``log1p(access_count * 2^(-days since last access / access_half_life_days)) / log(9)`` capped
  at 1 (eight recent accesses saturate it). ``confidence`` ranks by confidence alone.
- **Reserved slots**: at the cap, up to ``min(eviction_reserved_max, ceil(max_facts *
  eviction_reserved_fraction))`` facts of the guaranteed categories are kept first, best score
  first; unused slots go back to ordinary competition.
- **Decay score** (the design's ``decay_score``): ``confidence * max(freshness, heat)``, with
  freshness counted from the last confirmation or, failing that, creation (not halved), over a
  half-life stretched by importance (``confirmation_half_life_days * (0.5 + importance)``: the
  default importance 0.5 leaves it as configured, 1.0 makes it 1.5 times as long). It falls
  towards zero for a fact nobody re-states or uses; ``expire_below`` removes facts under it,
  never protected categories.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from memstore.config import MemoryConfig
from memstore.document import coerce_confidence, parse_timestamp
from memstore.record import DEFAULT_IMPORTANCE, IMPORTANCE_KEY

_SECONDS_PER_DAY = 86_400.0
_HEAT_SATURATION = math.log(9.0)


@dataclass(frozen=True, slots=True)
class FactSignals:
    """What the store knows about a fact besides its content; ``None`` for never."""

    last_confirmed_at: datetime | None = None
    last_accessed_at: datetime | None = None
    access_count: int = 0


NO_SIGNALS = FactSignals()


@dataclass(frozen=True, slots=True)
class Candidate:
    """One fact as the retention rules see it."""

    fact_id: str
    category: str
    confidence: float
    created_at: datetime | None
    signals: FactSignals = NO_SIGNALS
    importance: float = DEFAULT_IMPORTANCE


@dataclass(frozen=True, slots=True)
class Score:
    """A fact's score and the parts it is made of, for ranking and for the audit trail."""

    value: float
    confidence: float
    freshness: float
    heat: float

    def detail(self, reason: str, **extra: Any) -> dict[str, Any]:
        """The audit ``detail`` of a removal this score decided."""
        return {
            "reason": reason,
            "score": round(self.value, 6),
            "confidence": round(self.confidence, 6),
            "freshness": round(self.freshness, 6),
            "heat": round(self.heat, 6),
            **extra,
        }


_FUTURE_TOLERANCE = timedelta(days=1)


def _half_life_decay(since: datetime | None, now: datetime, half_life_days: float) -> float:
    """``2^(-days since / half-life)``; an instant more than a day ahead is bogus and counts as never."""
    if since is None or since > now + _FUTURE_TOLERANCE:
        return 0.0
    elapsed_days = max(0.0, (now - since).total_seconds() / _SECONDS_PER_DAY)
    return float(2.0 ** (-elapsed_days / half_life_days))


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """The retention settings of a ``MemoryConfig``, with the rules that use them."""

    policy: str
    confidence_weight: float
    confirmation_weight: float
    access_weight: float
    confirmation_half_life_days: float
    access_half_life_days: float
    reserved_categories: frozenset[str]
    reserved_fraction: float
    reserved_max: int
    protected_categories: frozenset[str]
    expire_below: float | None

    @classmethod
    def of(cls, config: MemoryConfig) -> RetentionPolicy:
        return cls(
            policy=config.eviction_policy,
            confidence_weight=config.eviction_confidence_weight,
            confirmation_weight=config.eviction_confirmation_weight,
            access_weight=config.eviction_access_weight,
            confirmation_half_life_days=config.confirmation_half_life_days,
            access_half_life_days=config.access_half_life_days,
            reserved_categories=frozenset(config.guaranteed_categories),
            reserved_fraction=config.eviction_reserved_fraction,
            reserved_max=config.eviction_reserved_max,
            protected_categories=frozenset(config.staleness_protected_categories),
            expire_below=config.expire_below,
        )

    def _freshness(
        self, fact: Candidate, now: datetime, *, creation_weight: float, stretch: float = 1.0
    ) -> float:
        half_life = self.confirmation_half_life_days * stretch
        confirmed = fact.signals.last_confirmed_at
        if confirmed is not None:
            return _half_life_decay(confirmed, now, half_life)
        return creation_weight * _half_life_decay(fact.created_at, now, half_life)

    def _heat(self, fact: Candidate, now: datetime) -> float:
        signals = fact.signals
        if signals.access_count <= 0 or signals.last_accessed_at is None:
            return 0.0
        decayed = signals.access_count * _half_life_decay(
            signals.last_accessed_at, now, self.access_half_life_days
        )
        return min(1.0, math.log1p(decayed) / _HEAT_SATURATION)

    def score(self, fact: Candidate, now: datetime) -> Score:
        """The eviction score of ``fact`` at ``now`` (higher is kept)."""
        confidence = coerce_confidence(fact.confidence)
        if self.policy == "confidence":
            return Score(confidence, confidence, 0.0, 0.0)
        freshness = self._freshness(fact, now, creation_weight=0.5)
        heat = self._heat(fact, now)
        value = (
            self.confidence_weight * confidence
            + self.confirmation_weight * freshness
            + self.access_weight * heat
        )
        return Score(value, confidence, freshness, heat)

    def decay(self, fact: Candidate, now: datetime) -> Score:
        """The decay score of ``fact`` at ``now``: ``confidence * max(freshness, heat)``."""
        return Score(*self._decay_parts(fact, now))

    def _decay_parts(self, fact: Candidate, now: datetime) -> tuple[float, float, float, float]:
        """``decay``'s value and parts, without the ``Score`` a fact that stays does not need."""
        confidence = _unit(fact.confidence, 0.5)
        stretch = 0.5 + _unit(fact.importance, DEFAULT_IMPORTANCE)
        freshness = self._freshness(fact, now, creation_weight=1.0, stretch=stretch)
        heat = self._heat(fact, now)
        return confidence * max(freshness, heat), confidence, freshness, heat

    def select(
        self, facts: Sequence[Candidate], max_facts: int, now: datetime
    ) -> tuple[list[int], dict[int, Score]]:
        """Indexes of the facts kept at the cap, in their original order, and the evicted ones' scores.

        Ranking is stable: equal scores keep the earlier fact. With nothing over the cap, every
        index is kept and nothing is scored.
        """
        if len(facts) <= max_facts:
            return list(range(len(facts))), {}
        scores = [self.score(fact, now) for fact in facts]
        ranked = sorted(range(len(facts)), key=lambda index: -scores[index].value)
        kept: set[int] = set()
        if self.policy == "hybrid" and self.reserved_categories:
            slots = min(self.reserved_max, math.ceil(max_facts * self.reserved_fraction), max_facts)
            reserved = [
                index for index in ranked if facts[index].category.strip() in self.reserved_categories
            ]
            kept.update(reserved[:slots])
        for index in ranked:
            if len(kept) >= max_facts:
                break
            kept.add(index)
        evicted = {index: scores[index] for index in range(len(facts)) if index not in kept}
        return sorted(kept), evicted

    def expiring(self, facts: Sequence[Candidate], now: datetime) -> dict[int, Score]:
        """Indexes and decay scores of the facts under ``expire_below`` (none when it is unset)."""
        if self.expire_below is None:
            return {}
        found: dict[int, Score] = {}
        for index, fact in enumerate(facts):
            if fact.category.strip() in self.protected_categories:
                continue
            parts = self._decay_parts(fact, now)
            if parts[0] < self.expire_below:
                found[index] = Score(*parts)
        return found


def candidate_of(fact: dict[str, Any], signals: Mapping[str, FactSignals], index: int = 0) -> Candidate:
    """A document fact as a ``Candidate``, with its entry of ``signals`` (a scope's, by fact id).

    An id-less fact gets a placeholder id from its index, and no signals.
    """
    fact_id = fact.get("id")
    return candidate_from(
        fact_id if isinstance(fact_id, str) else f"#{index}",
        fact.get("category"),
        fact.get("confidence"),
        parse_timestamp(fact.get("createdAt")),
        signals.get(fact_id, NO_SIGNALS) if isinstance(fact_id, str) else NO_SIGNALS,
        fact.get(IMPORTANCE_KEY),
    )


def candidate_from(
    fact_id: str,
    category: object,
    confidence: object,
    created_at: datetime | None,
    signals: FactSignals,
    importance: object,
) -> Candidate:
    """A fact's stored values as a ``Candidate``, read the way ``candidate_of`` reads a document's:
    a blank or missing category is ``context``, and garbage confidence and importance rank as the
    defaults. The lifecycle's scan builds candidates from table columns with it, without a document."""
    return Candidate(
        fact_id=fact_id,
        category=category.strip() if isinstance(category, str) and category.strip() else "context",
        confidence=_unit(confidence, 0.5),
        created_at=created_at,
        signals=signals,
        importance=_unit(importance, DEFAULT_IMPORTANCE),
    )


def _unit(value: object, default: float) -> float:
    """``coerce_confidence``, skipping its checks for the float in [0, 1] a column holds (the
    lifecycle scores 100,000 facts in one run)."""
    if type(value) is float and 0.0 <= value <= 1.0:
        return value
    return coerce_confidence(value, default)


@dataclass(frozen=True, slots=True)
class ScopeFacts:
    """One scope's live facts as the retention rules see them, in document order, with their text."""

    user_id: str | None
    agent_name: str | None
    candidates: list[Candidate]
    contents: list[str]
    unnamed: frozenset[int] = frozenset()
    """Indexes of facts without an id (a document another tool wrote): scored, but no removal can
    name them."""
