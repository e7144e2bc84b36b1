"""What a store item may be, and how a search matches and ranks one: the rules, no database.

Every input is checked before a batch touches the database, so a bad operation stops its whole
batch with a ``StoreItemError`` that names the rule and never the value (a namespace label may be
a user id). The caps keep one caller from filling the database or a replica's memory: labels,
namespaces, keys, values (their JSON text), filters, queries and pages all have one.

Filters follow LangGraph's semantics: each top-level field of the filter must match the item's
field of that name; a nested object matches when each of its fields does, a list when it has the
same length and each element matches, anything else by equality; an object of operators
(``$eq``, ``$ne``, ``$gt``, ``$gte``, ``$lt``, ``$lte``) matches when every operator holds. The
ordering operators compare numbers (``float()`` of both sides); a missing or non-numeric field
does not match, where LangGraph's in-memory store raises.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from memstore.document import unstorable
from memstore.embedding.base import MAX_EMBED_CHARS
from memstore.errors import StoreItemError
from memstore.scope import Identity
from memstore.storage.search_text import MAX_SEARCH_TERMS, holds_term, query_terms, text_terms

Namespace = tuple[str, ...]
MatchType = Literal["prefix", "suffix"]

SEPARATOR = "."
"""Joins a namespace's labels in the ``namespace`` column; no label may contain it."""
WILDCARD = "*"
MAX_LABELS = 16
MAX_LABEL_CHARS = 128
MAX_NAMESPACE_BYTES = 1024
MAX_KEY_BYTES = 512
"""With the namespace's cap, a primary key stays within what a PostgreSQL B-tree entry holds."""
MAX_VALUE_BYTES = 256 * 1024
"""An item's JSON text, UTF-8."""
MAX_VALUE_DEPTH = 64
MAX_FILTER_BYTES = 64 * 1024
MAX_QUERY_CHARS = MAX_EMBED_CHARS
MAX_LIMIT = 1000
MAX_OFFSET = 10_000
MAX_CANDIDATES = 5000
"""Items a query ranks at most: the newest that match the prefix and the filter."""
DEFAULT_MAX_ITEMS = 10_000
"""Live items one scope ``(tenant, user, agent)`` holds at most, unless the store says otherwise."""
HISTORY_KEEP = 20
"""History rows kept per item: the newest puts and deletes."""
OPERATORS = frozenset({"$eq", "$ne", "$gt", "$gte", "$lt", "$lte"})


@dataclass(frozen=True)
class ItemScope:
    """Whose items: the row-level security identity is ``(tenant_id, user_id)``."""

    tenant_id: str
    user_id: str
    agent_name: str
    """``''`` when the store names no agent."""

    @property
    def identity(self) -> Identity:
        return Identity.of(self.user_id, tenant_id=self.tenant_id)


@dataclass(frozen=True)
class StoredItem:
    namespace: Namespace
    key: str
    value: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    score: float | None = None


@dataclass(frozen=True)
class ItemWrite:
    """One put (``value_text`` set) or delete (``None``), checked and, for a put, embedded."""

    scope: ItemScope
    namespace: Namespace
    key: str
    value_text: str | None
    indexed_text: str | None = None
    vector: Any = None
    """A normalised float32 vector of ``indexed_text`` by ``model``, or ``None``."""
    model: str | None = None


@dataclass(frozen=True)
class Ranking:
    """How a query ranks: by cosine similarity to ``vector`` (items embedded by ``model``), or,
    without embeddings, by the share of the query's ``terms`` an item's indexed text holds."""

    vector: Any = None
    model: str | None = None
    terms: tuple[str, ...] = ()


@dataclass(frozen=True)
class ItemSearch:
    prefix: Namespace
    filter: dict[str, Any] | None
    limit: int
    offset: int
    ranking: Ranking | None = None


def checked_namespace(namespace: object, *, what: str = "namespace") -> Namespace:
    """``namespace`` as a tuple of labels that store and join safely (``()`` allowed). A label may
    be ``*``: only a match condition of ``list_namespaces`` reads it as a wildcard."""
    if not isinstance(namespace, tuple | list):
        raise StoreItemError(f"{what} must be a tuple of strings")
    if len(namespace) > MAX_LABELS:
        raise StoreItemError(f"{what} has {len(namespace)} labels; at most {MAX_LABELS}")
    for index, label in enumerate(namespace):
        where = f"{what} label {index}"
        if not isinstance(label, str):
            raise StoreItemError(f"{where} is not a string")
        if not label:
            raise StoreItemError(f"{where} is empty")
        if SEPARATOR in label:
            raise StoreItemError(f"{where} contains '.', which LangGraph namespaces may not")
        if len(label) > MAX_LABEL_CHARS:
            raise StoreItemError(f"{where} has {len(label)} characters; at most {MAX_LABEL_CHARS}")
        problem = unstorable(label)
        if problem is not None:
            raise StoreItemError(f"{where} {problem}")
    size = len(joined(tuple(namespace)).encode("utf-8"))
    if size > MAX_NAMESPACE_BYTES:
        raise StoreItemError(f"{what} takes {size} bytes joined; at most {MAX_NAMESPACE_BYTES}")
    return tuple(namespace)


def joined(namespace: Namespace) -> str:
    return SEPARATOR.join(namespace)


def split(text: str) -> Namespace:
    return tuple(text.split(SEPARATOR)) if text else ()


def checked_key(key: object) -> str:
    if not isinstance(key, str):
        raise StoreItemError("key must be a string")
    if not key:
        raise StoreItemError("key is empty")
    problem = unstorable(key)
    if problem is not None:
        raise StoreItemError(f"key {problem}")
    size = len(key.encode("utf-8"))
    if size > MAX_KEY_BYTES:
        raise StoreItemError(f"key takes {size} bytes; at most {MAX_KEY_BYTES}")
    return key


def encoded_value(value: object) -> tuple[dict[str, Any], str]:
    """The value as a plain dict and its JSON text, which is what is stored and capped."""
    if not isinstance(value, Mapping):
        raise StoreItemError("value must be a dict (or None to delete the item)")
    plain = _plain(value, "value", 0)
    text = json.dumps(plain, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    size = len(text.encode("utf-8"))
    if size > MAX_VALUE_BYTES:
        raise StoreItemError(f"value takes {size} bytes as JSON; at most {MAX_VALUE_BYTES}")
    return plain, text


def _plain(value: object, where: str, depth: int) -> Any:
    """A JSON-compatible copy that loads back equal: string keys, finite numbers, storable text."""
    if depth > MAX_VALUE_DEPTH:
        raise StoreItemError(f"value nests deeper than {MAX_VALUE_DEPTH} levels")
    if isinstance(value, str):
        problem = unstorable(value)
        if problem is not None:
            raise StoreItemError(f"a string in {where} {problem}")
        return value
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise StoreItemError(f"{where} holds {value}, which JSON cannot")
        return value
    if isinstance(value, Mapping):
        plain: dict[str, Any] = {}
        for name, item in value.items():
            if not isinstance(name, str):
                raise StoreItemError(f"{where} has a key that is not a string")
            problem = unstorable(name)
            if problem is not None:
                raise StoreItemError(f"a key in {where} {problem}")
            plain[name] = _plain(item, where, depth + 1)
        return plain
    if isinstance(value, list | tuple):
        return [_plain(item, where, depth + 1) for item in value]
    raise StoreItemError(f"{where} holds a {type(value).__name__}, which is not JSON")


def default_index_text(value: Mapping[str, Any]) -> str | None:
    """What an item is ranked by when its put names no fields: its string values, in order."""
    return index_text(list(_strings(value)))


def index_text(texts: Sequence[str]) -> str | None:
    """The texts joined, cut to what an embedder reads; ``None`` when there is nothing to rank by."""
    text = "\n".join(part for part in texts if part)[:MAX_EMBED_CHARS]
    return text or None


def _strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)


def checked_page(limit: object, offset: object) -> tuple[int, int]:
    if not isinstance(limit, int) or isinstance(limit, bool) or not 0 <= limit <= MAX_LIMIT:
        raise StoreItemError(f"limit must be a whole number from 0 to {MAX_LIMIT}")
    if not isinstance(offset, int) or isinstance(offset, bool) or not 0 <= offset <= MAX_OFFSET:
        raise StoreItemError(f"offset must be a whole number from 0 to {MAX_OFFSET}")
    return limit, offset


def checked_query(query: object) -> str | None:
    if query is None or query == "":
        return None
    if not isinstance(query, str):
        raise StoreItemError("query must be a string")
    if len(query) > MAX_QUERY_CHARS:
        raise StoreItemError(f"query has {len(query)} characters; at most {MAX_QUERY_CHARS}")
    problem = unstorable(query)
    if problem is not None:
        raise StoreItemError(f"query {problem}")
    return query


def checked_filter(filter: object) -> dict[str, Any] | None:
    """The filter as a plain dict (``None`` when empty), its operators known and operands fit."""
    if filter is None:
        return None
    if not isinstance(filter, Mapping):
        raise StoreItemError("filter must be a dict")
    plain: dict[str, Any] = _plain(filter, "filter", 0)
    size = len(json.dumps(plain, ensure_ascii=False).encode("utf-8"))
    if size > MAX_FILTER_BYTES:
        raise StoreItemError(f"filter takes {size} bytes as JSON; at most {MAX_FILTER_BYTES}")
    for condition in plain.values():  # top-level names are fields, whatever they start with
        _check_operators(condition)
    return plain or None


def _check_operators(condition: Any) -> None:
    if isinstance(condition, list):
        for item in condition:
            _check_operators(item)
    if not isinstance(condition, dict):
        return
    if any(name.startswith("$") for name in condition):
        for name, operand in condition.items():
            if name not in OPERATORS:
                raise StoreItemError(
                    f"filter operator {name[:20]!r} is not one of {', '.join(sorted(OPERATORS))}"
                )
            if name not in ("$eq", "$ne") and _number(operand) is None:
                raise StoreItemError(f"filter operator {name} needs a number")
        return
    for item in condition.values():
        _check_operators(item)


def matches(value: Mapping[str, Any], filter: Mapping[str, Any]) -> bool:
    return all(_matches(value.get(name), expected) for name, expected in filter.items())


def _matches(actual: Any, expected: Any) -> bool:
    if isinstance(expected, dict):
        if any(name.startswith("$") for name in expected):
            return all(_holds(actual, name, operand) for name, operand in expected.items())
        return isinstance(actual, dict) and all(
            _matches(actual.get(name), item) for name, item in expected.items()
        )
    if isinstance(expected, list | tuple):
        return (
            isinstance(actual, list | tuple)
            and len(actual) == len(expected)
            and all(_matches(a, e) for a, e in zip(actual, expected, strict=True))
        )
    return bool(actual == expected)


def _holds(actual: Any, operator: str, operand: Any) -> bool:
    if operator == "$eq":
        return bool(actual == operand)
    if operator == "$ne":
        return bool(actual != operand)
    left, right = _number(actual), _number(operand)
    if left is None or right is None:
        return False
    if operator == "$gt":
        return left > right
    if operator == "$gte":
        return left >= right
    if operator == "$lt":
        return left < right
    return left <= right


def _number(value: Any) -> float | None:
    if not isinstance(value, str | int | float):
        return None
    try:
        return float(value)
    except (ValueError, OverflowError):
        return None


def namespace_matches(namespace: Namespace, conditions: Sequence[tuple[MatchType, Namespace]]) -> bool:
    """Whether ``namespace`` starts (``prefix``) or ends (``suffix``) with each condition's path,
    ``*`` matching any one label."""
    for match_type, path in conditions:
        if len(namespace) < len(path):
            return False
        labels = namespace[: len(path)] if match_type == "prefix" else namespace[len(namespace) - len(path) :]
        if any(want not in (WILDCARD, have) for have, want in zip(labels, path, strict=True)):
            return False
    return True


def ranking_terms(query: str) -> tuple[str, ...]:
    """The terms a query ranks by without embeddings: its distinctive words (every word when it
    has only function words), case-folded, at most ``MAX_SEARCH_TERMS``."""
    terms = query_terms(query) or list(dict.fromkeys(text_terms(query)))
    return tuple(terms[:MAX_SEARCH_TERMS])


def term_score(terms: Sequence[str], text: str | None) -> float | None:
    """The share of ``terms`` that ``text`` holds, from 0 to 1; ``None`` for an item not indexed."""
    if text is None or not terms:
        return None
    folded = text.casefold()
    words = set(text_terms(folded))
    return sum(holds_term(term, words, folded) for term in terms) / len(terms)
