"""Tolerant parsing of the extractor's reply into a normalised memory update.

Models wrap JSON in think-tags, prose or code fences, and some providers return content as
a list of blocks, so the parser flattens the content and then tries to decode a JSON value
at every ``{``, accepting the first object that has ``user``, ``history`` and ``newFacts``
(``factsToRemove`` is optional). Truncated JSON is never repaired. A failed decode costs time
proportional to its offset and nested objects are decoded once per brace, so the search
gives up after ``MAX_DECODE_FAILURES`` failures or ``MAX_DECODE_WORK`` decoded characters, and
refuses replies over ``MAX_REPLY_CHARS``: a reply of a million ``{`` must not pin the worker.

Field types are normalised so the apply step sees clean data, ``staleFactsToRemove`` and
``factsToConsolidate`` included (both optional; anything that is not a list reads as empty).
A reply that asks to remove facts while some of its new facts were malformed is refused as a
whole: applying only the removal would turn "replace X with Y" into "forget X".

Text the store could not keep, or should not, is malformed too: a NUL character (PostgreSQL
text cannot hold it), a lone surrogate (not encodable as UTF-8), or a fact or summary longer
than ``MAX_FACT_CHARS``/``MAX_SUMMARY_CHARS``. One such fact would otherwise fail the whole
save, losing the valid part of the reply with it, or crowd every other fact out of injection.
A fact's content, category and confidence are the fail-closed core; its optional record fields
(type, importance, tags, source kind, raw, structured, ``replaces``) are read leniently
(``fields.py``): a slip there costs the field, never the fact. The ids a fact ``replaces`` stay on
the fact and do not join ``factsToRemove``: the apply step removes them only when the fact that
replaces them is stored.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any, NotRequired, TypedDict

from memstore.document import (
    DEFAULT_CATEGORY,
    MAX_CATEGORY_CHARS,
    MAX_FACT_CHARS,
    MAX_SUMMARY_CHARS,
    SECTION_GROUPS,
    unstorable,
)
from memstore.errors import MemoryUpdateParseError, UnsafeMemoryUpdateError
from memstore.update.fields import finite_number, reply_fields

REQUIRED_KEYS = frozenset({"user", "history", "newFacts"})
DEFAULT_FACT_CONFIDENCE = 0.5
DEFAULT_CONSOLIDATED_CONFIDENCE = 0.9
MAX_REASON_CHARS = 500
"""A staleness reason longer than this is cut: it only goes to the audit trail."""
MAX_REPLY_CHARS = 1_000_000
MAX_DECODE_FAILURES = 256
MAX_DECODE_WORK = 16 * MAX_REPLY_CHARS
_OPEN_BRACE = re.compile(r"\{")


class SectionUpdate(TypedDict):
    summary: str
    shouldUpdate: bool


class NewFact(TypedDict):
    content: str
    category: str
    confidence: float
    sourceError: NotRequired[str]
    type: NotRequired[str]
    importance: NotRequired[float]
    tags: NotRequired[list[str]]
    sourceKind: NotRequired[str]
    raw: NotRequired[str]
    structured: NotRequired[dict[str, Any]]
    replaces: NotRequired[list[str]]


class StaleRemoval(TypedDict):
    id: str
    reason: str


class ConsolidatedFact(TypedDict):
    content: str
    category: str
    confidence: float


class Consolidation(TypedDict):
    sourceIds: list[str]
    consolidated: ConsolidatedFact


class MemoryUpdate(TypedDict):
    user: dict[str, SectionUpdate]
    history: dict[str, SectionUpdate]
    newFacts: list[NewFact]
    factsToRemove: list[str]
    staleFactsToRemove: list[StaleRemoval]
    factsToConsolidate: list[Consolidation]


def extract_text(content: object) -> str:
    """Flatten reply content to text.

    Adjacent string chunks are streamed pieces of one text, so they join with no separator;
    ``{"text": ...}`` blocks are separate parts and join with newlines. Other blocks are skipped.
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return str(content)
    pieces: list[str] = []
    chunk: list[str] = []
    for part in content:
        if isinstance(part, str):
            chunk.append(part)
            continue
        if chunk:
            pieces.append("".join(chunk))
            chunk = []
        if isinstance(part, Mapping) and isinstance(part.get("text"), str):
            pieces.append(part["text"])
    if chunk:
        pieces.append("".join(chunk))
    return "\n".join(pieces)


def find_update_object(text: str) -> dict[str, Any]:
    """The first JSON object in ``text`` carrying every key in ``REQUIRED_KEYS``."""
    found = find_object(text, REQUIRED_KEYS)
    if found is None:
        preview = text[:200].replace("\n", " ")
        raise MemoryUpdateParseError(
            f"no JSON object with keys user, history and newFacts in the extractor reply: {preview!r}"
        )
    return found


def find_object(text: str, required: frozenset[str]) -> dict[str, Any] | None:
    """The first JSON object in ``text`` carrying every key in ``required``, within the bounds above."""
    if len(text) > MAX_REPLY_CHARS:
        raise MemoryUpdateParseError(
            f"extractor reply is {len(text)} characters, over the {MAX_REPLY_CHARS} accepted"
        )
    decoder = json.JSONDecoder()
    failures = work = 0
    for match in _OPEN_BRACE.finditer(text):
        if failures >= MAX_DECODE_FAILURES or work >= MAX_DECODE_WORK:
            break
        start = match.start()
        try:
            value, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError as exc:
            failures += 1
            work += exc.pos - start
            continue
        except RecursionError:  # nested deeper than the decoder's stack: not an update either way
            failures += 1
            continue
        work += end - start
        if isinstance(value, dict) and value.keys() >= required:
            return value
    return None


def storable_text(value: object, max_chars: int) -> str | None:
    """``value`` stripped, or ``None`` when it is not text the store can keep (see module doc)."""
    if not isinstance(value, str):
        return None
    value = value.strip()
    if len(value) > max_chars or unstorable(value) is not None:
        return None
    return value


def _normalise_sections(raw: object, names: tuple[str, ...]) -> dict[str, SectionUpdate]:
    if not isinstance(raw, Mapping):
        return {}
    sections: dict[str, SectionUpdate] = {}
    for name in names:
        entry = raw.get(name)
        if not isinstance(entry, Mapping):
            continue
        summary = storable_text(entry.get("summary"), MAX_SUMMARY_CHARS)
        flag = entry.get("shouldUpdate")
        should_update = flag is True or (isinstance(flag, str) and flag.strip().lower() == "true")
        sections[name] = {"summary": summary or "", "shouldUpdate": should_update}
    return sections


def _normalise_confidence(raw: object) -> float | None:
    """A finite float, or ``None`` to reject the fact. Range clamping happens at apply time."""
    return finite_number(raw)


def normalise_fact(raw: object) -> NewFact | None:
    """A clean new fact, or ``None`` when it cannot be trusted."""
    if not isinstance(raw, Mapping):
        return None
    content = storable_text(raw.get("content"), MAX_FACT_CHARS)
    if not content:
        return None
    confidence = _normalise_confidence(raw.get("confidence", DEFAULT_FACT_CONFIDENCE))
    if confidence is None:
        return None
    category = storable_text(raw.get("category"), MAX_CATEGORY_CHARS) or DEFAULT_CATEGORY
    fields = reply_fields(raw, category)
    fact: NewFact = {"content": content, "category": category, "confidence": confidence}
    source_error = storable_text(raw.get("sourceError"), MAX_FACT_CHARS)
    if source_error:
        fact["sourceError"] = source_error
    fact.update(fields)  # type: ignore[typeddict-item]
    return fact


def _normalise_stale_removals(raw: object) -> list[StaleRemoval]:
    """Entries naming a fact id; a reason that is not storable text becomes ``""``."""
    if not isinstance(raw, list):
        return []
    removals: list[StaleRemoval] = []
    for entry in raw:
        if not isinstance(entry, Mapping):
            continue
        fact_id = entry.get("id")
        if not isinstance(fact_id, str) or not fact_id:
            continue
        reason = entry.get("reason")
        reason = reason[:MAX_REASON_CHARS] if isinstance(reason, str) else ""
        removals.append({"id": fact_id, "reason": "" if unstorable(reason) else reason})
    return removals


def _consolidated_confidence(raw: object) -> float:
    """The merge's confidence as given, or 0.9 for anything but a finite number (strings too)."""
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        return DEFAULT_CONSOLIDATED_CONFIDENCE
    try:
        value = float(raw)
    except OverflowError:
        return DEFAULT_CONSOLIDATED_CONFIDENCE
    return value if math.isfinite(value) else DEFAULT_CONSOLIDATED_CONFIDENCE


def _normalise_consolidations(raw: object) -> list[Consolidation]:
    """Merges of at least two distinct source ids into one storable fact."""
    if not isinstance(raw, list):
        return []
    merges: list[Consolidation] = []
    for entry in raw:
        if not isinstance(entry, Mapping):
            continue
        source_ids = entry.get("sourceIds")
        consolidated = entry.get("consolidated")
        if not isinstance(source_ids, list) or not isinstance(consolidated, Mapping):
            continue
        clean_ids = list(dict.fromkeys(item for item in source_ids if isinstance(item, str) and item))
        content = storable_text(consolidated.get("content"), MAX_FACT_CHARS)
        if len(clean_ids) < 2 or not content:
            continue
        category = storable_text(consolidated.get("category"), MAX_CATEGORY_CHARS)
        merged: ConsolidatedFact = {
            "content": content,
            "category": category or DEFAULT_CATEGORY,
            "confidence": _consolidated_confidence(
                consolidated.get("confidence", DEFAULT_CONSOLIDATED_CONFIDENCE)
            ),
        }
        merges.append({"sourceIds": clean_ids, "consolidated": merged})
    return merges


def normalise_update(raw: Mapping[str, Any]) -> MemoryUpdate:
    """Coerce an accepted reply object into ``MemoryUpdate``; raise when it is unsafe to apply."""
    raw_facts = raw.get("newFacts")
    new_facts: list[NewFact] = []
    dropped = not isinstance(raw_facts, list)
    for entry in raw_facts if isinstance(raw_facts, list) else []:
        fact = normalise_fact(entry)
        if fact is None:
            dropped = True
        else:
            new_facts.append(fact)
    raw_removals = raw.get("factsToRemove")
    removals = (
        [item for item in raw_removals if isinstance(item, str)] if isinstance(raw_removals, list) else []
    )
    if removals and dropped:
        raise UnsafeMemoryUpdateError(
            "refusing a partial update: factsToRemove is set while newFacts is malformed "
            f"({len(removals)} removal(s) would apply without their replacements)"
        )
    return {
        "user": _normalise_sections(raw.get("user"), SECTION_GROUPS["user"]),
        "history": _normalise_sections(raw.get("history"), SECTION_GROUPS["history"]),
        "newFacts": new_facts,
        "factsToRemove": removals,
        "staleFactsToRemove": _normalise_stale_removals(raw.get("staleFactsToRemove")),
        "factsToConsolidate": _normalise_consolidations(raw.get("factsToConsolidate")),
    }


def parse_update_response(content: object) -> MemoryUpdate:
    """Parse raw reply content (str, block list, ...) into a normalised update."""
    return normalise_update(find_update_object(extract_text(content).strip()))
