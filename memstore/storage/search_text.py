"""Turning a natural-language query into something an index can match safely, and into terms.

Users type things like ``deer-flow``, ``"quoted"`` or ``cats OR dogs``; none of that may reach
FTS5 or ``tsquery`` as syntax. Terms are runs of letters and digits, so no quote, operator or
parenthesis survives: on SQLite each becomes a quoted FTS5 phrase, on PostgreSQL the argument of
its own ``plainto_tsquery``, which has no operators at all.

Two ways to match (``fulltext_match``): ``all`` needs every word of the query (``deer-flow`` is
the phrase ``"deer flow"``), ``any`` needs one of its terms and leaves the ranking to BM25, so a
question such as "where did I go on holiday in May?" finds the fact that says "Lisbon in May"
(English function words and Chinese particles are dropped: they match everything).

Neither index segments CJK text (a run of Han characters is one token), so a query containing
CJK is served by substring matching instead, as is a query with no word characters; ``any``
then matches the query's character bigrams.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Literal

SearchMatch = Literal["any", "all"]
SEARCH_MATCHES: tuple[SearchMatch, ...] = ("any", "all")
MAX_SEARCH_TERMS = 16
"""The most terms an ``any`` query matches on (the first ones); a pasted paragraph is not a question."""
MAX_ALL_TERMS = 64
"""The most words an ``all`` query requires (the first ones): SQLite refuses deeper expressions."""

_INDEX_WORD = re.compile(r"\w+")
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+")
STOP_WORDS = frozenset(
    {
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "but",
        "by",
        "can",
        "could",
        "do",
        "does",
        "for",
        "from",
        "had",
        "has",
        "have",
        "how",
        "i",
        "if",
        "in",
        "into",
        "is",
        "it",
        "its",
        "me",
        "my",
        "of",
        "on",
        "or",
        "our",
        "should",
        "so",
        "that",
        "the",
        "their",
        "them",
        "they",
        "this",
        "to",
        "was",
        "we",
        "what",
        "when",
        "where",
        "which",
        "who",
        "why",
        "will",
        "with",
        "would",
        "you",
        "your",
    }
)
"""English function words: shared by questions and facts alike, they rank nothing."""
_CJK_STOP_CHARACTERS = frozenset("的了是我你他她它们在吗呢吧啊和也都就这那有么什怎哪个一")
"""Chinese particles and pronouns: a bigram made only of these ("什么", "我们") matches everything."""


def text_terms(text: str, *, fold: Callable[[str], str] = str.casefold) -> tuple[str, ...]:
    """Words, folded (``casefold`` by default); runs of CJK characters become their character
    bigrams (or the lone character)."""
    terms: list[str] = []
    for word in _WORD.findall(fold(text)):
        start = 0
        for run in _CJK.finditer(word):
            if run.start() > start:
                terms.append(word[start : run.start()])
            chars = run.group()
            terms.extend([chars] if len(chars) == 1 else [chars[i : i + 2] for i in range(len(chars) - 1)])
            start = run.end()
        if start < len(word):
            terms.append(word[start:])
    return tuple(terms)


def query_terms(query: str, *, fold: Callable[[str], str] = str.casefold) -> list[str]:
    """The terms of ``query`` that tell facts apart, once each, in order: no function words, and
    no lone letter or digit outside CJK (the "s" of "what's")."""
    return list(dict.fromkeys(term for term in text_terms(query, fold=fold) if not _is_stop_term(term)))


def _is_stop_term(term: str) -> bool:
    if term in STOP_WORDS:
        return True
    if _CJK.fullmatch(term) is None:
        return len(term) == 1
    return all(char in _CJK_STOP_CHARACTERS for char in term)


def any_terms(query: str, *, fold: Callable[[str], str] = str.lower) -> list[str]:
    """What an ``any`` search matches on: at most ``MAX_SEARCH_TERMS`` of ``query_terms``, or
    every term when all of them are function words ("who are you?" still searches).

    Lower-cased, not case-folded, by default: the indexes lower-case, so "Straße" must stay
    "straße" for them (a scan in Python may fold both sides).
    """
    terms = query_terms(query, fold=fold) or list(dict.fromkeys(text_terms(query, fold=fold)))
    return terms[:MAX_SEARCH_TERMS]


def holds_term(term: str, words: set[str], text: str) -> bool:
    """Whether a text (its ``text_terms`` as ``words``, and itself lower-cased) holds an ``any``
    term: a word as a whole word, CJK as a substring (a lone character is no bigram of the text)."""
    return term in words or (_CJK.fullmatch(term) is not None and term in text)


def substring_terms(query: str) -> list[str]:
    """Whitespace-separated terms, once each and at most ``MAX_ALL_TERMS``; a fact matches the
    ``all`` fallback when it contains every one."""
    return list(dict.fromkeys(query.split()))[:MAX_ALL_TERMS]


def unservable_reason(query: str) -> str | None:
    """Why the full-text index cannot answer ``query``, or None when it can."""
    if _CJK.search(query):
        return "the index does not segment CJK text"
    if not _WORD.search(query):
        return "the query has no words"
    return None


def fts5_match(query: str, match: SearchMatch = "all") -> str:
    """An FTS5 MATCH expression: ``all``, one quoted phrase per whitespace-separated term, every one
    required (implicit AND); ``any``, one quoted word per term, joined by ``OR``."""
    if match == "any":
        return " OR ".join(f'"{term}"' for term in any_terms(query))
    phrases = []
    for term in substring_terms(query):
        words = _INDEX_WORD.findall(term)
        if words:
            phrases.append('"' + " ".join(words) + '"')
    return " ".join(phrases)


def inverse_document_frequency(total: int, containing: int) -> float:
    """BM25's weight of a term found in ``containing`` of ``total`` texts: rare terms weigh most."""
    return math.log(1 + (total - containing + 0.5) / (containing + 0.5))
