"""Turning a natural-language query into something an index can match safely.

Users type things like ``deer-flow``, ``"quoted"`` or ``cats OR dogs``; none of that may reach
FTS5 or ``tsquery`` as syntax. Words become quoted FTS5 phrases (so ``deer-flow`` is the
phrase ``"deer flow"`` and ``OR`` is just a word), and PostgreSQL gets ``plainto_tsquery``,
which has no operators at all.

Neither index segments CJK text (a run of Han characters is one token), so a query containing
CJK is served by substring matching instead, as is a query with no word characters.
"""

from __future__ import annotations

import re

_WORD = re.compile(r"\w+")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")


def substring_terms(query: str) -> list[str]:
    """Whitespace-separated terms; a fact matches the fallback when it contains every one."""
    return query.split()


def unservable_reason(query: str) -> str | None:
    """Why the full-text index cannot answer ``query``, or None when it can."""
    if _CJK.search(query):
        return "the index does not segment CJK text"
    if not _WORD.search(query):
        return "the query has no words"
    return None


def fts5_match(query: str) -> str:
    """An FTS5 MATCH expression: one quoted phrase per term, all required (implicit AND)."""
    phrases = []
    for term in substring_terms(query):
        words = _WORD.findall(term)
        if words:
            phrases.append('"' + " ".join(words) + '"')
    return " ".join(phrases)
