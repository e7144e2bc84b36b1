"""Applies a normalised update to a memory document, in the reference's order.

Order: section summaries, removals, new facts, ``max_facts`` trim, upload scrubbing. Work
happens on a deep copy so a failure (or a failed save later) never touches the caller's
document, which may be a storage cache; unknown top-level keys such as a provider's
``revision`` ride along untouched.

Confidence of new facts is clamped to [0, 1] with ``coerce_confidence``. The reference
stores an LLM's 1.5 as-is, but our document format and the SQL ``CHECK`` require finite
values in range, so 1.5 is stored as 1.0 and -0.2 as 0.0 (and is then below threshold).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from typing import Any

from memstore.config import MemoryConfig
from memstore.document import (
    SECTION_GROUPS,
    MemoryDocument,
    coerce_confidence,
    fact_content_key,
    new_fact_id,
    utc_now_iso_z,
)
from memstore.errors import MalformedMemoryError
from memstore.update.parser import MemoryUpdate

# Upload mentions, as in the reference's sentence pattern (IGNORECASE)
#   [^.!?]*\b(?:MENTION)[^.!?]*[.!?]?\s*
# which removes each sentence holding a mention, with its end mark and the spaces after it. Its
# quirks are kept so results match: neighbouring sentences get glued, a "." inside a path ends
# the sentence. Run as one regex it retried every start position of a long sentence (quadratic:
# a 32,000-character fact took 21 s), so `_upload_sentences` finds the same spans in one pass.
_UPLOAD_MENTION = re.compile(
    r"\b(?:upload(?:ed|ing)?(?:\s+\w+){0,3}\s+(?:file|files?|document|documents?|attachment|attachments?)"
    r"|file\s+upload|/mnt/user-data/uploads/|<uploaded_files>)",
    re.IGNORECASE,
)
_SENTENCE_END = re.compile(r"[.!?]")
_SPACES = re.compile(r"\s*")
_MULTI_SPACE = re.compile(r"  +")


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
    memory: MemoryDocument, update: MemoryUpdate, *, thread_id: str | None, threshold: float, now: str
) -> None:
    facts: list[dict[str, Any]] = memory["facts"]
    seen = {
        fact_content_key(content)
        for fact in facts
        if isinstance(content := fact.get("content"), str) and content.strip()
    }
    taken_ids = {str(fact["id"]) for fact in facts if "id" in fact}
    for new in update["newFacts"]:
        confidence = coerce_confidence(new["confidence"])
        key = fact_content_key(new["content"])
        if confidence < threshold or not key or key in seen:
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
        facts.append(fact)


def trim_facts_to_max(facts: list[dict[str, Any]], max_facts: int) -> list[dict[str, Any]]:
    """Keep the ``max_facts`` most confident facts; the order changes only when trimming."""
    if len(facts) <= max_facts:
        return facts
    ranked = sorted(facts, key=lambda fact: coerce_confidence(fact.get("confidence")), reverse=True)
    return ranked[:max_facts]


def _upload_sentences(text: str) -> Iterator[tuple[int, int]]:
    """The ``(start, end)`` spans the reference's sentence pattern would remove, left to right.

    A match of that pattern starts where the search resumes, if a mention lies between there and
    the next end mark (a mention never contains one), and ends after that mark and the spaces
    following it. Without a mention, no start before the mark can match, so the scan moves past
    it. Each character is read a bounded number of times.
    """
    position = 0
    while position < len(text):
        mark = _SENTENCE_END.search(text, position)
        sentence_end = mark.start() if mark is not None else len(text)
        if _UPLOAD_MENTION.search(text, position, sentence_end) is None:
            position = sentence_end + 1
            continue
        end = _SPACES.match(text, min(sentence_end + 1, len(text)))
        assert end is not None  # \s* matches everywhere
        yield position, end.end()
        position = end.end()


def _without_upload_sentences(text: str) -> str:
    pieces: list[str] = []
    kept_from = 0
    for start, end in _upload_sentences(text):
        pieces.append(text[kept_from:start])
        kept_from = end
    pieces.append(text[kept_from:])
    return "".join(pieces)


def strip_upload_mentions(memory: MemoryDocument) -> MemoryDocument:
    """Remove upload sentences from every summary and drop facts that mention uploads (in place).

    Uploaded files do not outlive their thread, so remembering them sends later sessions
    looking for files that are gone. Non-string summaries and contents are left alone.
    """
    for group in SECTION_GROUPS:
        sections = memory.get(group)
        if not isinstance(sections, dict):
            continue
        for section in sections.values():
            if isinstance(section, dict) and isinstance(section.get("summary"), str):
                scrubbed = _without_upload_sentences(section["summary"]).strip()
                section["summary"] = _MULTI_SPACE.sub(" ", scrubbed)
    facts = memory.get("facts")
    if isinstance(facts, list) and facts:
        memory["facts"] = [
            fact
            for fact in facts
            if not (
                isinstance(fact, dict)
                and isinstance(fact.get("content"), str)
                and _UPLOAD_MENTION.search(fact["content"])
            )
        ]
    return memory


def apply_updates(
    memory: MemoryDocument, update: MemoryUpdate, *, thread_id: str | None, config: MemoryConfig
) -> MemoryDocument:
    """A new document: ``memory`` with ``update`` applied, trimmed and scrubbed."""
    updated = copy.deepcopy(memory)
    _require_shape(updated)
    now = utc_now_iso_z()
    _apply_sections(updated, update, now)
    if update["factsToRemove"]:
        removed = set(update["factsToRemove"])
        updated["facts"] = [
            fact
            for fact in updated["facts"]
            if not (isinstance(fact.get("id"), str) and fact["id"] in removed)
        ]
    _add_new_facts(updated, update, thread_id=thread_id, threshold=config.fact_confidence_threshold, now=now)
    updated["facts"] = trim_facts_to_max(updated["facts"], config.max_facts)
    return strip_upload_mentions(updated)
