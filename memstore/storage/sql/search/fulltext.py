"""Full-text search across scopes: the index (FTS5 on SQLite, a GIN ``tsvector`` index on
PostgreSQL, both from revision 0002) ranks the facts matching the query's words, ``any`` or
``all`` of them (``storage.search_text``); when the index cannot serve the query (CJK text, no
word characters, an index error) substring matching does, with a log line.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, bindparam, case, column, func, literal_column, or_, select, table
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.elements import ColumnElement

from memstore.scope import Identity
from memstore.storage.records import FactFilter, FactPage
from memstore.storage.search_text import (
    SearchMatch,
    any_terms,
    fts5_match,
    inverse_document_frequency,
    substring_terms,
    unservable_reason,
)
from memstore.storage.sql.schema.fts_schema import FTS_TABLE, PG_TS_CONFIG
from memstore.storage.sql.schema.models import facts_table as _facts
from memstore.storage.sql.search.queries import LIVE_FACTS, RECORD_COLUMNS, fact_conditions, fact_page
from memstore.storage.sql.search.visibility import Connect

logger = logging.getLogger(__name__)

_fts = table(FTS_TABLE, column("rowid"))

IDF_COUNT_CAP = 200_000
"""The most facts counted as the searched total for term weights (``_searched_total``)."""


def search_facts(
    engine: Connect,
    search: str,
    match: SearchMatch,
    where: FactFilter,
    identity: Identity,
    limit: int,
    offset: int,
) -> FactPage:
    """One page of the live facts ``where`` selects that match ``search`` with ``match``, best first."""
    reason = unservable_reason(search)
    if reason is None:
        try:
            with engine() as conn:
                conditions = fact_conditions(conn, where, identity)
                if match == "any":
                    return _fulltext_any(conn, search, conditions, limit, offset)
                return _fulltext(conn, search, conditions, limit, offset)
        except DBAPIError as exc:
            reason = f"the index query failed ({exc.orig or exc})"
    logger.info("full-text search for %r served by substring matching: %s", search, reason)
    with engine() as conn:
        conditions = fact_conditions(conn, where, identity)
        if match == "any":
            return _substring_any(conn, search, conditions, limit, offset)
        terms = [_facts.c.content.icontains(term, autoescape=True) for term in substring_terms(search)]
        query = select(*RECORD_COLUMNS).select_from(LIVE_FACTS).where(*conditions, *terms)
        return fact_page(conn, query, (_facts.c.confidence.desc(), _facts.c.id), limit, offset, "substring")


def _fulltext(
    conn: Connection, search: str, conditions: list[ColumnElement[bool]], limit: int, offset: int
) -> FactPage:
    if conn.dialect.name == "sqlite":
        return _fts5(conn, fts5_match(search), conditions, limit, offset)
    vector = _pg_vector()
    terms = func.plainto_tsquery(_PG_CONFIG, bindparam("q", search))
    # Normalisation 1 divides by 1 + log(length): a short exact fact beats a long one that
    # mentions the word in passing, as with SQLite's bm25.
    rank = func.ts_rank(vector, terms, 1)
    query = (
        select(*RECORD_COLUMNS, rank.label("rank"))
        .select_from(LIVE_FACTS)
        .where(vector.op("@@")(terms), *conditions)
    )
    return fact_page(
        conn, query, (rank.desc(), _facts.c.confidence.desc(), _facts.c.id), limit, offset, "fulltext"
    )


def _fts5(
    conn: Connection, expression: str, conditions: list[ColumnElement[bool]], limit: int, offset: int
) -> FactPage:
    match = literal_column(FTS_TABLE).op("MATCH")(bindparam("q", expression))
    # bm25() is lower-is-better; negate it so every rank reads "higher is better".
    rank: ColumnElement[Any] = -func.bm25(literal_column(FTS_TABLE))
    query = (
        select(*RECORD_COLUMNS, rank.label("rank"))
        .select_from(_fts.join(LIVE_FACTS, _facts.c.id == _fts.c.rowid))
        .where(match, *conditions)
    )
    return fact_page(
        conn, query, (rank.desc(), _facts.c.confidence.desc(), _facts.c.id), limit, offset, "fulltext"
    )


_PG_CONFIG: ColumnElement[Any] = literal_column(f"'{PG_TS_CONFIG}'::regconfig")


def _pg_vector() -> ColumnElement[Any]:
    """The GIN index's own expression, so the planner can use the index."""
    return func.to_tsvector(_PG_CONFIG, _facts.c.content)


def _fulltext_any(
    conn: Connection, search: str, conditions: list[ColumnElement[bool]], limit: int, offset: int
) -> FactPage:
    """Facts holding any of the query's terms, ranked by BM25.

    SQLite's FTS5 ``bm25()`` does it natively. PostgreSQL's ``ts_rank`` weighs every term alike,
    so a word in every other fact ("work") would count as much as a rare one ("Lisbon"): the
    score is each term's ``ts_rank`` (its frequency, normalised by length) times the term's
    inverse document frequency among the searched facts. The matching rows and their
    ``tsvector`` are computed once (a materialised CTE): re-parsing each fact's text for every
    term cost 50 s for 32 common words over 200,000 facts.
    """
    terms = any_terms(search)
    if not terms:
        return FactPage([], 0, limit, offset, "fulltext")
    if conn.dialect.name == "sqlite":
        return _fts5(conn, fts5_match(search, "any"), conditions, limit, offset)
    vector = _pg_vector()
    queries = [func.plainto_tsquery(_PG_CONFIG, bindparam(f"t{i}", term)) for i, term in enumerate(terms)]
    matching = (
        select(*RECORD_COLUMNS, _facts.c.id.label("row_id"), vector.label("terms"))
        .select_from(LIVE_FACTS)
        .where(or_(*(vector.op("@@")(query) for query in queries)), *conditions)
        .cte("matching")
        .prefix_with("MATERIALIZED")
    )
    found = matching.c.terms
    counts = conn.execute(select(*(func.count().filter(found.op("@@")(query)) for query in queries))).one()
    weights = [inverse_document_frequency(_searched_total(conn, conditions, counts), n) for n in counts]
    rank = sum(
        (weight * func.ts_rank(found, query, 1) for weight, query in zip(weights, queries, strict=True)),
        start=literal_column("0.0"),
    )
    shown = [column for column in matching.c if column.name not in ("row_id", "terms")]
    selected = select(*shown, rank.label("rank")).select_from(matching)
    order = (rank.desc(), matching.c.confidence.desc(), matching.c.row_id)
    return fact_page(conn, selected, order, limit, offset, "fulltext")


def _substring_any(
    conn: Connection, search: str, conditions: list[ColumnElement[bool]], limit: int, offset: int
) -> FactPage:
    """Facts containing any of the query's terms (CJK bigrams included), ranked by the summed
    inverse document frequency of the terms each contains."""
    contains = [_facts.c.content.icontains(term, autoescape=True) for term in any_terms(search)]
    if not contains:
        return FactPage([], 0, limit, offset, "substring")
    matched = or_(*contains)
    weights = _idf(conn, contains, matched, conditions)
    rank: ColumnElement[Any] = sum(
        (case((test, weight), else_=0.0) for weight, test in zip(weights, contains, strict=True)),
        start=literal_column("0.0"),
    )
    query = select(*RECORD_COLUMNS, rank.label("rank")).select_from(LIVE_FACTS).where(matched, *conditions)
    return fact_page(
        conn, query, (rank.desc(), _facts.c.confidence.desc(), _facts.c.id), limit, offset, "substring"
    )


def _idf(
    conn: Connection,
    tests: Sequence[ColumnElement[bool]],
    matched: ColumnElement[bool],
    conditions: list[ColumnElement[bool]],
) -> list[float]:
    """BM25's inverse document frequency of each term among the facts ``conditions`` select: how
    many of them pass each test, against how many there are."""
    counts = conn.execute(
        select(*(func.count().filter(test) for test in tests))
        .select_from(LIVE_FACTS)
        .where(matched, *conditions)
    ).one()
    return [inverse_document_frequency(_searched_total(conn, conditions, counts), n) for n in counts]


def _searched_total(conn: Connection, conditions: list[ColumnElement[bool]], counts: Sequence[int]) -> int:
    """How many facts the search covers, counted up to ``IDF_COUNT_CAP``.

    Counting every fact of a tenant cost 40 ms per 100,000 on PostgreSQL. Past the cap the total is
    taken as the cap, which underweights a word found in a large share of the facts (of 1,000,000
    facts, a word in a tenth weighs 0.7 instead of 2.3, one in 1% 3.0 instead of 4.6); only a
    search across many users' facts reaches it.
    """
    searched = select(_facts.c.id).select_from(LIVE_FACTS).where(*conditions).limit(IDF_COUNT_CAP)
    total = conn.execute(select(func.count()).select_from(searched.subquery())).scalar_one()
    return max(int(total), *counts)
