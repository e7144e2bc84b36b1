"""The memory document: the JSON interchange shape every storage provider loads and saves."""

from __future__ import annotations

import math
import secrets
from collections.abc import Collection, Container
from datetime import UTC, datetime
from typing import Any, overload

MemoryDocument = dict[str, Any]

DOCUMENT_VERSION = "1.0"
USER_SECTIONS = ("workContext", "personalContext", "topOfMind")
HISTORY_SECTIONS = ("recentMonths", "earlierContext", "longTermBackground")
SECTION_GROUPS: dict[str, tuple[str, ...]] = {"user": USER_SECTIONS, "history": HISTORY_SECTIONS}
FACT_CATEGORIES = ("preference", "knowledge", "context", "behavior", "goal", "correction")
DOCUMENT_KEYS = ("version", "lastUpdated", "user", "history", "facts")
"""The interchange format's top-level keys; providers may add their own (``revision``, ...)."""
DEFAULT_CATEGORY = "context"
VISIBILITIES = ("private", "shared", "public")
"""Who else in the tenant reads a fact: nobody, the granted users and roles, everyone."""
"""The category of a fact that names none (an LLM that omits it, a manual fact, an old document)."""
MANUAL_CONFIDENCE = 0.7
"""The confidence of a fact added by hand without one, on every path (helpers, tools, MCP, HTTP).

The default ``fact_confidence_threshold``: a fact someone stated ranks with what the extractor
keeps, not below all of it. The reference gave 0.5 to its API and helpers and 0.7 to its tool."""

# Size caps for everything that enters memory: extractor replies, the fact helpers and tools, the
# HTTP API and imports. One fact or summary over them would crowd everything else out of the
# injected block, and a document without them can exhaust the server that parses it.
MAX_FACT_CHARS = 2_000
"""The longest fact content (and ``sourceError``), after stripping."""
MAX_SUMMARY_CHARS = 8_000
"""The longest section summary."""
MAX_CATEGORY_CHARS = 64
"""The longest category name."""
MAX_DOCUMENT_FACTS = 5_000
"""The most facts one imported document may carry: ten times the largest ``max_facts``."""
MAX_DOCUMENT_BYTES = 16 * 1024 * 1024
"""The largest document file ``memstore import`` reads, and request body ``memstore serve`` accepts."""
MAX_DOCUMENT_DEPTH = 32
"""The deepest nesting of objects and lists an imported document may have (a real one has 4)."""


def utc_now_iso_z() -> str:
    """UTC now as ISO-8601 with a ``Z`` suffix, the timestamp format stored in documents."""
    return format_timestamp(datetime.now(UTC))


def format_timestamp(value: datetime) -> str:
    """ISO-8601 UTC with a ``Z`` suffix, the document's timestamp format."""
    return as_utc(value).isoformat().removesuffix("+00:00") + "Z"


@overload
def as_utc(value: datetime) -> datetime: ...
@overload
def as_utc(value: None) -> None: ...
def as_utc(value: datetime | None) -> datetime | None:
    """``value`` as an aware UTC datetime: SQLite hands back naive ones, and we only ever store UTC."""
    if value is None:
        return None
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def parse_timestamp(raw: object) -> datetime | None:
    """The instant ``raw`` names, in UTC (naive means UTC), or None when it is not a timestamp."""
    if not isinstance(raw, str):
        return None
    try:
        return as_utc(datetime.fromisoformat(raw))
    except (ValueError, OverflowError):
        return None


def create_empty_memory() -> MemoryDocument:
    """A fresh document; a new dict each call so callers can mutate it freely."""
    return {
        "version": DOCUMENT_VERSION,
        "lastUpdated": utc_now_iso_z(),
        "user": {name: {"summary": "", "updatedAt": ""} for name in USER_SECTIONS},
        "history": {name: {"summary": "", "updatedAt": ""} for name in HISTORY_SECTIONS},
        "facts": [],
    }


def unstorable(text: str) -> str | None:
    """Why no provider can store ``text``, or ``None`` when it can; the reason never quotes it."""
    if "\x00" in text:
        return "contains NUL (U+0000), which cannot be stored"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate (U+D800 to U+DFFF), which is not valid Unicode"
    return None


def unstored_memory() -> MemoryDocument:
    """What a provider loads for a scope with nothing stored: empty, with ``lastUpdated`` ``""``.

    An empty ``lastUpdated`` is how a reader (the CLI, the HTTP API) tells "nothing is stored"
    from "memory that happens to be empty"; ``save`` stamps it.
    """
    document = create_empty_memory()
    document["lastUpdated"] = ""
    return document


def new_fact_id(taken: Container[object] = ()) -> str:
    """A ``fact_`` + 8 hex id not in ``taken``: ids are short, so collisions must be checked."""
    while True:
        candidate = f"fact_{secrets.token_hex(4)}"
        if candidate not in taken:
            return candidate


def fact_content_key(content: str) -> str:
    """The dedup key: two facts are the same fact when their keys are equal."""
    return content.strip().casefold()


def without_ids(facts: list[Any], ids: Collection[str]) -> list[Any]:
    """``facts`` minus those whose string ``id`` is in ``ids`` (id-less facts always stay)."""
    return [
        fact
        for fact in facts
        if not (isinstance(fact, dict) and isinstance(fact.get("id"), str) and fact["id"] in ids)
    ]


def coerce_confidence(raw: object, default: float = 0.5) -> float:
    """Read a stored confidence defensively: garbage ranks as ``default``, numbers clamp to [0, 1].

    Stored documents written by other tools carry null, bool, string or non-finite
    confidences; one helper used at every read keeps sorting and trimming stable.
    """
    if raw is None or isinstance(raw, bool):
        return default
    try:
        value = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return default
    if not math.isfinite(value):
        return default
    return min(1.0, max(0.0, value))
