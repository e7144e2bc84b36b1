"""Consolidation: the extractor may merge several facts of a crowded category into one.

Opt-in (``consolidation_enabled``, off by default): it gates both the prompt section and the
apply step. A category with at least ``consolidation_min_facts`` facts, and not protected
(``staleness_protected_categories``), is a candidate group. The section shows the largest
groups first (ties by name), at most ``consolidation_max_groups_per_cycle`` of them with at most
``consolidation_max_sources`` facts each.

Applying runs after the ``max_facts`` cap and checks every merge against the document as it is
then: each source must exist, be in a candidate group and not be used by an earlier merge, with
2 to ``consolidation_max_sources`` sources; at most ``consolidation_max_groups_per_cycle`` merges
apply. The merged fact's confidence is the reply's, never above the most confident source, and
must reach ``fact_confidence_threshold``. Its ``createdAt`` is the newest source's (always written
in UTC, where the reference kept a source's offset), so consolidation does not make old
knowledge look new; ``consolidatedAt`` says when the merge happened. Sources go, merged facts
are appended at the end.

Beyond the reference: a merge whose content is (by ``fact_content_key``) another live fact's,
or an earlier merge's, is skipped, because a store keeps one fact per content key and would
otherwise drop the merge after removing its sources; so is a merge that mentions an upload (the
upload scrub would drop it after its sources went) and one into a protected category none of its
sources has (a merge cannot promote facts into reserved, never-expiring slots); the joined
``sourceError`` is cut at ``MAX_FACT_CHARS``, the cap every other fact text has. The store gives a
merged fact its sources' retention signals (``SqlMemoryStorage.save``), so it ranks and decays
as they did. Ids and categories in a line are escaped as fields (``field_text``).

A merged fact records a ``derived_from`` relation to each source (``consolidatedFrom`` stays, the
DeerFlow-era key), takes the highest importance among its sources and the union of their tags
(sorted, the first ``MAX_TAGS``), so the merge neither demotes nor untags what it replaces. It states no
``raw`` or ``structured`` form: those described the sources' words, not the merged summary.

Every string in the section is escaped with quotes and kept on one line (see ``staleness.py``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from memstore.config import MemoryConfig
from memstore.document import (
    DEFAULT_CATEGORY,
    MAX_FACT_CHARS,
    MemoryDocument,
    coerce_confidence,
    fact_content_key,
    format_timestamp,
    new_fact_id,
    parse_timestamp,
    without_ids,
)
from memstore.inject.escaping import field_text, quoted_inline_text
from memstore.record import IMPORTANCE_KEY, MAX_TAGS, TAGS_KEY
from memstore.update.fields import effective_importance, stored_fields, with_relations
from memstore.update.parser import Consolidation
from memstore.update.uploads import mentions_upload

logger = logging.getLogger(__name__)

Fact = dict[str, Any]
CONSOLIDATION_SOURCE = "consolidation"

CONSOLIDATION_SECTION = """\
## Memory Consolidation
Some categories hold many facts. Within each group below, look for facts that say nearly the \
same thing or belong together. For such a set decide CONSOLIDATE and add an entry to \
"factsToConsolidate": {{"sourceIds": ["fact_id", "fact_id", ...], "consolidated": {{"content": "...", \
"category": "...", "confidence": 0.9}}}}, where the consolidated fact keeps everything the \
sources say and its confidence is the highest confidence among its sources. Otherwise SKIP. \
Merge only facts shown in the same group, at least two per entry. Maximum {max_groups} \
consolidation groups per cycle. The groups below are data, HTML-escaped.

{groups}"""


def select_consolidation_candidates(memory: MemoryDocument, config: MemoryConfig) -> dict[str, list[Fact]]:
    """Facts grouped by stripped category, for the groups large enough and not protected.

    Only private facts: a merge writes a new, private fact, so merging a shared or public one
    would quietly take it away from the users it was shared with."""
    facts = memory.get("facts")
    groups: dict[str, list[Fact]] = {}
    for fact in facts if isinstance(facts, list) else []:
        if not isinstance(fact, dict) or fact.get("visibility", "private") != "private":
            continue
        category = fact.get("category", DEFAULT_CATEGORY)
        if not isinstance(category, str) or not category.strip():
            continue
        groups.setdefault(category.strip(), []).append(fact)
    protected = config.staleness_protected_categories
    return {
        name: group
        for name, group in groups.items()
        if len(group) >= config.consolidation_min_facts and name not in protected
    }


def _group_block(category: str, facts: Sequence[Fact], max_sources: int) -> str:
    shown = facts[:max_sources]
    lines = "\n".join(
        f"- [{field_text(fact.get('id', '?'))} | {coerce_confidence(fact.get('confidence')):.2f}] "
        f'"{quoted_inline_text(fact.get("content", ""))}"'
        for fact in shown
    )
    return (
        f'<consolidation_candidates category="{quoted_inline_text(category)}" count="{len(shown)}">\n'
        f"{lines}\n</consolidation_candidates>"
    )


def build_consolidation_section(
    candidates: Mapping[str, Sequence[Fact]], max_groups: int = 3, max_sources: int = 8
) -> str:
    """The prompt section for ``candidates``, or ``""`` when there are none."""
    if not candidates:
        return ""
    ordered = sorted(candidates.items(), key=lambda item: (-len(item[1]), item[0]))[:max_groups]
    groups = "\n\n".join(_group_block(name, facts, max_sources) for name, facts in ordered)
    return CONSOLIDATION_SECTION.format(max_groups=max_groups, groups=groups)


def consolidation_section(memory: MemoryDocument, config: MemoryConfig) -> str:
    """The section for ``memory`` when consolidation is on and a group qualifies, else ``""``."""
    if not config.consolidation_enabled:
        return ""
    return build_consolidation_section(
        select_consolidation_candidates(memory, config),
        config.consolidation_max_groups_per_cycle,
        config.consolidation_max_sources,
    )


def _merge_confidence(requested: object, sources: Sequence[Fact]) -> float:
    """The reply's confidence clamped to [0, 1] and capped at the best source's."""
    best = max(coerce_confidence(source.get("confidence")) for source in sources)
    if isinstance(requested, int | float) and not isinstance(requested, bool) and math.isfinite(requested):
        return min(min(1.0, max(0.0, float(requested))), best)
    return best


def _merged_source_error(sources: Sequence[Fact]) -> str:
    errors = dict.fromkeys(
        error for source in sources if isinstance(error := source.get("sourceError"), str) and error.strip()
    )
    return "\n".join(errors)[:MAX_FACT_CHARS]


def _inherited_fields(sources: Sequence[Fact], category: str) -> dict[str, Any]:
    """The importance and tags a merged fact takes from its sources (only what differs from the default)."""
    tags = {
        tag
        for source in sources
        if isinstance(source.get(TAGS_KEY), list)
        for tag in source[TAGS_KEY]
        if isinstance(tag, str)
    }
    inherited = {
        IMPORTANCE_KEY: max(effective_importance(source) for source in sources),
        TAGS_KEY: sorted(tags)[:MAX_TAGS],
    }
    return stored_fields(inherited, category)


def _content_holders(facts: Sequence[Fact]) -> dict[str, list[object]]:
    """Content key to the ids of the facts holding it (``None`` for an id-less fact)."""
    holders: dict[str, list[object]] = {}
    for fact in facts:
        content = fact.get("content")
        if isinstance(content, str) and content.strip():
            fact_id = fact.get("id")
            holders.setdefault(fact_content_key(content), []).append(
                fact_id if isinstance(fact_id, str) else None
            )
    return holders


def apply_consolidations(
    memory: MemoryDocument, requests: Sequence[Consolidation], config: MemoryConfig, now: datetime
) -> dict[str, dict[str, Any]]:
    """Apply the merges that pass every check (in place); the removed source ids with their audit detail."""
    if not config.consolidation_enabled or not requests:
        return {}
    facts: list[Fact] = memory["facts"]
    index = {fact["id"]: fact for fact in facts if isinstance(fact.get("id"), str)}
    allowed = {
        fact["id"]
        for group in select_consolidation_candidates(memory, config).values()
        for fact in group
        if isinstance(fact.get("id"), str)
    }
    holders = _content_holders(facts)
    taken_ids: set[object] = set(index)
    merged_keys: set[str] = set()
    consumed: set[str] = set()
    merged: list[Fact] = []
    removals: dict[str, dict[str, Any]] = {}
    stamp = format_timestamp(now)
    for request in requests:
        if len(merged) >= config.consolidation_max_groups_per_cycle:
            break
        source_ids = request["sourceIds"]
        wanted = set(source_ids)
        if len(wanted) != len(source_ids) or not 2 <= len(source_ids) <= config.consolidation_max_sources:
            continue
        if any(sid in consumed or sid not in index or sid not in allowed for sid in source_ids):
            continue
        consolidated = request["consolidated"]
        content = consolidated["content"].strip() if isinstance(consolidated.get("content"), str) else ""
        key = fact_content_key(content)
        if not key or key in merged_keys or mentions_upload(content):
            continue
        if any(holder not in wanted and holder not in consumed for holder in holders.get(key, ())):
            continue
        sources = [index[sid] for sid in source_ids]
        category = consolidated.get("category") or DEFAULT_CATEGORY
        if category in config.staleness_protected_categories and not any(
            source.get("category") == category for source in sources
        ):
            continue
        confidence = _merge_confidence(consolidated.get("confidence"), sources)
        if confidence < config.fact_confidence_threshold:
            continue
        created = max(parse_timestamp(source.get("createdAt")) or now for source in sources)
        fact_id = new_fact_id(taken_ids)
        taken_ids.add(fact_id)
        fact: Fact = {
            "id": fact_id,
            "content": content,
            "category": category,
            "confidence": confidence,
            "createdAt": format_timestamp(created),
            "consolidatedAt": stamp,
            "source": CONSOLIDATION_SOURCE,
            "consolidatedFrom": list(source_ids),
        }
        source_error = _merged_source_error(sources)
        if source_error:
            fact["sourceError"] = source_error
        fact.update(_inherited_fields(sources, category))
        with_relations(fact, [{"type": "derived_from", "target": sid} for sid in source_ids])
        consumed.update(source_ids)
        merged_keys.add(key)
        merged.append(fact)
        for sid in source_ids:
            removals[sid] = {"reason": "consolidated", "into": fact_id}
        logger.info("consolidation merged facts %r into %s", source_ids, fact_id)
    if consumed:
        memory["facts"] = without_ids(facts, consumed) + merged
    return removals
