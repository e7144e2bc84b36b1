"""``MemstoreStore`` against LangGraph's own ``InMemoryStore``: the same operations, the same answers.

LangGraph publishes conformance tests for checkpointers only, so this is a differential test: one
script of puts, overwrites, deletes (alone and inside batches), gets, searches with filters and
pages, and namespace listings with prefixes, suffixes, wildcards and depths runs against both
stores, through ``batch`` and through ``abatch``, on SQLite and PostgreSQL, and every answer must
match: the items (namespaces, keys, values), the namespaces, and the page sizes. Where the two
legitimately differ the comparison says how: a search page is a set (the in-memory store returns
insertion order, memstore newest first, which is checked on its own), and ``created_at`` survives
an overwrite in memstore (the in-memory store resets it). A compiled ``StateGraph`` then uses the
store through ``get_store()`` on both faces, and its items are in the table.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypedDict

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.config import get_store
from langgraph.graph import END, START, StateGraph
from langgraph.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
)
from langgraph.store.memory import InMemoryStore
from sqlalchemy import select

from memstore.config import MemoryConfig, set_memory_config
from memstore.gateway.user_context import reset_current_user, set_current_user
from memstore.integrations.langgraph_store import MemstoreStore
from memstore.storage.sql.engine import dispose_loop_engines, get_engine
from memstore.storage.sql.schema.models import store_item_history_table, store_items_table
from tests.support.embedding_vectors import DIMENSION, term_vector
from tests.support.openai_server import OpenAIStubServer

Run = Callable[[BaseStore, list[Op]], list[Result]]


def _doc(text: str, n: int, lang: str = "en", tags: Sequence[str] = ("x", "y")) -> dict[str, Any]:
    return {"text": text, "n": n, "meta": {"lang": lang, "v": 1}, "tags": list(tags)}


def _prefix(*path: str) -> MatchCondition:
    return MatchCondition("prefix", path)


def _suffix(*path: str) -> MatchCondition:
    return MatchCondition("suffix", path)


SEED: list[Op] = [
    PutOp(("docs",), "a", _doc("alpha", 1)),
    PutOp(("docs",), "b", _doc("beta", 2, "fr")),
    PutOp(("docs",), "c", _doc("gamma", 3, tags=("x",))),
    PutOp(("docs", "drafts"), "d", _doc("delta", 4)),
    PutOp(("docs", "drafts"), "e", _doc("epsilon", 5, "de")),
    PutOp(("users", "alice", "prefs"), "p1", {"theme": "dark", "n": 1}),
    PutOp(("users", "bob", "prefs"), "p2", {"theme": "light", "n": 2}),
    PutOp(("cache", "emb", "v1"), "z", {"k": [1, 2.5, None, True], "nested": {"deep": {"x": "y"}}}),
    PutOp(("cache", "tok", "v1"), "y", {"k": "€ 中文 😀"}),
    PutOp(("cache", "emb", "v2"), "w", {}),
]
GETS: list[Op] = [
    GetOp(("docs",), "a"),
    GetOp(("docs",), "missing"),
    GetOp(("docs", "drafts"), "a"),  # a key of another namespace
    GetOp(("docs", "drafts"), "e"),
    GetOp(("cache", "emb", "v1"), "z"),
    GetOp(("cache", "tok", "v1"), "y"),
    GetOp(("cache", "emb", "v2"), "w"),
    GetOp(("users", "alice"), "p1"),  # a prefix of the item's namespace is not its namespace
]
SEARCHES: list[Op] = [
    SearchOp((), limit=100),
    SearchOp(("docs",), limit=100),
    SearchOp(("docs", "drafts"), limit=100),
    SearchOp(("doc",), limit=100),  # a label prefix is not a namespace prefix
    SearchOp(("users",), {"theme": "dark"}, limit=100),
    SearchOp((), {"n": 2}, limit=100),
    SearchOp(("docs",), {"n": {"$gte": 2}}, limit=100),
    SearchOp(("docs",), {"n": {"$gt": 1, "$lt": 5}}, limit=100),
    SearchOp(("docs",), {"n": {"$lte": 3.0}}, limit=100),
    SearchOp(("docs",), {"n": {"$ne": 3}}, limit=100),
    SearchOp(("docs",), {"n": {"$eq": 10}}, limit=100),
    SearchOp(("docs",), {"meta": {"lang": "en"}}, limit=100),
    SearchOp(("docs",), {"meta": {"lang": "en", "v": 1}, "n": {"$lt": 4}}, limit=100),
    SearchOp(("docs",), {"tags": ["x", "y"]}, limit=100),
    SearchOp(("docs",), {"tags": ["x"]}, limit=100),
    SearchOp(("docs",), {"tags": "x"}, limit=100),
    SearchOp(("cache",), {"nested": {"deep": {"x": "y"}}}, limit=100),
    SearchOp(("cache",), {"k": [1, 2.5, None, True]}, limit=100),
    SearchOp(("docs",), {"missing": None}, limit=100),  # a missing field equals None, as in LangGraph
    SearchOp(("docs",), limit=0),
]
LISTINGS: list[Op] = [
    ListNamespacesOp(),
    ListNamespacesOp((_prefix("cache"),)),
    ListNamespacesOp((_prefix("cache", "*", "v1"),)),
    ListNamespacesOp((_suffix("v1"),)),
    ListNamespacesOp((_suffix("*", "prefs"),)),
    ListNamespacesOp((_prefix("users"), _suffix("prefs"))),
    ListNamespacesOp((_prefix("*", "alice"),)),
    ListNamespacesOp(max_depth=1),
    ListNamespacesOp(max_depth=2),
    ListNamespacesOp((_prefix("cache"),), max_depth=2),
    ListNamespacesOp(limit=2),
    ListNamespacesOp(limit=3, offset=2),
    ListNamespacesOp(max_depth=1, offset=1),
    ListNamespacesOp((_prefix("nothing"),)),
]
CHANGES: list[Op] = [
    PutOp(("docs",), "a", _doc("alpha two", 10)),  # an overwrite
    PutOp(("docs",), "b", None),  # a delete
    PutOp(("docs",), "never", None),  # a delete of nothing
    PutOp(("docs",), "f", _doc("phi", 6)),
    PutOp(("docs",), "f", None),  # put then delete in one batch: the delete wins
    PutOp(("docs",), "g", None),
    PutOp(("docs",), "g", _doc("eta", 7)),  # delete then put: the put wins
    PutOp(("cache", "emb", "v2"), "w", None),  # the namespace empties: no longer listed
    GetOp(("docs",), "a"),  # reads in a batch see the state before its writes
    SearchOp(("docs",), {"n": {"$gte": 6}}, limit=100),
]
AFTER: list[Op] = [
    PutOp(("docs",), "b", _doc("beta again", 2)),  # a deleted item written again
    PutOp(("docs", "drafts"), "d", None),
]


def _normal(result: Result) -> Any:
    """A result as both stores must agree on it: items by namespace, key and value; a search page
    as a set of those (its order is each store's own); namespaces in order."""
    if result is None:
        return None
    if isinstance(result, Item):
        return _seen(result)
    if all(isinstance(entry, tuple) for entry in result):
        return list(result)
    return sorted(_seen(entry) for entry in _items(result))


def _seen(item: Item) -> tuple[tuple[str, ...], str, str]:
    return (item.namespace, item.key, json.dumps(item.value, sort_keys=True))


def _sync(store: BaseStore, ops: list[Op]) -> list[Result]:
    return store.batch(ops)


def _newest_first(page: Sequence[Any]) -> bool:
    stamps = [(item.updated_at, item.namespace, item.key) for item in page]
    return all(a[0] > b[0] or (a[0] == b[0] and a[1:] < b[1:]) for a, b in itertools.pairwise(stamps))


def _script(run: Run, ours: MemstoreStore, theirs: InMemoryStore) -> None:
    def both(ops: list[Op]) -> list[Result]:
        mine, reference = run(ours, ops), run(theirs, ops)
        listings = [index for index, op in enumerate(ops) if isinstance(op, ListNamespacesOp)]
        if listings:
            assert not any(isinstance(op, PutOp) for op in ops)
            listed = run(_holding_the_same_items(theirs), [ops[index] for index in listings])
            for index, result in zip(listings, listed, strict=True):
                reference[index] = result
        assert len(mine) == len(reference) == len(ops)
        for op, a, b in zip(ops, mine, reference, strict=True):
            assert _normal(a) == _normal(b), op
            if isinstance(op, SearchOp) and a:
                assert all(isinstance(item, SearchItem) and item.score is None for item in _items(a))
                assert _newest_first(_items(a)), op
        return mine

    assert both(SEED) == [None] * len(SEED)
    before = both(GETS)
    both(SEARCHES)
    both(LISTINGS)
    _pages(run, ours, theirs)
    changed = both(CHANGES)
    assert _normal(changed[8]) == _normal(before[0])  # the batch's get saw "a" before its overwrite
    after = both([*GETS, *SEARCHES, *LISTINGS])
    a_before, a_after = before[0], after[0]
    assert isinstance(a_before, Item) and isinstance(a_after, Item)
    assert a_after.value["n"] == 10 and a_after.updated_at > a_before.updated_at
    assert a_after.created_at == a_before.created_at  # memstore keeps the creation time
    both(AFTER)
    final = both([*GETS, *SEARCHES, *LISTINGS, GetOp(("docs",), "b"), GetOp(("docs",), "g")])
    b_again = final[-2]
    assert isinstance(b_again, Item) and b_again.created_at == b_again.updated_at > a_after.updated_at
    _pages(run, ours, theirs)


def _holding_the_same_items(theirs: InMemoryStore) -> InMemoryStore:
    """An in-memory store holding just the items ``theirs`` holds. Its listings are the reference:
    ``theirs`` keeps listing a namespace after its last item is deleted (or once a get named it),
    while memstore, like LangGraph's PostgreSQL store, lists the namespaces that hold items."""
    copy = InMemoryStore()
    held = _items(theirs.batch([SearchOp((), limit=1000)])[0])
    copy.batch([PutOp(item.namespace, item.key, item.value) for item in held])
    return copy


def _pages(run: Run, ours: MemstoreStore, theirs: InMemoryStore) -> None:
    """Pages of two through ``("docs",)`` and through everything: each as long as the reference's,
    disjoint, and together the whole result, newest first across the pages too."""
    for prefix in (("docs",), ()):
        whole = _items(run(ours, [SearchOp(prefix, limit=100)])[0])
        paged: list[SearchItem] = []
        for offset in (0, 2, 4):
            mine = _items(run(ours, [SearchOp(prefix, limit=2, offset=offset)])[0])
            reference = _items(run(theirs, [SearchOp(prefix, limit=2, offset=offset)])[0])
            assert len(mine) == len(reference) == min(2, max(0, len(whole) - offset))
            paged += mine
        assert [(i.namespace, i.key) for i in paged] == [(i.namespace, i.key) for i in whole[:6]]


def _items(result: Result) -> list[SearchItem]:
    assert isinstance(result, list)
    items = [item for item in result if isinstance(item, SearchItem)]
    assert len(items) == len(result)
    return items


@pytest.fixture
def store(sql_url: str) -> Iterator[MemstoreStore]:
    config = MemoryConfig(database_url=sql_url)
    set_memory_config(config)
    yield MemstoreStore(tenant_id="acme", user_id="alice", agent_name="coder", config=config)


def test_batch_answers_as_the_in_memory_store_does(store: MemstoreStore, sql_url: str) -> None:
    _script(_sync, store, InMemoryStore())
    with get_engine(sql_url).connect() as conn:
        rows = conn.execute(select(store_items_table)).all()
        history = conn.execute(select(store_item_history_table)).all()
    assert {(r.tenant_id, r.user_id, r.agent_name) for r in rows} == {("acme", "alice", "coder")}
    live = {(r.namespace, r.key) for r in rows if r.deleted_at is None}
    assert ("docs", "a") in live and ("docs.drafts", "e") in live and ("docs", "g") in live
    # Deleted items keep their row (no value) for their history; "f" and "never" never existed.
    assert {(r.namespace, r.key) for r in rows if r.deleted_at is not None} == {
        ("docs.drafts", "d"),
        ("cache.emb.v2", "w"),
    }
    assert all(r.value is None for r in rows if r.deleted_at is not None)
    changes = sorted((h.namespace, h.key, h.version, h.op) for h in history if h.key in ("a", "b", "f", "g"))
    assert changes == [
        ("docs", "a", 1, "put"),
        ("docs", "a", 2, "put"),
        ("docs", "b", 1, "put"),
        ("docs", "b", 2, "delete"),
        ("docs", "b", 3, "put"),
        ("docs", "g", 1, "put"),
    ]


def test_abatch_answers_as_the_in_memory_store_does(store: MemstoreStore) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()

        def run(target: BaseStore, ops: list[Op]) -> list[Result]:
            # The script waits in a thread of its own; every abatch runs on the loop.
            return asyncio.run_coroutine_threadsafe(target.abatch(ops), loop).result()

        try:
            await asyncio.to_thread(_script, run, store, InMemoryStore())
        finally:
            await dispose_loop_engines()

    asyncio.run(main())


# --- queries ------------------------------------------------------------------------------------

TEXTS = {
    "t1": "tea",
    "t2": "tea coffee",
    "t3": "tea coffee milk",
    "t4": "tea coffee milk sugar",
    "t5": "coffee",
    "t6": "milk sugar honey",
}


def _ranked(result: Result) -> list[list[tuple[str, float]]]:
    """A ranked page as groups of equal score, best first (each group's keys sorted): two stores
    may order a tie differently, never anything else."""
    groups: list[list[tuple[str, float]]] = []
    for item in _items(result):
        assert item.score is not None
        score = round(item.score, 5)
        if groups and groups[-1][0][1] == score:
            groups[-1].append((item.key, score))
        else:
            groups.append([(item.key, score)])
    return [sorted(group) for group in groups]


def test_a_query_ranks_as_the_in_memory_store_does_with_the_same_embeddings(
    sql_url: str, openai_server: OpenAIStubServer
) -> None:
    config = MemoryConfig(
        database_url=sql_url,
        embedding_provider="openai",
        embedding_model="embed-small",
        embedding_base_url=openai_server.base_url,
        llm_base_url="http://127.0.0.1:9/v1",
        model_name="chat-model",
    )
    ours = MemstoreStore(user_id="alice", config=config)
    theirs = InMemoryStore(
        index={"dims": DIMENSION, "embed": lambda texts: [term_vector(t) for t in texts], "fields": ["text"]}
    )
    puts: list[Op] = [
        PutOp(("notes", "home" if n % 2 else "work"), key, {"text": text, "n": n}, index=["text"])
        for n, (key, text) in enumerate(TEXTS.items(), start=1)
    ]
    ours.batch(puts)
    theirs.batch(puts)
    searches: list[Op] = [
        SearchOp(("notes",), query="tea", limit=10),
        SearchOp(("notes",), query="milk sugar", limit=10),
        SearchOp(("notes",), {"n": {"$gte": 2}}, query="coffee milk", limit=10),
        SearchOp(("notes", "work"), query="sugar honey tea", limit=10),
        SearchOp(("notes",), query="tea", limit=2, offset=1),  # no tie at either edge
    ]
    mine, reference = ours.batch(searches), theirs.batch(searches)
    for op, a, b in zip(searches, mine, reference, strict=True):
        assert _ranked(a) == _ranked(b), op
    assert [key for group in _ranked(mine[0]) for key, _ in group] == ["t1", "t2", "t3", "t4", "t5", "t6"][:6]
    assert _ranked(mine[4]) == [[("t2", 0.70711)], [("t3", 0.57735)]]
    # A put with index=False is stored, never embedded, and comes after the ranked items, unscored.
    ours.put(("notes", "home"), "plain", {"text": "tea tea tea"}, index=False)
    ranked = ours.search(("notes",), query="tea", limit=10)
    assert [(item.key, item.score) for item in ranked][-1] == ("plain", None)
    assert len(openai_server.embedding_requests) == 1 + len(searches) + 1


def test_without_embeddings_a_query_ranks_by_the_words_it_shares(store: MemstoreStore) -> None:
    store.put(("notes",), "both", {"text": "Green tea in the morning"})
    store.put(("notes",), "one", {"text": "Coffee, never tea", "extra": {"deep": ["TEA"]}})
    store.put(("notes",), "none", {"text": "nothing to see"})
    store.put(("notes",), "fields", {"title": "green", "body": "tea"}, index=["title"])
    store.put(("notes",), "hidden", {"text": "green tea"}, index=False)
    ranked = store.search(("notes",), query="green tea?", limit=10)
    assert [(item.key, item.score) for item in ranked] == [
        ("both", 1.0),
        ("fields", 0.5),  # only its title is indexed
        ("one", 0.5),
        ("none", 0.0),
        ("hidden", None),
    ]
    page = store.search(
        ("notes",), filter={"text": {"$ne": "nothing to see"}}, query="green tea", limit=2, offset=1
    )
    assert [item.key for item in page] == ["fields", "one"]


# --- a graph ------------------------------------------------------------------------------------


class Turn(TypedDict):
    text: str
    recalled: list[str]


def _remember(state: Turn, config: RunnableConfig) -> dict[str, Any]:
    store = get_store()
    namespace = ("memories", config.get("configurable", {})["user_id"])
    store.put(namespace, f"m{len(store.search(namespace, limit=100))}", {"text": state["text"]})
    return {"recalled": [item.value["text"] for item in store.search(namespace, query=state["text"])]}


async def _aremember(state: Turn, config: RunnableConfig) -> dict[str, Any]:
    store = get_store()
    namespace = ("memories", config.get("configurable", {})["user_id"])
    await store.aput(namespace, f"m{len(await store.asearch(namespace, limit=100))}", {"text": state["text"]})
    return {"recalled": [item.value["text"] for item in await store.asearch(namespace, query=state["text"])]}


def _graph(node: Any, store: BaseStore) -> Any:
    builder = StateGraph(Turn)
    builder.add_node("remember", node)
    builder.add_edge(START, "remember")
    builder.add_edge("remember", END)
    return builder.compile(store=store)


def test_a_graph_keeps_its_memories_per_user_in_the_table(sql_url: str) -> None:
    config = MemoryConfig(database_url=sql_url)
    set_memory_config(config)
    store = MemstoreStore(namespace_user_index=1, agent_name="Helper", config=config)
    graph = _graph(_remember, store)
    alice = {"configurable": {"user_id": "alice"}}
    graph.invoke({"text": "I drink green tea", "recalled": []}, alice)
    second = graph.invoke({"text": "green tea every morning", "recalled": []}, alice)
    assert second["recalled"] == ["green tea every morning", "I drink green tea"]
    bob = graph.invoke({"text": "coffee", "recalled": []}, {"configurable": {"user_id": "bob"}})
    assert bob["recalled"] == ["coffee"]  # bob's namespace is bob's items only

    async def main() -> dict[str, Any]:
        try:
            result: dict[str, Any] = await _graph(_aremember, store).ainvoke(
                {"text": "tea with milk", "recalled": []}, {"configurable": {"user_id": "carol"}}
            )
            return result
        finally:
            await dispose_loop_engines()

    assert asyncio.run(main())["recalled"] == ["tea with milk"]
    with get_engine(sql_url).connect() as conn:
        rows = conn.execute(select(store_items_table).order_by(store_items_table.c.updated_at)).all()
    assert [
        (r.tenant_id, r.user_id, r.agent_name, r.namespace, r.key, json.loads(r.value)["text"]) for r in rows
    ] == [
        ("default", "alice", "helper", "memories.alice", "m0", "I drink green tea"),
        ("default", "alice", "helper", "memories.alice", "m1", "green tea every morning"),
        ("default", "bob", "helper", "memories.bob", "m0", "coffee"),
        ("default", "carol", "helper", "memories.carol", "m0", "tea with milk"),
    ]
    # The calling user's items, when the prefix does not name one.
    token = set_current_user("alice")
    try:
        assert {item.key for item in store.search(("memories",), limit=10)} == {"m0", "m1"}
        assert store.list_namespaces() == [("memories", "alice")]
    finally:
        reset_current_user(token)
    assert store.search(("memories",)) == [] and store.list_namespaces() == []  # "default" holds none
