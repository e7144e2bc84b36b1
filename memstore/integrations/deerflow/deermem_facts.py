"""DeerMem's fact shape to memstore's and back, and DeerMem's per-fact revision rule.

DeerMem facts carry a ``source`` object (``{"type", "threadId"}``), a per-fact ``revision``
(1, then +1 on every material change) and DeerMem-only keys (``status``, ``topics``,
``confirmationCount``...). memstore stores ``source`` as text, so it is flattened the way DeerMem
itself reads a text source (a thread id, or one of its type names) and rebuilt on the way out; a
source object that would not survive that is kept whole in ``sourceDetail``. Every other key,
``revision`` included, rides in memstore's per-fact ``extra`` column. ``scope`` and ``title`` are
derived by DeerMem on every read, so they are rebuilt, not stored.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from memstore.document import utc_now_iso_z

SOURCE_TYPES = frozenset({"manual", "consolidation", "import", "unknown"})
SOURCE_DETAIL = "sourceDetail"
DERIVED_KEYS = ("scope", "title")
UNCOMPARED_KEYS = frozenset({"revision", "updatedAt", *DERIVED_KEYS})


def _source_object(source: object) -> dict[str, Any]:
    if isinstance(source, dict):
        return {"type": source.get("type", "unknown"), "threadId": source.get("threadId")}
    if isinstance(source, str) and source not in SOURCE_TYPES:
        return {"type": "conversation", "threadId": source}
    return {"type": source if isinstance(source, str) else "unknown", "threadId": None}


def _source_text(source: dict[str, Any]) -> str:
    kind = source.get("type")
    thread = source.get("threadId")
    if kind == "conversation" and isinstance(thread, str) and thread and thread not in SOURCE_TYPES:
        return thread
    return kind if isinstance(kind, str) and kind in SOURCE_TYPES else "unknown"


def to_memstore(fact: dict[str, Any]) -> dict[str, Any]:
    """A DeerMem fact as memstore stores it (the caller's dict is not changed)."""
    stored = {key: copy.deepcopy(value) for key, value in fact.items() if key not in DERIVED_KEYS}
    source = _source_object(fact.get("source"))
    stored["source"] = _source_text(source)
    if _source_object(stored["source"]) != source:
        stored[SOURCE_DETAIL] = source
    return stored


def to_deermem(fact: dict[str, Any], scope: dict[str, str | None]) -> dict[str, Any]:
    """A stored fact as DeerMem reads it: source object, revision, status, scope."""
    shown = copy.deepcopy(fact)
    detail = shown.pop(SOURCE_DETAIL, None)
    shown["source"] = detail if isinstance(detail, dict) else _source_object(fact.get("source"))
    shown.setdefault("revision", 1)
    shown.setdefault("status", "active")
    shown.setdefault("updatedAt", shown.get("createdAt", ""))
    shown["scope"] = dict(scope)
    return shown


_FACT_ID = re.compile(r"[A-Za-z0-9_-]+")


def check_fact(fact: dict[str, Any]) -> None:
    """DeerMem's schema for a fact it writes; the ``ValueError`` names the field, as DeerMem's storage does.

    memstore would keep a malformed DeerMem key (``topics: "python"``) as an unknown key; DeerMem
    refuses it at the storage, so its readers can rely on the shape.
    """
    if not _FACT_ID.fullmatch(str(fact.get("id") or "fact")):
        raise ValueError("fact.id may contain only letters, numbers, '_' and '-'")
    content = fact.get("content")
    if not isinstance(content, str) or not content.strip():
        raise ValueError("fact.content must be a non-empty string")
    if not isinstance(fact.get("category", "context"), str):
        raise ValueError("fact.category must be a string")
    confidence = fact.get("confidence", 0.5)
    if isinstance(confidence, bool) or not isinstance(confidence, int | float) or not 0 <= confidence <= 1:
        raise ValueError("fact.confidence must be a number between 0 and 1")
    if fact.get("status", "active") != "active":
        raise ValueError("fact.status must be 'active'; deletion is physical")
    for field in ("topics", "consolidatedFrom"):
        value = fact.get(field, [])
        if not isinstance(value, list) or any(not isinstance(item, str) for item in value):
            raise ValueError(f"fact.{field} must be a list of strings")
    if not isinstance(fact.get("lastConfirmedAt", ""), str | None):
        raise ValueError("fact.lastConfirmedAt must be a string when present")
    count = fact.get("confirmationCount")
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise ValueError("fact.confirmationCount must be an integer >= 1 when present")
    revision = fact.get("revision", 1)
    if isinstance(revision, bool) or not isinstance(revision, int) or revision < 1:
        raise ValueError("fact.revision must be an integer >= 1")
    source = fact.get("source")
    if isinstance(source, dict) and not (
        isinstance(source.get("type", "unknown"), str) and isinstance(source.get("threadId"), str | None)
    ):
        raise ValueError("fact.source must have a string type and a string or null threadId")


def fact_revision(fact: dict[str, Any] | None) -> int | None:
    if fact is None:
        return None
    revision = fact.get("revision", 1)
    return revision if isinstance(revision, int) and not isinstance(revision, bool) else 1


def next_version(incoming: dict[str, Any], existing: dict[str, Any] | None) -> dict[str, Any]:
    """``incoming`` with DeerMem's revision rule applied against the stored ``existing`` fact."""
    fact = copy.deepcopy(incoming)
    now = utc_now_iso_z()
    if existing is None:
        fact.setdefault("createdAt", now)
        fact.setdefault("updatedAt", fact["createdAt"])
        fact["revision"] = fact_revision(fact) or 1
        return fact
    previous = fact_revision(existing) or 1
    fact["createdAt"] = existing.get("createdAt") or fact.get("createdAt") or now
    material = {k: v for k, v in fact.items() if k not in UNCOMPARED_KEYS}
    before = {k: v for k, v in existing.items() if k not in UNCOMPARED_KEYS}
    if _comparable(material) == _comparable(before):
        fact["revision"] = previous
        fact["updatedAt"] = existing.get("updatedAt") or fact["createdAt"]
    else:
        fact["revision"] = previous + 1
        fact["updatedAt"] = now
    return fact


def _comparable(fact: dict[str, Any]) -> dict[str, Any]:
    compared = dict(fact)
    compared["source"] = _source_object(fact.get("source"))
    if "confidence" in compared and isinstance(compared["confidence"], int | float):
        compared["confidence"] = float(compared["confidence"])
    return compared
