"""Similarity dedup at insert: a new fact that means what a live fact says confirms it instead.

Exact duplicates (same content key) never reach the store; this catches paraphrases ("User likes
green tea" / "The user enjoys green tea"). A new fact whose cosine similarity to a live fact of
its scope, or to a new fact already kept in the same update, is at or above ``dedup_similarity``
is dropped; the fact it matched keeps the higher confidence, is stamped as confirmed, and the save
audits the fold with the similarity and the dropped text (``SimilarFold.detail``).

Guards beyond the rule: a fact in a guaranteed category (a correction) is folded only into a
fact of the same category, since "User does not like coffee" reads close to "User likes coffee"
to an embedding model and must not vanish into it; a consolidation's merged fact is never folded
(its sources are already gone). Live facts without a vector are embedded in the same call, so the
check never depends on whether the backfill has run.

Near-duplicates below the fold go to the LLM (``adjudication.py``) when an ``adjudicate`` is given
and ``adjudication_similarity`` is set: each new fact left after the folds whose closest stored
fact (private, not a fold target of this update, any category) scores at least
``adjudication_similarity`` makes a pair; a stored fact is in one pair at most (its closest), and
the ``adjudication_max_candidates`` closest pairs are asked about. ``skip`` and ``update`` are
audited like a fold (``reason`` ``adjudicated``, with the ``decision``), so the stored fact counts
as confirmed and a save that finds it deleted meanwhile starts over. A ``skip`` or ``update``
across the guarded-category line (a correction and a non-correction) is refused and both are
kept, as a fold would be: the model may neither drop a correction as a repeat of an ordinary fact
(or the reverse) nor turn one into the other. A new fact that other new facts were folded into and
that is then skipped or updated hands their fold audits to the stored fact it became (after a
``skip``, the stored fact also takes a folded fact's higher confidence, as a fold target does).
A new fact folded or skipped away hands its ``supersedes`` relations (``replaces``) to the fact it
was folded into, which now holds what it said. An ``update``
takes the new fact's wording (content, category, confidence, ``sourceError``, source kind, ``raw``,
``structured``) and its type, importance and tags where it states them; the stored fact keeps
its own otherwise, with its id, dates and relations.

Cost: the stored facts' vectors are stacked into one matrix once per update (``_VectorPool``), so
each new fact costs a matrix-vector product and a vectorised mask (the categories it may fold
into, the adjudication candidates); stacking the scope again for every new fact, in both passes,
cost 1.8 s for 20 new facts in a scope of 10,000.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memstore.config import MemoryConfig
from memstore.document import MemoryDocument, coerce_confidence
from memstore.embedding import Embedder
from memstore.record import IMPORTANCE_KEY, RAW_KEY, SOURCE_KIND_KEY, STRUCTURED_KEY, TAGS_KEY, TYPE_KEY
from memstore.scope import Scope
from memstore.storage.vectors import VectorStore
from memstore.update.adjudication import KEEP_BOTH, Adjudicate, NearPair
from memstore.update.fields import SUPERSEDES, with_relations

MAX_FOLDED_TEXT = 500
"""Characters of the dropped fact's text kept in the audit detail."""

CONSOLIDATION_SOURCE = "consolidation"
Fact = dict[str, Any]


@dataclass
class SimilarFolds:
    """What ``fold_similar`` decided: the document to save and what the save must record."""

    memory: MemoryDocument
    folded: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Kept fact id to the audit detail of each new fact folded into it."""
    vectors: list[tuple[str, str, np.ndarray]] = field(default_factory=list)
    """``(fact id, content, vector)`` computed here, to store once the save is durable."""


Fold = Callable[[MemoryDocument, MemoryDocument], SimilarFolds]
"""``fold_similar`` bound to an embedder and scope: (document before the update, after) -> folds."""


@dataclass(frozen=True)
class _Group:
    """The pool's facts whose vectors have one shape, and those vectors as one matrix."""

    facts: list[Fact]
    matrix: np.ndarray
    categories: np.ndarray
    guarded: np.ndarray


class _VectorPool:
    """Facts and their vectors, stacked once per vector shape (see the module doc)."""

    def __init__(
        self, facts: Sequence[Fact], vectors: dict[str, np.ndarray], guaranteed: frozenset[str] = frozenset()
    ) -> None:
        grouped: dict[tuple[int, ...], list[Fact]] = {}
        for fact in facts:
            grouped.setdefault(vectors[str(fact["id"])].shape, []).append(fact)
        self._guaranteed = guaranteed
        self._groups = {
            shape: _Group(
                members,
                # One flat concatenate: np.stack's per-array Python work costs more at this size.
                np.concatenate([vectors[str(fact["id"])] for fact in members]).reshape(len(members), -1),
                np.array([_category(fact) for fact in members], dtype=object),
                np.array([_category(fact) in guaranteed for fact in members], dtype=bool),
            )
            for shape, members in grouped.items()
        }

    def mask(self, keep: Callable[[Fact], bool]) -> dict[tuple[int, ...], np.ndarray]:
        """Which facts of each shape ``keep`` accepts, for ``closest``."""
        return {
            shape: np.array([keep(fact) for fact in group.facts], dtype=bool)
            for shape, group in self._groups.items()
        }

    def closest(
        self,
        vector: np.ndarray,
        allowed: dict[tuple[int, ...], np.ndarray] | None = None,
        folding: Fact | None = None,
    ) -> tuple[Fact, float] | None:
        """The fact most similar to ``vector`` (the first in order on ties) among those of its shape,
        ``allowed`` ones only, and only those ``folding`` may fold into (``_may_fold``) when given."""
        group = self._groups.get(vector.shape)
        if group is None:
            return None
        mask = allowed[vector.shape] if allowed is not None else np.ones(len(group.facts), dtype=bool)
        if folding is not None:
            category = _category(folding)
            may = group.categories == category
            if category not in self._guaranteed:
                may |= ~group.guarded
            mask = mask & may
        if not mask.any():
            return None
        scores = group.matrix @ vector
        best = int(np.argmax(np.where(mask, scores, -np.inf)))
        return group.facts[best], float(scores[best])


@dataclass(frozen=True)
class SimilarFact:
    fact_id: str
    similarity: float


def _category(fact: Fact) -> str:
    return str(fact.get("category") or "")


def _may_fold(new: Fact, into: Fact, guaranteed: frozenset[str]) -> bool:
    if _category(new) == _category(into):
        return True
    return _category(new) not in guaranteed and _category(into) not in guaranteed


def _content(fact: Fact) -> str | None:
    content = fact.get("content")
    return content if isinstance(content, str) and content.strip() else None


def scope_vectors(
    facts: Sequence[Fact], embedder: Embedder, store: VectorStore, scope: Scope
) -> tuple[dict[str, np.ndarray], list[tuple[str, str, np.ndarray]]]:
    """Vectors of ``facts`` by id: stored ones, plus the missing ones embedded now (also returned)."""
    named = [
        (fact["id"], text) for fact in facts if isinstance(fact.get("id"), str) and (text := _content(fact))
    ]
    known = store.fact_vectors(scope, embedder.model, named)
    missing = [(fact_id, text) for fact_id, text in named if fact_id not in known]
    made: list[tuple[str, str, np.ndarray]] = []
    if missing:
        matrix = embedder.embed_documents([text for _, text in missing])
        made = [(fact_id, text, matrix[row]) for row, (fact_id, text) in enumerate(missing)]
        known.update({fact_id: vector for fact_id, _, vector in made})
    return known, made


def fold_similar(
    current: MemoryDocument,
    memory: MemoryDocument,
    *,
    embedder: Embedder,
    store: VectorStore,
    scope: Scope,
    config: MemoryConfig,
    adjudicate: Adjudicate | None = None,
) -> SimilarFolds:
    """Fold the new facts of ``memory`` (ids not in ``current``) that repeat a kept fact, then
    apply ``adjudicate``'s decisions on the near-duplicates left (see the module doc)."""
    before = {fact.get("id") for fact in current.get("facts") or () if isinstance(fact, dict)}
    facts = [fact for fact in memory.get("facts") or () if isinstance(fact, dict)]
    new = [f for f in facts if f.get("id") not in before and f.get("source") != CONSOLIDATION_SOURCE]
    if not any(_content(fact) for fact in new):
        return SimilarFolds(memory)
    vectors, made = scope_vectors(facts, embedder, store, scope)
    guaranteed = frozenset(config.guaranteed_categories)
    new_ids = {id(fact) for fact in new}
    stored = _VectorPool(
        [fact for fact in facts if id(fact) not in new_ids and fact.get("id") in vectors], vectors, guaranteed
    )
    kept: list[Fact] = []  # new facts kept so far; they come after the stored ones, so a tie goes to those
    result = SimilarFolds(memory)
    dropped: set[int] = set()
    for fact in new:
        vector = vectors.get(fact.get("id"))  # type: ignore[arg-type]
        match = None
        if vector is not None:
            match = stored.closest(vector, folding=fact)
            repeat = _best_match(fact, vector, kept, vectors, guaranteed)
            if repeat is not None and (match is None or repeat[1] > match[1]):
                match = repeat
        if match is None or match[1] < config.dedup_similarity:
            if vector is not None:
                kept.append(fact)
            continue
        into, similarity = match
        dropped.add(id(fact))
        confidence = coerce_confidence(fact.get("confidence"), 0.0)
        if confidence > coerce_confidence(into.get("confidence"), 0.0):
            into["confidence"] = confidence
        result.folded.setdefault(str(into["id"]), []).append(
            _fold_detail("similar", similarity, embedder.model, fact, confidence)
        )
        with_relations(into, _supersedes(fact))
    moved: dict[str, str] = {}
    if adjudicate is not None and config.adjudication_similarity is not None:
        targets = stored.mask(
            lambda f: (
                f.get("id") in before
                and str(f["id"]) not in result.folded
                and f.get("visibility", "private") == "private"
            )
        )
        left = [f for f in new if id(f) not in dropped and f.get("id") in vectors]
        pairs = _near_pairs(left, stored, targets, vectors, config.adjudication_similarity)
        pairs = pairs[: config.adjudication_max_candidates]
        if pairs:
            decisions = adjudicate(pairs)
            moved = _apply_decisions(pairs, decisions, result, dropped, embedder.model, guaranteed)
    if dropped:
        memory = dict(memory)
        memory["facts"] = [fact for fact in facts if id(fact) not in dropped]
        result.memory = memory
    # Only vectors of what is stored now: not a dropped fact's, nor an updated fact's old text's.
    held = {f.get("id"): f.get("content") for f in result.memory.get("facts") or () if isinstance(f, dict)}
    made = [(moved.get(fact_id, fact_id), text, vector) for fact_id, text, vector in made]
    result.vectors = [item for item in made if item[0] in held and held[item[0]] == item[1]]
    return result


def _fold_detail(
    reason: str, similarity: float, model: str, fact: Fact, confidence: float, **extra: str
) -> dict[str, Any]:
    """The audit detail of a new fact folded into (or decided against) a stored one."""
    return {
        "reason": reason,
        **extra,
        "similarity": round(similarity, 4),
        "model": model,
        "content": str(fact.get("content"))[:MAX_FOLDED_TEXT],
        "confidence": confidence,
    }


def _near_pairs(
    new: Sequence[Fact],
    stored: _VectorPool,
    targets: dict[tuple[int, ...], np.ndarray],
    vectors: dict[str, np.ndarray],
    threshold: float,
) -> list[NearPair]:
    """Each new fact with its closest stored fact among ``targets`` (private, not a fold target) at
    or above ``threshold``; a stored fact in one pair at most (its closest); the closest pairs first."""
    pairs: list[NearPair] = []
    for fact in new:
        closest = stored.closest(vectors[str(fact["id"])], targets)
        if closest is not None and closest[1] >= threshold:
            pairs.append(NearPair(fact, closest[0], closest[1]))
    pairs.sort(key=lambda pair: -pair.similarity)
    taken: set[str] = set()
    chosen: list[NearPair] = []
    for pair in pairs:
        if str(pair.old["id"]) not in taken:
            taken.add(str(pair.old["id"]))
            chosen.append(pair)
    return chosen


def _apply_decisions(
    pairs: Sequence[NearPair],
    decisions: Sequence[str],
    result: SimilarFolds,
    dropped: set[int],
    model: str,
    guaranteed: frozenset[str],
) -> dict[str, str]:
    """Apply each pair's decision in place; returns new fact id to stored fact id for each ``update``."""
    moved: dict[str, str] = {}
    for pair, decision in zip(pairs, decisions, strict=True):
        old_id, new_id = str(pair.old["id"]), str(pair.new["id"])
        if decision in ("skip", "update") and not _may_fold(pair.new, pair.old, guaranteed):
            decision = KEEP_BOTH
        if decision == "contradicts":
            with_relations(pair.new, [{"type": "contradicts", "target": old_id}])
        if decision not in ("skip", "update"):
            continue
        confidence = coerce_confidence(pair.new.get("confidence"), 0.0)
        detail = _fold_detail("adjudicated", pair.similarity, model, pair.new, confidence, decision=decision)
        # New facts folded into this one follow it to the stored fact it became (audit and confidence).
        carried = result.folded.pop(new_id, [])
        result.folded.setdefault(old_id, []).extend([*carried, detail])
        dropped.add(id(pair.new))
        if decision == "update":
            _take_over(pair.old, pair.new)
            moved[new_id] = old_id
        else:
            folded_confidence = max(
                (d["confidence"] for d in carried if d["reason"] == "similar"), default=0.0
            )
            if folded_confidence > coerce_confidence(pair.old.get("confidence"), 0.0):
                pair.old["confidence"] = folded_confidence
            with_relations(pair.old, _supersedes(pair.new))
    return moved


def _supersedes(fact: Fact) -> list[dict[str, str]]:
    """``fact``'s ``supersedes`` relations: what a fact it is folded into takes over."""
    relations = fact.get("relations")
    return (
        [r for r in relations if isinstance(r, dict) and r.get("type") == SUPERSEDES]
        if isinstance(relations, list)
        else []
    )


_WORDING_KEYS = ("content", "category", "confidence", "sourceError", SOURCE_KIND_KEY, RAW_KEY, STRUCTURED_KEY)
"""What an ``update`` takes from the new fact, present or not: it belongs to the new wording."""
_DESCRIPTIVE_KEYS = (TYPE_KEY, IMPORTANCE_KEY, TAGS_KEY)
"""What it takes only when the new fact states it: otherwise the stored fact's own still holds."""


def _take_over(old: Fact, new: Fact) -> None:
    """``old`` (in place) with ``new``'s wording and stated fields, keeping its id, dates and relations."""
    for key in _WORDING_KEYS:
        if key in new:
            old[key] = new[key]
        else:
            old.pop(key, None)
    old.update({key: new[key] for key in _DESCRIPTIVE_KEYS if key in new})
    relations = new.get("relations")
    with_relations(old, relations if isinstance(relations, list) else [])


def _best_match(
    fact: Fact,
    vector: np.ndarray,
    kept: Sequence[Fact],
    vectors: dict[str, np.ndarray],
    guaranteed: frozenset[str],
) -> tuple[Fact, float] | None:
    candidates = [
        other
        for other in kept
        if _may_fold(fact, other, guaranteed) and vectors[str(other["id"])].shape == vector.shape
    ]
    if not candidates:
        return None
    scores = np.stack([vectors[str(other["id"])] for other in candidates]) @ vector
    best = int(np.argmax(scores))
    return candidates[best], float(scores[best])


def most_similar(
    content: str,
    category: str,
    facts: Sequence[Fact],
    *,
    embedder: Embedder,
    store: VectorStore,
    scope: Scope,
    config: MemoryConfig,
) -> tuple[SimilarFact | None, np.ndarray]:
    """The live fact a manual create of ``content`` would repeat (at or above ``dedup_similarity``),
    if any, and the vector of ``content`` (to store once the fact is)."""
    vectors, made = scope_vectors(facts, embedder, store, scope)
    store.store_vectors(scope, embedder.model, made)
    vector = embedder.embed_documents([content])[0]
    guaranteed = frozenset(config.guaranteed_categories)
    pool = _VectorPool([fact for fact in facts if fact.get("id") in vectors], vectors, guaranteed)
    match = pool.closest(vector, folding={"content": content, "category": category})
    if match is None or match[1] < config.dedup_similarity:
        return None, vector
    return SimilarFact(str(match[0]["id"]), match[1]), vector
