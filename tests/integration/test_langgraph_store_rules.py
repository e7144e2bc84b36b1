"""``MemstoreStore``'s rules on SQLite and PostgreSQL: bad input stops its whole batch with a clear
error and stores nothing; every put and delete is in the item's history, pruned to the newest 20;
a scope's items are capped, under concurrent writers too; ``erase`` takes a user's items; a
cancelled ``abatch`` stores nothing; and revision 0012 grants an existing application role the new
tables on ``db upgrade`` alone."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from langgraph.store.base import (
    GetOp,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    SearchOp,
)
from sqlalchemy import Connection, Engine, create_engine, event, func, select, text
from sqlalchemy.engine import make_url

from memstore.config import MemoryConfig, set_memory_config
from memstore.errors import ConfigError, InvalidScopeError, StoreItemError, StoreItemLimitError
from memstore.integrations.langgraph_store import MemstoreStore
from memstore.queries import erase_user
from memstore.storage.sql.engine import dispose_engines, dispose_loop_engines, get_engine
from memstore.storage.sql.schema import migrate
from memstore.storage.sql.schema.models import store_item_history_table, store_items_table
from tests.support.app_role import app_role_url

GOOD = PutOp(("memories", "alice"), "ok", {"text": "fine"})
SECRET = "alice@example"


@pytest.fixture
def config(sql_url: str) -> MemoryConfig:
    config = MemoryConfig(database_url=sql_url)
    set_memory_config(config)
    return config


def _counts(url: str) -> tuple[int, int]:
    with get_engine(url).connect() as conn:
        return (
            conn.execute(select(func.count()).select_from(store_items_table)).scalar_one(),
            conn.execute(select(func.count()).select_from(store_item_history_table)).scalar_one(),
        )


BAD: list[tuple[Op, str]] = [
    (PutOp(("memories", "alice"), "big", {"text": "x" * (256 * 1024)}), "at most 262144"),
    (PutOp(("memories", "alice"), "nul", {"text": "a\x00b"}), "NUL"),
    (PutOp(("memories", "alice"), "key\x00", {"a": 1}), "key contains NUL"),
    (PutOp(("memories", "al\x00ice"), "k", {"a": 1}), "label 1 contains NUL"),
    (PutOp(("memories", "a.b"), "k", {"a": 1}), "label 1 contains '.'"),
    (PutOp(("memories", ""), "k", {"a": 1}), "label 1 is empty"),
    (PutOp(("memories", 7), "k", {"a": 1}), "label 1 is not a string"),  # type: ignore[arg-type]
    (PutOp(tuple(f"l{i}" for i in range(17)), "k", {"a": 1}), "at most 16"),
    (PutOp(("memories", "x" * 129), "k", {"a": 1}), "at most 128"),
    (PutOp(tuple("x" * 128 for _ in range(9)), "k", {"a": 1}), "bytes joined; at most 1024"),
    (PutOp(("memories",), "k" * 513, {"a": 1}), "at most 512"),
    (PutOp(("memories",), "", {"a": 1}), "key is empty"),
    (PutOp((), "k", {"a": 1}), "namespace is empty"),
    (PutOp(("memories",), "k", [1, 2]), "value must be a dict"),  # type: ignore[arg-type]
    (PutOp(("memories",), "k", {"a": {1, 2}}), "holds a set"),
    (PutOp(("memories",), "k", {"a": float("nan")}), "which JSON cannot"),
    (PutOp(("memories",), "k", {1: "a"}), "key that is not a string"),  # type: ignore[dict-item]
    (PutOp(("memories",), "k", {"a": "\ud800"}), "lone surrogate"),
    (PutOp(("memories",), "k", {"a": 1}, index="text"), "index must be"),  # type: ignore[arg-type]
    (SearchOp(("memories",), limit=1001), "limit must be"),
    (SearchOp(("memories",), offset=-1), "offset must be"),
    (SearchOp(("memories",), {"n": {"$in": [1]}}), "is not one of"),
    (SearchOp(("memories",), {"n": {"$gt": "many"}}), "$gt needs a number"),
    (SearchOp(("memories",), query="q" * 8001), "at most 8000"),
    (ListNamespacesOp(max_depth=0), "max_depth"),
    (ListNamespacesOp((MatchCondition("middle", ("a",)),)), "match_type"),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("op", "message"), BAD, ids=[message for _, message in BAD])
def test_bad_input_stops_its_batch_with_a_clear_error_and_stores_nothing(
    config: MemoryConfig, sql_url: str, op: Op, message: str
) -> None:
    store = MemstoreStore(user_id="alice", config=config)
    with pytest.raises(StoreItemError) as refused:
        store.batch([GOOD, op])
    assert message in str(refused.value)
    assert _counts(sql_url) == (0, 0)


def test_what_langgraph_refuses_and_memstore_does_not_support(config: MemoryConfig, sql_url: str) -> None:
    store = MemstoreStore(user_id="alice", config=config)
    with pytest.raises(NotImplementedError, match="TTL is not supported by MemstoreStore"):
        store.batch([GOOD, PutOp(("memories",), "k", {"a": 1}, ttl=5.0)])
    with pytest.raises(NotImplementedError, match="TTL"):
        store.put(("memories",), "k", {"a": 1}, ttl=5.0)
    with pytest.raises(ValueError, match="periods"):  # LangGraph's own check, before the batch
        store.put(("a.b",), "k", {"a": 1})
    with pytest.raises(StoreItemError, match="at most 1000"):
        store.batch([GetOp(("memories",), f"k{i}") for i in range(1001)])
    assert store.supports_ttl is False
    assert _counts(sql_url) == (0, 0)


def test_the_namespace_user_label_is_checked_and_never_echoed(config: MemoryConfig, sql_url: str) -> None:
    store = MemstoreStore(namespace_user_index=1, config=config)
    with pytest.raises(StoreItemError, match="namespace_user_index 1 needs at least 2"):
        store.batch([GOOD, PutOp(("memories",), "k", {"a": 1})])
    with pytest.raises(StoreItemError, match="needs at least 2"):
        store.get(("memories",), "k")
    for op in (
        PutOp(("memories", SECRET), "k", {"a": 1}),
        GetOp(("memories", SECRET), "k"),
        SearchOp(("memories", SECRET, "notes")),
        ListNamespacesOp((MatchCondition("prefix", ("memories", SECRET)),)),
    ):
        with pytest.raises(InvalidScopeError) as refused:
            store.batch([GOOD, op])
        assert "not a memstore user id" in str(refused.value) and SECRET not in str(refused.value)
    with pytest.raises(ConfigError, match="not both"):
        MemstoreStore(namespace_user_index=1, user_id="alice", config=config)
    with pytest.raises(ConfigError, match="max_items"):
        MemstoreStore(max_items=0, config=config)
    with pytest.raises(ConfigError, match="SQL provider"):
        MemstoreStore(
            config=config.model_copy(update={"storage_class": "memstore.storage.file.FileMemoryStorage"})
        )
    assert _counts(sql_url) == (0, 0)


def test_every_put_and_delete_is_in_the_history_newest_twenty_kept(
    config: MemoryConfig, sql_url: str
) -> None:
    store = MemstoreStore(user_id="alice", config=config)
    for n in range(1, 26):
        store.put(("memories",), "k", {"n": n})
    store.put(("memories",), "other", {"n": 0})
    store.delete(("memories",), "k")
    store.delete(("memories",), "k")  # already deleted: nothing to record
    with get_engine(sql_url).connect() as conn:
        rows = conn.execute(
            select(store_item_history_table)
            .where(store_item_history_table.c.key == "k")
            .order_by(store_item_history_table.c.version)
        ).all()
        item = conn.execute(select(store_items_table).where(store_items_table.c.key == "k")).one()
    assert [(r.version, r.op) for r in rows] == [(v, "put") for v in range(7, 26)] + [(26, "delete")]
    assert [r.value for r in rows[:2]] == ['{"n":7}', '{"n":8}'] and rows[-1].value is None
    assert (item.version, item.value, item.deleted_at is not None) == (26, None, True)
    store.put(("memories",), "k", {"n": 99})  # written again: its history goes on
    assert store.get(("memories",), "k") is not None
    assert _counts(sql_url) == (2, 20 + 1)


def test_a_scope_holds_at_most_max_items_and_deleted_items_make_room(
    config: MemoryConfig, sql_url: str
) -> None:
    store = MemstoreStore(user_id="alice", config=config, max_items=3)
    store.batch([PutOp(("m",), f"k{i}", {"i": i}) for i in range(3)])
    with pytest.raises(StoreItemLimitError, match="4 items in one scope, over its max_items of 3"):
        store.batch([PutOp(("m",), "k0", {"i": 10}), PutOp(("m",), "new", {"i": 4})])
    assert store.get(("m",), "k0").value == {"i": 0}  # type: ignore[union-attr]
    store.batch([PutOp(("m",), "k0", None), PutOp(("m",), "new", {"i": 4})])  # one out, one in
    other = MemstoreStore(user_id="bob", config=config, max_items=3)
    other.put(("m",), "b", {"i": 1})  # another user has a cap of their own
    # Created and deleted again and again: rows stay within twice the cap, history with them.
    for round_ in range(6):
        store.batch([PutOp(("m",), "k1", None), PutOp(("m",), f"tmp{round_}", {"i": round_})])
        store.batch([PutOp(("m",), f"tmp{round_}", None), PutOp(("m",), "k1", {"i": round_})])
    with get_engine(sql_url).connect() as conn:
        mine = conn.execute(select(store_items_table).where(store_items_table.c.user_id == "alice")).all()
        keys = set(conn.execute(select(store_item_history_table.c.key)).scalars())
    assert len(mine) == 6 and sum(row.deleted_at is None for row in mine) == 3
    assert keys == {row.key for row in mine} | {"b"}  # a purged item's history went with it
    assert {item.key for item in store.search(("m",), limit=10)} == {"k1", "k2", "new"}


def test_concurrent_writers_never_pass_the_cap(config: MemoryConfig, sql_url: str) -> None:
    store = MemstoreStore(user_id="alice", config=config, max_items=5)
    refused: list[Exception] = []
    start = threading.Barrier(8)

    def put(i: int) -> None:
        start.wait()
        try:
            store.put(("m",), f"k{i}", {"i": i})
        except StoreItemLimitError as exc:
            refused.append(exc)

    threads = [threading.Thread(target=put, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(refused) == 3 and _counts(sql_url) == (5, 5)


def test_erasing_a_user_takes_their_items_of_every_agent_and_nothing_else(
    config: MemoryConfig, sql_url: str
) -> None:
    def store(tenant: str, user: str, agent: str | None) -> MemstoreStore:
        return MemstoreStore(tenant_id=tenant, user_id=user, agent_name=agent, config=config)

    for tenant, user, agent in (("acme", "alice", None), ("acme", "alice", "coder"), ("acme", "bob", None)):
        target = store(tenant, user, agent)
        target.put(("m",), "k", {"who": f"{tenant}/{user}/{agent}"})
        target.put(("m",), "gone", {"a": 1})
        target.delete(("m",), "gone")
    store("globex", "alice", None).put(("m",), "k", {"who": "globex/alice"})
    counts = erase_user("alice", tenant_id="acme")
    assert counts["memory_store_items"] == 4 and counts["memory_store_item_history"] == 6
    with get_engine(sql_url).connect() as conn:
        left = {(r.tenant_id, r.user_id) for r in conn.execute(select(store_items_table))}
        history = {(r.tenant_id, r.user_id) for r in conn.execute(select(store_item_history_table))}
    assert left == history == {("acme", "bob"), ("globex", "alice")}
    assert store("acme", "alice", "coder").get(("m",), "k") is None
    assert store("globex", "alice", None).get(("m",), "k") is not None


def test_a_cancelled_abatch_stores_nothing_of_its_batch(config: MemoryConfig, sql_url: str) -> None:
    """Cancelled once its first row is sent, on the async driver: the batch is one transaction."""
    store = MemstoreStore(user_id="alice", config=config)
    puts: list[Op] = [PutOp(("m", f"n{i % 7}"), f"k{i}", {"text": f"item {i} " * 50}) for i in range(400)]
    seen: list[tuple[bool, str]] = []

    async def main() -> None:
        writing = asyncio.Event()

        def statement(conn: Connection, cursor: Any, sql: str, *args: Any) -> None:
            seen.append((conn.dialect.is_async, sql))
            if sql.startswith("INSERT INTO memory_store_items"):
                writing.set()  # the greenlet runs on the loop's thread

        event.listen(Engine, "before_cursor_execute", statement)
        try:
            task = asyncio.ensure_future(store.abatch(puts))
            await writing.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            event.remove(Engine, "before_cursor_execute", statement)
        assert await asyncio.to_thread(_counts, sql_url) == (0, 0)
        await store.abatch(puts)
        await dispose_loop_engines()

    asyncio.run(main())
    assert _counts(sql_url) == (400, 400)
    assert any(sql.startswith("INSERT INTO memory_store_items") for _, sql in seen)
    assert all(is_async for is_async, _ in seen)  # every statement on the async driver, none in a thread


@pytest.mark.postgres
def test_upgrading_to_0012_grants_the_existing_app_role_the_store_tables(pg_url: str) -> None:
    migrate.upgrade(pg_url)
    with app_role_url(pg_url, "memstore_pre12") as app_url:
        role = str(make_url(app_url).username)
        granted = _privileges(pg_url, role)
        assert granted == {
            "memory_store_items": {"SELECT", "INSERT", "DELETE"},
            "memory_store_item_history": {"SELECT", "INSERT", "DELETE"},
            "memory_store_items columns": {
                "value",
                "indexed_text",
                "model",
                "dimension",
                "embedding",
                "version",
                "created_at",
                "updated_at",
                "deleted_at",
            },
            "memory_store_item_history columns": set(),
        }
        migrate.downgrade(pg_url, "0011")
        migrate.upgrade(pg_url)
        assert _privileges(pg_url, role) == granted
        dispose_engines()
        config = MemoryConfig(database_url=app_url)
        store = MemstoreStore(tenant_id="acme", namespace_user_index=1, config=config)
        store.put(("memories", "alice"), "k", {"a": 1})
        store.put(("memories", "alice"), "k", {"a": 2})
        assert store.get(("memories", "alice"), "k").value == {"a": 2}  # type: ignore[union-attr]
        dispose_engines()


def _privileges(url: str, role: str) -> dict[str, set[str]]:
    engine = create_engine(url)
    found: dict[str, set[str]] = {}
    try:
        with engine.connect() as conn:
            for table in ("memory_store_items", "memory_store_item_history"):
                found[table] = {
                    privilege
                    for privilege in (
                        "SELECT",
                        "INSERT",
                        "UPDATE",
                        "DELETE",
                        "TRUNCATE",
                        "REFERENCES",
                        "TRIGGER",
                    )
                    if conn.execute(
                        text("SELECT has_table_privilege(:r, :t, :p)"),
                        {"r": role, "t": table, "p": privilege},
                    ).scalar_one()
                }
                found[f"{table} columns"] = set(
                    conn.execute(
                        text(
                            "SELECT column_name FROM information_schema.column_privileges "
                            "WHERE grantee = :r AND table_name = :t AND privilege_type = 'UPDATE'"
                        ),
                        {"r": role, "t": table},
                    ).scalars()
                )
    finally:
        engine.dispose()
    return found
