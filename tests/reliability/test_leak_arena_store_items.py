"""The leak arena for the LangGraph store's items: canary items of several users, agents and
tenants (live, overwritten, deleted), read back by every identity through every read path of
``MemstoreStore`` (gets, searches with and without a filter or a query, namespace listings; the
user named by the namespace and the user bound to the request; ``batch`` and ``abatch``) on SQLite,
on PostgreSQL as a superuser and on PostgreSQL as an application role that row-level security
binds. An identity must see exactly its own live canaries: never another tenant's, another user's
or another agent's, never an overwritten or deleted value (those live on only in the history).
What an identity writes lands in its own scope, and erasing a user takes exactly that user's items.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from langgraph.store.base import GetOp, ListNamespacesOp, MatchCondition, Op, SearchOp
from sqlalchemy import create_engine, select

from memstore.config import MemoryConfig, set_memory_config
from memstore.gateway.user_context import reset_current_user, set_current_user
from memstore.integrations.langgraph_store import MemstoreStore
from memstore.queries import erase_user
from memstore.storage.loader import reset_memory_storage
from memstore.storage.sql.engine import dispose_loop_engines
from memstore.storage.sql.schema.models import store_item_history_table, store_items_table
from tests.support.app_role import app_role_url

TENANTS = {"acme": ("alice", "bob"), "globex": ("alice",)}
AGENTS = (None, "coder")
READERS: tuple[tuple[str, str], ...] = (
    ("acme", "alice"),
    ("acme", "bob"),
    ("acme", "carol"),  # nothing of her own
    ("globex", "alice"),  # the same user id in another tenant: another person
    ("initech", "alice"),  # a tenant with nothing
)
KEYS = ("live", "overwritten", "deleted")
Where = tuple[str, str, str]
"""An item's scope as stored: ``(tenant, user, agent or '')``."""


@dataclass
class Arena:
    writer: str
    """The URL the canaries are seeded through (the database's owner)."""
    reader: str
    """The URL every identity reads and writes through (the app role where there is one)."""
    operator: str | None


@pytest.fixture(params=["sqlite", "postgresql", "postgresql-app-role"])
def arena(request: pytest.FixtureRequest) -> Iterator[Arena]:
    if request.param == "sqlite":
        url = str(request.getfixturevalue("sqlite_url"))
        yield Arena(url, url, None)
        return
    request.applymarker(pytest.mark.postgres)
    owner = str(request.getfixturevalue("postgres_url"))
    if request.param == "postgresql":
        yield Arena(owner, owner, None)
        return
    with app_role_url(owner, "memstore_store_items") as url:
        yield Arena(owner, url, owner)


def _config(url: str, arena: Arena) -> MemoryConfig:
    config = MemoryConfig(
        database_url=url, operator_database_url=arena.operator if url == arena.reader else None
    )
    set_memory_config(config)
    reset_memory_storage()
    return config


def _canary() -> str:
    return f"canary-{secrets.token_hex(8)}"


def _seed(config: MemoryConfig) -> tuple[dict[str, Where], set[str]]:
    """Each scope's items in a namespace naming its user and in one naming none; returns the live
    canaries with their scope, and the canaries no one may read (overwritten or deleted)."""
    live: dict[str, Where] = {}
    gone: set[str] = set()
    for tenant, users in TENANTS.items():
        for user in users:
            for agent in AGENTS:
                where = (tenant, user, agent or "")
                by_label = MemstoreStore(
                    tenant_id=tenant, namespace_user_index=1, agent_name=agent, config=config
                )
                fixed = MemstoreStore(tenant_id=tenant, user_id=user, agent_name=agent, config=config)
                for store, namespace in ((by_label, ("memories", user, "notes")), (fixed, ("profile",))):
                    first, old, second, deleted = _canary(), _canary(), _canary(), _canary()
                    store.put(namespace, "live", {"text": f"shared words {first}", "n": 1})
                    store.put(namespace, "overwritten", {"text": f"shared words {old}"})
                    store.put(namespace, "overwritten", {"text": f"shared words {second}", "n": 2})
                    store.put(namespace, "deleted", {"text": f"shared words {deleted}"})
                    store.delete(namespace, "deleted")
                    live[first] = live[second] = where
                    gone |= {old, deleted}
    return live, gone


def _reads(user: str, by_label: bool) -> list[Op]:
    """Every read of a store naming users by label (a get needs the user's label) or not."""
    named = ("memories", user, "notes")
    gets: list[Op] = [GetOp(named if by_label else ("profile",), key) for key in KEYS]
    return [
        *gets,
        SearchOp((), limit=100),
        SearchOp(("memories",), limit=100),
        SearchOp(("memories", user), limit=100),
        SearchOp(("memories", user), {"n": {"$gte": 1}}, limit=100),
        SearchOp(("memories", user), query="shared words", limit=100),
        SearchOp(("profile",), query="canary", limit=100),
        ListNamespacesOp(limit=100),
        ListNamespacesOp((MatchCondition("prefix", ("memories", "*")),), limit=100),
        ListNamespacesOp((MatchCondition("prefix", ("memories", user)),), limit=100),
    ]


def _everything_read(config: MemoryConfig, tenant: str, user: str) -> str:
    """Every read path's output for the identity (bound as the request's user), as one text."""
    seen: list[object] = []
    token = set_current_user(user, tenant_id=tenant)
    try:
        for agent in (*AGENTS, "stranger"):
            for by_label in (True, False):
                index = 1 if by_label else None
                store = MemstoreStore(namespace_user_index=index, agent_name=agent, config=config)
                reads = _reads(user, by_label)
                seen.append(store.batch(reads))

                async def main(store: MemstoreStore = store, reads: list[Op] = reads) -> list[Any]:
                    try:
                        return await store.abatch(reads)
                    finally:
                        await dispose_loop_engines()

                seen.append(asyncio.run(main()))
    finally:
        reset_current_user(token)
    return repr(seen)


def _assert_each_reads_its_own(config: MemoryConfig, live: dict[str, Where], gone: set[str]) -> None:
    for tenant, user in READERS:
        seen = _everything_read(config, tenant, user)
        own = {text for text, where in live.items() if where[:2] == (tenant, user)}
        assert {text for text in live if text in seen} == own, (tenant, user)
        assert not any(text in seen for text in gone), (tenant, user)


def _rows(url: str) -> dict[str, set[tuple[Any, ...]]]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return {
                table.name: {
                    (r.tenant_id, r.user_id, r.agent_name, r.namespace, r.key, r.version, r.value)
                    for r in conn.execute(select(table))
                }
                for table in (store_items_table, store_item_history_table)
            }
    finally:
        engine.dispose()


def test_every_identity_reads_exactly_its_own_items(arena: Arena) -> None:
    live, gone = _seed(_config(arena.writer, arena))
    assert len(live) == 2 * 2 * 2 * 3 and len(gone) == 2 * 2 * 3 * 2
    _assert_each_reads_its_own(_config(arena.reader, arena), live, gone)


def test_what_an_identity_writes_lands_in_its_own_scope(arena: Arena) -> None:
    live, gone = _seed(_config(arena.writer, arena))
    config = _config(arena.reader, arena)
    for tenant, user in READERS:
        token = set_current_user(user, tenant_id=tenant)
        try:
            for agent in AGENTS:
                for store, namespace in (
                    (
                        MemstoreStore(namespace_user_index=1, agent_name=agent, config=config),
                        ("memories", user),
                    ),
                    (MemstoreStore(agent_name=agent, config=config), ("profile", "new")),
                ):
                    canary = _canary()
                    store.put(namespace, "new", {"text": canary})
                    live[canary] = (tenant, user, agent or "")
        finally:
            reset_current_user(token)
    rows = _rows(arena.writer)
    for text, where in live.items():
        holders = {row[:3] for table in rows.values() for row in table if text in (row[6] or "")}
        assert holders == {where}, text
    _assert_each_reads_its_own(config, live, gone)


def test_erasing_a_user_takes_exactly_that_users_items(arena: Arena) -> None:
    live, gone = _seed(_config(arena.writer, arena))
    before = _rows(arena.writer)
    config = _config(arena.reader, arena)
    counts = erase_user("alice", tenant_id="acme")
    # Two agents, two namespaces, three keys each (a deleted one keeps its row); five history rows each.
    assert counts["memory_store_items"] == 2 * 2 * 3 and counts["memory_store_item_history"] == 2 * 2 * 5
    after = _rows(arena.writer)
    assert after == {
        name: {row for row in rows if row[:2] != ("acme", "alice")} for name, rows in before.items()
    }
    assert any(row[:2] == ("globex", "alice") for row in after["memory_store_items"])
    left = {text: where for text, where in live.items() if where[:2] != ("acme", "alice")}
    erased = set(live) - set(left)
    assert len(erased) == 2 * 2 * 2
    _assert_each_reads_its_own(config, left, gone | erased)
