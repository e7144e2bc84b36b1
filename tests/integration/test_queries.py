"""The Python query API (``memstore.queries``) on every provider: filters, paging, counts, search."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import pytest

from memstore.document import create_empty_memory
from memstore.errors import InvalidScopeError, MemstoreError, QueryError
from memstore.ops.facts import search_memory_facts
from memstore.queries import (
    ANY_AGENT,
    FactFilter,
    count_facts,
    list_facts,
    list_scopes,
    memory_stats,
    operations_of,
    search_facts,
)
from memstore.storage.base import MemoryStorage
from memstore.storage.file import FileMemoryStorage
from memstore.storage.search_text import SearchMatch
from memstore.storage.sql import SqlMemoryStorage
from tests.integration.conftest import StorageFactory


def fact(
    fact_id: str, content: str, *, category: str = "context", confidence: float = 0.8, day: int = 1
) -> dict[str, Any]:
    return {
        "id": fact_id,
        "content": content,
        "category": category,
        "confidence": confidence,
        "createdAt": f"2026-03-{day:02d}T12:00:00Z",
        "source": "thread-1",
    }


def store(storage: MemoryStorage, user: str | None, agent: str | None, *facts: dict[str, Any]) -> None:
    document = create_empty_memory()
    document["facts"] = list(facts)
    assert storage.save(document, agent, user_id=user)


@pytest.fixture
def storage(storage_factory: StorageFactory) -> MemoryStorage:
    """alice (own memory and agent 'coder'), bob, and the legacy global scope."""
    storage = storage_factory()
    store(
        storage,
        "alice",
        None,
        fact("a1", "Alice works on deer-flow, an agent framework", category="knowledge", day=1),
        fact("a2", "Alice prefers tea over coffee", category="preference", confidence=0.95, day=2),
        fact("a3", "用户喜欢喝咖啡，每天早上一杯", category="preference", confidence=0.7, day=3),
        fact("a4", 'Alice asked: cats OR dogs? "quoted" NOT sure', day=4),
    )
    store(
        storage, "alice", "coder", fact("c1", "Alice codes in Python and Rust", category="knowledge", day=5)
    )
    store(
        storage,
        "bob",
        None,
        fact("b1", "Bob deploys deer-flow on Kubernetes", category="knowledge", confidence=0.6, day=6),
        fact("b2", "Bob prefers tea", category="preference", confidence=0.9, day=7),
    )
    store(storage, None, None, fact("g1", "Global fact about deer-flow", day=8))
    return storage


def ids(page: Any) -> list[str]:
    return [record.fact_id for record in page.facts]


def test_list_is_newest_first_across_scopes_with_a_total(storage: MemoryStorage) -> None:
    page = list_facts(storage=storage)
    assert ids(page) == ["g1", "b2", "b1", "c1", "a4", "a3", "a2", "a1"]
    assert page.total == 8 and page.next_offset is None
    first = page.facts[-1]
    assert (first.user_id, first.agent_name, first.category, first.source) == (
        "alice",
        None,
        "knowledge",
        "thread-1",
    )
    assert first.created_at == datetime(2026, 3, 1, 12, tzinfo=UTC)


def test_paging_is_stable_and_complete(storage: MemoryStorage) -> None:
    seen: list[str] = []
    offset: int | None = 0
    while offset is not None:
        page = list_facts(limit=3, offset=offset, storage=storage)
        assert page.total == 8
        seen.extend(ids(page))
        offset = page.next_offset
    assert seen == ids(list_facts(storage=storage))
    assert list_facts(limit=5, offset=100, storage=storage).facts == []


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        (FactFilter(user_id="alice"), {"a1", "a2", "a3", "a4", "c1"}),
        (FactFilter(user_id="alice", agent_name=None), {"a1", "a2", "a3", "a4"}),
        (FactFilter(agent_name="CODER"), {"c1"}),
        (FactFilter(category="preference"), {"a2", "a3", "b2"}),
        (FactFilter(min_confidence=0.9), {"a2", "b2"}),
        (FactFilter(text="DEER-FLOW"), {"a1", "b1", "g1"}),
        (FactFilter(text="100%_"), set()),
        (
            FactFilter(created_after=datetime(2026, 3, 3), created_before=datetime(2026, 3, 6, 12)),
            {"a3", "a4", "c1"},
        ),
        (FactFilter(user_id="bob", category="preference", min_confidence=0.5), {"b2"}),
    ],
)
def test_filters_narrow_and_count(storage: MemoryStorage, where: FactFilter, expected: set[str]) -> None:
    assert set(ids(list_facts(where, storage=storage))) == expected
    assert count_facts(where, storage=storage) == len(expected)


@pytest.mark.parametrize(
    "since",
    [
        datetime(2026, 3, 3, 12, tzinfo=UTC),
        datetime.fromisoformat("2026-03-03T20:00:00+08:00"),
        datetime.fromisoformat("2026-03-03T07:00:00-05:00"),
    ],
    ids=["utc", "plus-8", "minus-5"],
)
def test_time_filters_compare_instants_whatever_the_offset(storage: MemoryStorage, since: datetime) -> None:
    # The same instant written in three offsets selects the same facts on every provider (issue 14.2):
    # SQLite keeps UTC text without an offset, so the bound must be converted, not relabelled.
    after = set(ids(list_facts(FactFilter(created_after=since), storage=storage)))
    before = set(ids(list_facts(FactFilter(created_before=since), storage=storage)))
    assert (after, before) == ({"a3", "a4", "c1", "b1", "b2", "g1"}, {"a1", "a2"})


def test_search_finds_hyphenated_words_and_ranks_by_relevance_then_confidence(storage: MemoryStorage) -> None:
    page = search_facts("deer-flow", storage=storage)
    assert set(ids(page)) == {"a1", "b1", "g1"}
    assert page.total == 3
    if isinstance(storage, SqlMemoryStorage):
        assert page.search_mode == "fulltext"
        assert all(record.rank is not None for record in page.facts)
        ranks = [record.rank for record in page.facts]
        assert ranks == sorted(ranks, reverse=True)  # type: ignore[type-var]
    else:
        assert page.search_mode == "substring"


def test_search_ties_on_relevance_break_on_confidence(storage_factory: StorageFactory) -> None:
    storage = storage_factory()
    store(storage, "ann", None, fact("t1", "Prefers green tea", confidence=0.6))
    store(storage, "ben", None, fact("t2", "Prefers green tea", confidence=0.9))
    store(storage, "cat", None, fact("t3", "Prefers green tea", confidence=0.7))
    assert ids(search_facts("green tea", storage=storage)) == ["t2", "t3", "t1"]


@pytest.mark.parametrize(
    ("query", "match", "expected"),
    [
        # OR is a word here, not an operator (else a1 etc. could match); under "any" a stop word.
        ("cats OR dogs", "all", {"a4"}),
        ("cats OR dogs", "any", {"a4"}),
        ('"quoted" NOT', "all", {"a4"}),
        ('"quoted" NOT', "any", {"a4"}),
        ("NEAR(tea coffee)", "all", set()),  # function syntax is text too
        ("NEAR(tea coffee)", "any", {"a2", "b2"}),  # "tea" or "coffee" (or the word "near")
        ("AND", "all", {"c1"}),  # the word "and" in "Python and Rust", not an operator
        ("AND", "any", {"c1"}),  # only function words: they are searched rather than nothing
        ("*", "all", set()),
        ("*", "any", set()),
    ],
)
def test_query_syntax_is_matched_as_text(
    storage: MemoryStorage, query: str, match: SearchMatch, expected: set[str]
) -> None:
    assert set(ids(search_facts(query, match=match, storage=storage))) == expected


def test_chinese_text_is_found_with_a_logged_fallback(
    storage: MemoryStorage, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="memstore"):
        page = search_facts("咖啡", storage=storage)
    assert ids(page) == ["a3"] and page.search_mode == "substring"
    if isinstance(storage, SqlMemoryStorage):
        assert "substring matching" in caplog.text and "CJK" in caplog.text


def test_search_respects_filters_and_scopes(storage: MemoryStorage) -> None:
    assert ids(search_facts("deer-flow", FactFilter(user_id="bob"), storage=storage)) == ["b1"]
    assert ids(search_facts("python", FactFilter(user_id="alice", agent_name=None), storage=storage)) == []
    assert ids(search_facts("python", FactFilter(agent_name="coder"), storage=storage)) == ["c1"]


def test_deleted_facts_are_not_queryable(storage: MemoryStorage) -> None:
    document = storage.load(user_id="bob")
    document["facts"] = [f for f in document["facts"] if f["id"] != "b1"]
    assert storage.save(document, user_id="bob")
    assert ids(search_facts("deer-flow", FactFilter(user_id="bob"), storage=storage)) == []
    assert count_facts(FactFilter(user_id="bob"), storage=storage) == 1


def test_stats_and_scopes(storage: MemoryStorage) -> None:
    stats = memory_stats(storage=storage)
    assert (stats.users, stats.scopes, stats.facts) == (2, 4, 8)
    assert stats.facts_by_category == {"context": 2, "knowledge": 3, "preference": 3}
    assert stats.database_bytes is not None and stats.database_bytes > 0
    assert list_scopes(storage=storage) == [(None, None), ("alice", None), ("alice", "coder"), ("bob", None)]
    assert list_scopes("alice", storage=storage) == [("alice", None), ("alice", "coder")]


@pytest.mark.parametrize(
    "make",
    [
        lambda: FactFilter(user_id="../etc"),
        lambda: FactFilter(agent_name="no/slash"),
    ],
)
def test_invalid_scope_filters_are_refused(make: Any) -> None:
    with pytest.raises(InvalidScopeError):
        make()


@pytest.mark.parametrize(
    "make",
    [
        lambda: FactFilter(min_confidence=1.5),
        lambda: FactFilter(min_confidence=float("nan")),
        lambda: FactFilter(created_after=datetime(2026, 2, 1), created_before=datetime(2026, 1, 1)),
    ],
)
def test_invalid_filters_are_query_errors(make: Any) -> None:
    with pytest.raises(QueryError):
        make()


def test_bad_paging_and_empty_search_are_query_errors(storage: MemoryStorage) -> None:
    with pytest.raises(QueryError):
        list_facts(limit=0, storage=storage)
    with pytest.raises(QueryError):
        list_facts(offset=-1, storage=storage)
    with pytest.raises(QueryError):
        search_facts("   ", storage=storage)


def test_a_provider_without_queries_is_a_clear_error() -> None:
    class Minimal(MemoryStorage):
        def load(self, agent_name: str | None = None, *, user_id: str | None = None) -> dict[str, Any]:
            return create_empty_memory()

        reload = load

        def save(self, memory: dict[str, Any], agent_name: str | None = None, **_: Any) -> bool:
            return True

    with pytest.raises(MemstoreError, match="does not support queries"):
        operations_of(Minimal())


def test_any_agent_is_the_default(storage: MemoryStorage) -> None:
    assert FactFilter().agent_name is ANY_AGENT


# --- full-text search on the SQL provider --------------------------------------------------------


def test_search_memory_facts_ranks_by_relevance_on_sql(sql_url: str) -> None:
    storage = SqlMemoryStorage(sql_url)
    store(
        storage,
        "alice",
        None,
        fact("x1", "tea", confidence=0.5),
        fact("x2", "Alice likes green tea with lemon and honey in the winter", confidence=0.99),
        fact("x3", "Steam engines", confidence=0.9),
    )
    from memstore.config import SQL_STORAGE_CLASS, get_memory_config, set_memory_config

    set_memory_config(
        get_memory_config().model_copy(update={"storage_class": SQL_STORAGE_CLASS, "database_url": sql_url})
    )
    found = [f["id"] for f in search_memory_facts("tea", user_id="alice")]
    # "tea" alone is the best match despite the lowest confidence; "Steam" contains the substring
    # only, so it follows the index hits.
    assert found == ["x1", "x2", "x3"]
    assert search_facts("tea", storage=storage).search_mode == "fulltext"


def test_fulltext_index_follows_updates_in_the_same_transaction(sql_url: str) -> None:
    storage = SqlMemoryStorage(sql_url)
    store(storage, "alice", None, fact("u1", "Alice uses PostgreSQL"))
    document = storage.load(user_id="alice")
    document["facts"][0]["content"] = "Alice uses SQLite"
    assert storage.save(document, user_id="alice")
    assert ids(search_facts("postgresql", storage=storage)) == []
    assert ids(search_facts("sqlite", storage=storage)) == ["u1"]


def test_search_falls_back_when_the_index_cannot_serve(
    sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    storage = SqlMemoryStorage(sqlite_url)
    store(storage, "alice", None, fact("f1", "Alice uses deer-flow"))
    engine = storage._engine  # the operator broke the index by hand
    with engine.begin() as conn:
        for name in ("au", "ad", "ai"):
            conn.exec_driver_sql(f"DROP TRIGGER memory_facts_fts_{name}")
        conn.exec_driver_sql("DROP TABLE memory_facts_fts")
    with caplog.at_level(logging.INFO, logger="memstore"):
        page = search_facts("deer-flow", storage=storage)
    assert ids(page) == ["f1"] and page.search_mode == "substring"
    assert "index query failed" in caplog.text


def test_file_provider_search_is_a_substring_scan(tmp_path: Any) -> None:
    storage = FileMemoryStorage(tmp_path)
    store(storage, "alice", None, fact("f1", "Straße in Berlin"))
    assert ids(search_facts("STRASSE", storage=storage)) == ["f1"]


# --- any-word full-text search (fulltext_match) ---------------------------------------------------


def test_a_question_finds_facts_sharing_any_of_its_words(storage_factory: StorageFactory) -> None:
    storage = storage_factory()
    store(
        storage,
        "ann",
        None,
        fact("h1", "Spent the May holiday in Lisbon with my sister"),
        fact("h2", "Works at a bakery in Leeds"),
        fact("h3", "Bought a new road bike"),
    )
    question = "Where did I go on holiday in May?"
    assert ids(search_facts(question, FactFilter(user_id="ann"), storage=storage)) == ["h1"]
    assert ids(search_facts(question, FactFilter(user_id="ann"), match="all", storage=storage)) == []


def test_any_word_ranks_a_rare_word_above_a_common_one(storage_factory: StorageFactory) -> None:
    storage = storage_factory()
    common = [fact(f"w{i}", f"Had a long meeting at work on day {i}") for i in range(8)]
    # Longer and less confident than the others: only the rarity of its word puts it first.
    rare = fact("rare", "Planning a long holiday with old friends to Kyoto next spring", confidence=0.5)
    store(storage, "ann", None, *common, rare)
    page = search_facts("work Kyoto", FactFilter(user_id="ann"), storage=storage)
    assert ids(page)[0] == "rare"  # one rare word outweighs one word every other fact has
    assert set(ids(page)) == {"rare", *(f"w{i}" for i in range(8))}
    assert page.total == 9


def test_any_word_search_of_chinese_ranks_by_shared_bigrams(storage_factory: StorageFactory) -> None:
    storage = storage_factory()
    store(
        storage,
        "ann",
        None,
        fact("z1", "上个月去京都旅行了一周"),
        fact("z2", "这个月工作很忙"),
        fact("z3", "喜欢喝绿茶"),
    )
    page = search_facts("我上个月去哪里旅行了？", FactFilter(user_id="ann"), storage=storage)
    assert ids(page)[0] == "z1" and "z3" not in ids(page)
    assert page.search_mode == "substring"


def test_an_unknown_match_is_a_query_error(storage: MemoryStorage) -> None:
    with pytest.raises(QueryError, match="unknown match"):
        search_facts("tea", match="some", storage=storage)  # type: ignore[arg-type]


@pytest.mark.parametrize("match", ["any", "all"])
def test_awkward_queries_search_as_words_on_every_provider(
    storage_factory: StorageFactory, match: str
) -> None:
    storage = storage_factory()
    store(
        storage,
        "ann",
        None,
        fact("k1", "Lives on Straße 5 with Κώστας"),
        fact("k2", "Starts work at nine"),
        fact("k3", "Bob's hobby is woodwork"),
    )
    where = FactFilter(user_id="ann")

    def found(query: str) -> set[str]:
        return set(ids(search_facts(query, where, match=match, storage=storage)))  # type: ignore[arg-type]

    assert found("Straße") == {"k1"}  # lower-cased as the indexes do, not case-folded to "strasse"
    assert found("Κώστας") == {"k1"}
    assert found("__") == set()  # no word at all: nothing, and no error
    assert found(" ".join(["zq"] * 600)) == set()  # one distinct word, however often repeated
    assert found(" ".join(f"w{i}" for i in range(300)) + " 京都") == set()  # many words: capped, no error
    if match == "any":
        # "s" and "art" are no words of k2 ("Starts"): a fragment never matches.
        assert found("what's Bob's art?") == {"k3"}


def test_the_operator_search_refuses_text_no_store_can_hold(storage: MemoryStorage) -> None:
    for query in ("tea\x00", "tea \ud800", "x" * 2001):
        with pytest.raises(QueryError, match="query"):
            search_facts(query, storage=storage)
