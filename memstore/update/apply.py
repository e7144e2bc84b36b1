"""Applies a normalised update to a memory document, in the reference's order.

Order: section summaries, ``factsToRemove``, stale removals (``staleness.py``), new facts,
similarity dedup (the caller's ``fold``, ``similarity.py``), eviction at ``max_facts``
(``evict_to_cap``), consolidation (``consolidation.py``), upload scrubbing. Dedup runs before the
cap so that a paraphrase folded away never costs a stored fact its place. A new fact that
re-states a live one (same ``fact_content_key``) is not added; the live fact's id is reported as
confirmed, so the store can record that it is still true. Work
happens on a deep copy so a failure (or a failed save later) never touches the caller's
document, which may be a storage cache (``_copy_document``: JSON-shaped values copied without
``copy.deepcopy``'s bookkeeping, which was half of an update's work at 10,000 facts); unknown
top-level keys such as a provider's ``revision`` ride along untouched.

Confidence of new facts is clamped to [0, 1] with ``coerce_confidence``. The reference
stores an LLM's 1.5 as-is, but our document format and the SQL ``CHECK`` require finite
values in range, so 1.5 is stored as 1.0 and -0.2 as 0.0 (and is then below threshold).

A new fact below ``fact_confidence_threshold``, or whose importance (its own, else the default
0.5) is below ``fact_importance_threshold``, is not added. A kept fact carries the record fields
the extractor gave it (``fields.stored_fields``: only those that differ from the default, less
any ``raw``, ``structured`` or tag that mentions an upload: ``uploads.scrub_record_fields``) and a
``supersedes`` relation to each fact it ``replaces`` that was in the document. The facts it
``replaces`` are removed only then: a replacement that is not added (below a threshold, or a
re-statement of a live fact) removes nothing, so "replace X with Y" never becomes "forget X". A
replacement added and then folded into a kept fact (``similarity.py``) hands its ``supersedes``
relations to that fact, which now holds what it said.

``shown`` (the ids the update prompt showed, when it showed a subset: ``prompt.shown_fact_ids``)
confines the reply's hands to those facts: a ``factsToRemove``, ``replaces``,
``staleFactsToRemove`` or consolidation source naming any other id is ignored (the merge as a
whole), so a fact the model never saw is never removed on its word. Eviction at the cap is not
the model's word and still ranks every fact.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from memstore.config import MemoryConfig
from memstore.document import (
    SECTION_GROUPS,
    MemoryDocument,
    coerce_confidence,
    fact_content_key,
    format_timestamp,
    new_fact_id,
    without_ids,
)
from memstore.errors import MalformedMemoryError
from memstore.retention import NO_SIGNALS, FactSignals, RetentionPolicy, candidate_of
from memstore.update.consolidation import apply_consolidations
from memstore.update.fields import (
    SUPERSEDES,
    effective_importance,
    stored_fields,
    with_relations,
)
from memstore.update.parser import MemoryUpdate, NewFact
from memstore.update.similarity import Fold, SimilarFolds
from memstore.update.staleness import stale_ids_to_remove
from memstore.update.uploads import scrub_record_fields, strip_upload_mentions

logger = logging.getLogger(__name__)


_SCALARS = frozenset({str, int, float, bool, type(None)})


def _copy_document(value: Any) -> Any:
    """A deep copy: plain dicts and lists rebuilt, immutable scalars shared, anything else
    (a dict subclass, a foreign object) through ``copy.deepcopy``."""
    kind = type(value)
    if kind is dict:
        return {key: item if type(item) in _SCALARS else _copy_document(item) for key, item in value.items()}
    if kind is list:
        return [item if type(item) in _SCALARS else _copy_document(item) for item in value]
    return value if kind in _SCALARS else copy.deepcopy(value)


def _require_shape(memory: MemoryDocument) -> None:
    """Fill missing containers and refuse wrong-typed ones before anything is changed."""
    if not isinstance(memory, dict):
        raise MalformedMemoryError(f"memory document is a {type(memory).__name__}, not an object")
    for group in SECTION_GROUPS:
        if not isinstance(memory.setdefault(group, {}), dict):
            raise MalformedMemoryError(f"memory document field {group!r} is not an object")
    facts = memory.setdefault("facts", [])
    if not isinstance(facts, list):
        raise MalformedMemoryError("memory document field 'facts' is not a list")
    for index, fact in enumerate(facts):
        if not isinstance(fact, dict):
            raise MalformedMemoryError(f"memory document fact #{index} is not an object")


def _apply_sections(memory: MemoryDocument, update: MemoryUpdate, now: str) -> None:
    for group in SECTION_GROUPS:
        changes = update["user"] if group == "user" else update["history"]
        for name, change in changes.items():
            if change["shouldUpdate"] and change["summary"]:
                memory[group][name] = {"summary": change["summary"], "updatedAt": now}


def _add_new_facts(
    memory: MemoryDocument,
    update: MemoryUpdate,
    *,
    thread_id: str | None,
    config: MemoryConfig,
    now: str,
    taken_ids: set[str],
    stored_ids: set[str],
) -> list[str]:
    """Append the new facts that pass, and remove the stored facts they replace; the ids of live
    facts that a passing new fact re-stated."""
    facts: list[dict[str, Any]] = memory["facts"]
    live: dict[str, str | None] = {}
    for existing in facts:
        if isinstance(content := existing.get("content"), str) and content.strip():
            existing_id = existing.get("id")
            live.setdefault(fact_content_key(content), existing_id if isinstance(existing_id, str) else None)
    seen = set(live)
    confirmed: dict[str, None] = {}
    superseded: set[str] = set()
    for new in update["newFacts"]:
        confidence = coerce_confidence(new["confidence"])
        key = fact_content_key(new["content"])
        if confidence < config.fact_confidence_threshold or not key:
            continue
        if effective_importance(new) < config.fact_importance_threshold:
            continue
        if key in seen:
            if (restated := live.get(key)) is not None:
                confirmed[restated] = None
            continue
        seen.add(key)
        fact_id = new_fact_id(taken_ids)
        taken_ids.add(fact_id)
        fact: dict[str, Any] = {
            "id": fact_id,
            "content": new["content"].strip(),
            "category": new["category"],
            "confidence": confidence,
            "createdAt": now,
            "source": thread_id or "unknown",
        }
        source_error = new.get("sourceError", "").strip()
        if source_error:
            fact["sourceError"] = source_error
        fact.update(stored_fields(new, new["category"]))
        scrub_record_fields(fact)
        replaced = [fid for fid in new.get("replaces", []) if fid in stored_ids]
        with_relations(fact, [{"type": SUPERSEDES, "target": fid} for fid in replaced])
        superseded.update(replaced)
        facts.append(fact)
    if superseded:
        _remove_ids(memory, superseded)
    return list(confirmed)


def _remove_ids(memory: MemoryDocument, ids: Collection[str]) -> None:
    memory["facts"] = without_ids(memory["facts"], ids)


def evict_to_cap(
    facts: list[dict[str, Any]],
    config: MemoryConfig,
    signals: Mapping[str, FactSignals] | None = None,
    now: datetime | None = None,
) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """The facts kept at ``config.max_facts`` and the audit detail of each evicted fact, by id.

    Ranking is ``RetentionPolicy.select`` (``memstore.retention``) with each fact's stored
    ``signals``. Under the cap, ``facts`` comes back as it is. Over it, the ``confidence``
    policy returns the survivors most confident first (ties in document order), as the
    reference's trim does; ``hybrid`` keeps the survivors in document order, so evicting a few
    facts never reshuffles the rest (nothing reads the order as a rank: injection and search
    sort for themselves). An evicted fact without a string id has no audit entry.
    """
    if len(facts) <= config.max_facts:
        return facts, {}
    signals = signals or {}
    moment = now or datetime.now(UTC)
    candidates = [candidate_of(fact, signals, index) for index, fact in enumerate(facts)]
    policy = RetentionPolicy.of(config)
    kept, evicted = policy.select(candidates, config.max_facts, moment)
    if policy.policy == "confidence":
        kept.sort(key=lambda index: -candidates[index].confidence)
    removals = {
        facts[index]["id"]: score.detail("evicted", policy=policy.policy, max_facts=config.max_facts)
        for index, score in evicted.items()
        if isinstance(facts[index].get("id"), str)
    }
    return [facts[index] for index in kept], removals


def _within_shown(update: MemoryUpdate, shown: Collection[str]) -> MemoryUpdate:
    """``update`` without the removals, replacements and merges of facts outside ``shown``."""
    visible = set(shown)
    hidden = set(update["factsToRemove"]) - visible
    facts: list[NewFact] = []
    for new in update["newFacts"]:
        replaces = new.get("replaces") or []
        if not visible.issuperset(replaces):
            hidden.update(set(replaces) - visible)
            new = new.copy()
            new["replaces"] = [fid for fid in replaces if fid in visible]
        facts.append(new)
    hidden.update(r["id"] for r in update["staleFactsToRemove"] if r["id"] not in visible)
    merges = []
    for merge in update["factsToConsolidate"]:
        outside = set(merge["sourceIds"]) - visible
        hidden.update(outside)
        if not outside:
            merges.append(merge)
    if hidden:
        logger.info("the update named %d fact(s) its prompt did not show; they are left alone", len(hidden))
    return {
        **update,
        "newFacts": facts,
        "factsToRemove": [fid for fid in update["factsToRemove"] if fid in visible],
        "staleFactsToRemove": [r for r in update["staleFactsToRemove"] if r["id"] in visible],
        "factsToConsolidate": merges,
    }


@dataclass(frozen=True, slots=True)
class AppliedUpdate:
    """The updated document, plus what the store should record about it.

    ``removals``: fact id to audit detail for every fact the update removed for a reason other
    than ``factsToRemove`` (``stale``, ``consolidated``, ``evicted``). ``confirmed``: ids of facts
    still in ``memory`` that a new fact re-stated (the re-statement itself is not added).
    """

    memory: MemoryDocument
    removals: dict[str, dict[str, Any]]
    confirmed: list[str]
    folds: SimilarFolds


def apply_updates(
    memory: MemoryDocument,
    update: MemoryUpdate,
    *,
    thread_id: str | None,
    config: MemoryConfig,
    signals: Mapping[str, FactSignals] | None = None,
    now: datetime | None = None,
    fold: Fold | None = None,
    shown: Collection[str] | None = None,
) -> AppliedUpdate:
    """``memory`` with ``update`` applied, folded, capped, consolidated and scrubbed, as a new document.

    ``signals`` are the store's retention signals by fact id, for the cap's ranking; a fact
    re-stated by this update, or one a new fact was folded into, counts as confirmed at ``now``
    there. ``fold`` (``fold_similar`` bound to an embedder) drops new facts that repeat a kept one.
    ``shown``: the only fact ids the reply may remove, replace or merge (``None``: any).
    """
    if shown is not None:
        update = _within_shown(update, shown)
    updated = _copy_document(memory)
    _require_shape(updated)
    moment = now or datetime.now(UTC)
    stamp = format_timestamp(moment)
    stored_ids = {fact["id"] for fact in updated["facts"] if isinstance(fact.get("id"), str)}
    taken_ids = set(stored_ids)
    _apply_sections(updated, update, stamp)
    if update["factsToRemove"]:
        _remove_ids(updated, set(update["factsToRemove"]))
    removals: dict[str, dict[str, Any]] = {}
    stale = stale_ids_to_remove(updated, update["staleFactsToRemove"], config, moment)
    if stale:
        _remove_ids(updated, stale)
        removals.update({fact_id: {"reason": "stale", "llm_reason": why} for fact_id, why in stale.items()})
    confirmed = _add_new_facts(
        updated,
        update,
        thread_id=thread_id,
        config=config,
        now=stamp,
        taken_ids=taken_ids,
        stored_ids=stored_ids,
    )
    folds = fold(memory, updated) if fold is not None else SimilarFolds(updated)
    updated = folds.memory
    ranked = dict(signals or {})
    for fact_id in [*confirmed, *folds.folded]:
        ranked[fact_id] = replace(ranked.get(fact_id, NO_SIGNALS), last_confirmed_at=moment)
    updated["facts"], evicted = evict_to_cap(updated["facts"], config, ranked, moment)
    removals.update(evicted)
    removals.update(apply_consolidations(updated, update["factsToConsolidate"], config, moment))
    strip_upload_mentions(updated)
    live = {fact["id"] for fact in updated["facts"] if isinstance(fact.get("id"), str)}
    # A new fact evicted at once was never stored, so there is nothing to audit.
    audited = {fact_id: detail for fact_id, detail in removals.items() if fact_id in stored_ids}
    # A fold target this update removed (consolidated, evicted) has its own audit: drop the fold.
    folds = replace(folds, memory=updated, folded={k: v for k, v in folds.folded.items() if k in live})
    return AppliedUpdate(updated, audited, [fact_id for fact_id in confirmed if fact_id in live], folds)
