"""A fact's audit trail as the console shows it: each version with what changed and who did it.

The history rows hold the fact before and after each change (``memory_history``); this adds the
field-by-field differences, a word-level diff of the text, and a plain label for the origin, so
the page answers "who changed it and why" without reading JSON.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from memstore.storage.records import HistoryEntry

CONSOLE_ORIGIN = "console:"
"""The origin prefix of an edit made in the console, followed by the operator's user id: the audit
trail then says which operator changed a fact, where ``manual`` only says someone did."""
ORIGINS = {
    "manual": "operator or API edit",
    "import": "import",
    "lifecycle": "lifecycle expiry",
    "erase": "erase",
    "deermem": "DeerMem",
    "deerflow": "DeerFlow",
    "unknown": "unknown",
}
"""Labels of the origins memstore writes; any other origin is a conversation's thread id, which the
queue's updater (LLM or rules extractor) saves under."""

REASONS = {
    "consolidated": "consolidation merged it into another fact",
    "stale": "staleness review found it outdated",
    "evicted": "evicted at the max_facts cap",
    "expired": "expired by the lifecycle (decay under the threshold)",
}
_WORDS = re.compile(r"\s+|[^\s]+")
MAX_DIFF_WORDS = 4000
"""Past this many words on a side, the text diff is shown as a whole replacement (difflib is
quadratic in the worst case, and a fact is at most a few thousand characters anyway)."""


def console_origin(operator: str) -> str:
    """The audit origin of an edit that ``operator`` makes in the console."""
    return f"{CONSOLE_ORIGIN}{operator}"


def who(entry: HistoryEntry) -> dict[str, str]:
    """``kind`` (``operator``, ``updater``, ``import``, ``lifecycle``, ...) and a readable label."""
    if entry.origin.startswith(CONSOLE_ORIGIN):
        kind, label = "operator", f"operator {entry.origin.removeprefix(CONSOLE_ORIGIN)} in the console"
    elif entry.origin in ORIGINS:
        kind = "operator" if entry.origin == "manual" else entry.origin
        label = ORIGINS[entry.origin]
    else:
        kind, label = "updater", f"memory updater (conversation {entry.origin})"
    reason = (entry.detail or {}).get("reason")
    if reason == "consolidated":
        kind = "consolidation"
    return {"kind": kind, "label": label}


def why(entry: HistoryEntry) -> str | None:
    """The recorded reason of a change, in words, when there is one."""
    detail = entry.detail or {}
    reason = detail.get("reason")
    if not isinstance(reason, str):
        return None
    said = REASONS.get(reason, reason)
    extra = detail.get("llm_reason") or detail.get("into")
    return f"{said}: {extra}" if isinstance(extra, str) and extra else said


def text_diff(before: str, after: str) -> list[list[str]]:
    """``[op, text]`` runs (``=``, ``-``, ``+``) that turn ``before`` into ``after``, word by word."""
    old, new = _WORDS.findall(before), _WORDS.findall(after)
    if len(old) > MAX_DIFF_WORDS or len(new) > MAX_DIFF_WORDS:
        return [["-", before], ["+", after]]
    runs: list[list[str]] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if tag == "equal":
            runs.append(["=", "".join(old[i1:i2])])
            continue
        if i2 > i1:
            runs.append(["-", "".join(old[i1:i2])])
        if j2 > j1:
            runs.append(["+", "".join(new[j1:j2])])
    return runs


def changes(before: dict[str, Any] | None, after: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The fields that differ between two versions of a fact (content first, then by name)."""
    old, new = before or {}, after or {}
    names = sorted(set(old) | set(new), key=lambda name: (name != "content", name))
    found = []
    for name in names:
        if old.get(name) == new.get(name):
            continue
        change: dict[str, Any] = {"field": name, "before": old.get(name), "after": new.get(name)}
        if name == "content" and isinstance(old.get(name), str) and isinstance(new.get(name), str):
            change["diff"] = text_diff(old[name], new[name])
        found.append(change)
    return found


def version_json(entry: HistoryEntry) -> dict[str, Any]:
    return {
        **entry.to_json(),
        "who": who(entry),
        "why": why(entry),
        "changes": changes(entry.before, entry.after),
    }
