"""Read replicas (``database_read_url``) against a real streaming replica.

A private primary and a hot standby made from it with ``pg_basebackup -R`` (tests/support/
pg_cluster.py) run for this module. Statements are counted per server port, so each test shows
which server answered. Pausing the standby's WAL replay (``pg_wal_replay_pause()``) gives real
lag; stopping it is the replica going down. Without server binaries the tests skip, except under
``CI=true`` where they fail.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from memstore.async_face import run_on_loop
from memstore.config import MemoryConfig, build_memory_config, get_memory_config, set_memory_config
from memstore.errors import ConfigError
from memstore.metrics import REGISTRY
from memstore.storage.records import FactFilter
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import dispose_engines, dispose_loop_engines
from memstore.storage.sql.schema.migrate import upgrade
from tests.support.app_role import app_role_url
from tests.support.pg_cluster import PgCluster, replicated_cluster
from tests.support.semantic import fact

USER = "alice"
WAIT_SECONDS = 30.0


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[PgCluster, PgCluster]]:
    with replicated_cluster() as running:
        yield running


@pytest.fixture
def urls(servers: tuple[PgCluster, PgCluster]) -> Iterator[tuple[str, str]]:
    """A migrated database on the primary and its URL on the replica, once the replica has it."""
    primary, replica = servers
    try:
        with primary.database() as url:
            upgrade(url)
            read_url = url.replace(f":{primary.port}/", f":{replica.port}/")
            caught_up(url, read_url)
            set_memory_config(MemoryConfig(database_url=url, database_read_url=read_url))
            yield url, read_url
            dispose_engines()
            if not (replica.data / "postmaster.pid").exists():
                replica.start()
            _admin(read_url, "SELECT pg_wal_replay_resume()")
    finally:
        set_memory_config(None)
        dispose_engines()


def _admin(url: str, statement: str) -> Any:
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return conn.execute(text(statement)).scalar()
    finally:
        engine.dispose()


def caught_up(url: str, read_url: str) -> None:
    """Wait until the replica has replayed everything the primary has written so far.

    The cluster commits asynchronously (``synchronous_commit=off``), so a synchronous commit of a
    write (a row of a marker table in the ``postgres`` database) first flushes the WAL up to it, and
    the replica is waited for up to that point.
    """
    engine = create_engine(url.rsplit("/", 1)[0] + "/postgres", poolclass=NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(text("SET LOCAL synchronous_commit = on"))
            conn.execute(text("CREATE TABLE IF NOT EXISTS replica_mark (at timestamptz)"))
            conn.execute(text("INSERT INTO replica_mark VALUES (now())"))
    finally:
        engine.dispose()
    target = _admin(url, "SELECT pg_current_wal_flush_lsn()::text")
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        try:
            if _admin(read_url, f"SELECT pg_last_wal_replay_lsn() >= '{target}'::pg_lsn"):
                return
        except Exception:  # the database may not exist on the replica yet: its creation replays
            pass
        time.sleep(0.05)
    raise AssertionError(f"the replica did not reach {target} within {WAIT_SECONDS}s")


@contextmanager
def lagging(read_url: str) -> Iterator[None]:
    """The replica's replay paused: it keeps serving reads as of now while the primary moves on."""
    _admin(read_url, "SELECT pg_wal_replay_pause()")
    deadline = time.monotonic() + WAIT_SECONDS
    while _admin(read_url, "SELECT pg_get_wal_replay_pause_state()") != "paused":
        assert time.monotonic() < deadline, "the replica's replay did not pause"
        time.sleep(0.02)
    try:
        yield
    finally:
        _admin(read_url, "SELECT pg_wal_replay_resume()")


@contextmanager
def statements_by_port() -> Iterator[Counter[int]]:
    """Statements sent to each server (by port), through any engine, on either face."""
    seen: Counter[int] = Counter()

    def record(conn: Any, *_args: Any) -> None:
        seen[int(conn.engine.url.port)] += 1

    event.listen(Engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(Engine, "before_cursor_execute", record)


def port(url: str) -> int:
    return int(make_url(url).port or 0)


def contents(document: dict[str, Any]) -> set[str]:
    return {fact["content"] for fact in document["facts"]}


def remember(storage: SqlMemoryStorage, *words: str) -> None:
    document = storage.load(user_id=USER)
    document["facts"] = [*document["facts"], *(fact(f"fact_{word}", f"likes {word}") for word in words)]
    assert storage.save(document, user_id=USER)


def unit(*values: float) -> np.ndarray:
    vector = np.array(values, dtype=np.float32)
    return vector / np.linalg.norm(vector)


def another_process(url: str, read_url: str) -> SqlMemoryStorage:
    """A storage with read-your-writes state of its own, as in another process: the same databases
    under other spellings of their URLs (a process shares that state per pair of URLs)."""
    config = get_memory_config()
    set_memory_config(
        MemoryConfig(
            database_url=f"{url}?application_name=other",
            database_read_url=f"{read_url}?application_name=other",
        )
    )
    try:
        return SqlMemoryStorage()
    finally:
        set_memory_config(config)


def served(label: str) -> float:
    return REGISTRY.get_sample_value("memstore_replica_reads_total", {"served_by": label}) or 0.0


@pytest.mark.postgres
def test_loads_searches_and_queries_are_served_by_the_replica(urls: tuple[str, str]) -> None:
    url, read_url = urls
    writer = SqlMemoryStorage()
    document = writer.load(user_id=USER)
    document["facts"] = [fact("fact_tea", "likes tea"), fact("fact_chess", "likes chess")]
    with statements_by_port() as sent:
        assert writer.save(document, user_id=USER)
        vectors = [("fact_tea", "likes tea", unit(1, 0)), ("fact_chess", "likes chess", unit(0, 1))]
        writer.vectors.store_vectors((USER, None), "m", vectors)
    assert sent[port(read_url)] == 0 and sent[port(url)] > 0, "writes go to the primary"
    caught_up(url, read_url)

    reader = another_process(url, read_url)  # nothing of the writer's in its cache or router
    assert reader.list_scopes("nobody") == []  # the first read compares the roles on both servers
    before = served("replica")
    with statements_by_port() as sent:
        assert contents(reader.load(user_id=USER)) == {"likes tea", "likes chess"}
        assert contents(reader.load(user_id=USER)) == {"likes tea", "likes chess"}  # the stamp check
        page = reader.query_facts(FactFilter(user_id=USER), search=None, limit=10, offset=0)
        assert {fact.content for fact in page.facts} == {"likes tea", "likes chess"}
        found = reader.query_facts(FactFilter(user_id=USER), search="chess", limit=10, offset=0)
        assert [fact.content for fact in found.facts] == ["likes chess"]
        assert reader.list_scopes(USER) == [(USER, None)]
        assert len(reader.history(FactFilter(user_id=USER), fact_id=None, limit=10)) == 2
        assert set(reader.vectors.fact_vectors((USER, None), "m", [("fact_tea", "likes tea")])) == {
            "fact_tea"
        }
        near = reader.vectors.nearest_facts(
            FactFilter(user_id=USER), unit(0.2, 1), model="m", limit=1, offset=0
        )
        assert [hit.content for hit in near.facts] == ["likes chess"]
    assert sent[port(url)] == 0, f"the primary answered reads: {dict(sent)}"
    assert sent[port(read_url)] >= 8
    assert served("replica") - before == 8

    fresh = reader.reload(user_id=USER)  # the explicit fresh read is the primary's
    assert contents(fresh) == {"likes tea", "likes chess"}


@pytest.mark.postgres
def test_a_caller_reads_its_own_writes_while_the_replica_lags(urls: tuple[str, str]) -> None:
    url, read_url = urls
    writer = SqlMemoryStorage()
    remember(writer, "tea")
    caught_up(url, read_url)
    with lagging(read_url):
        remember(writer, "chess")
        other = another_process(url, read_url)  # which never saw the write
        assert contents(other.load(user_id=USER)) == {"likes tea"}, "the replica serves a stale view"
        before = served("primary")
        with statements_by_port() as sent:
            assert contents(writer.load(user_id=USER)) == {"likes tea", "likes chess"}
            page = writer.query_facts(FactFilter(user_id=USER), search=None, limit=10, offset=0)
            assert {fact.content for fact in page.facts} == {"likes tea", "likes chess"}
            found = writer.query_facts(FactFilter(user_id=USER), search="chess", limit=10, offset=0)
            assert [fact.content for fact in found.facts] == ["likes chess"]
        assert sent[port(url)] > 0 and served("primary") - before == 3
        # Another user's reads are not held back by this user's writes.
        assert writer.list_scopes("bob") == []

        writer.erase_user(USER)
        assert contents(writer.load(user_id=USER)) == set(), "the erase is read back at once"
        assert writer.query_facts(FactFilter(user_id=USER), search=None, limit=10, offset=0).facts == []
        assert contents(another_process(url, read_url).load(user_id=USER)) == {"likes tea"}  # stale
    caught_up(url, read_url)
    with statements_by_port() as sent:
        assert contents(writer.load(user_id=USER)) == set()
        assert writer.query_facts(FactFilter(user_id=USER), search=None, limit=10, offset=0).facts == []
    assert sent[port(url)] == 0, "once the replica has the writes, it serves the writer again"


@pytest.mark.postgres
def test_a_load_never_goes_back_to_an_older_revision(urls: tuple[str, str]) -> None:
    url, read_url = urls
    writer = SqlMemoryStorage()
    reader = another_process(url, read_url)
    remember(writer, "tea")
    caught_up(url, read_url)
    with lagging(read_url):
        remember(writer, "chess")
        assert contents(reader.reload(user_id=USER)) == {"likes tea", "likes chess"}  # the primary
        assert contents(reader.load(user_id=USER)) == {"likes tea", "likes chess"}, (
            "not the replica's older one"
        )


@pytest.mark.postgres
def test_a_load_never_goes_back_to_a_scope_the_replica_lacks(urls: tuple[str, str]) -> None:
    url, read_url = urls
    with lagging(read_url):
        remember(another_process(url, read_url), "tea")  # a scope the replica has not seen created
        reader = SqlMemoryStorage()
        assert contents(reader.reload(user_id=USER)) == {"likes tea"}  # the primary
        assert contents(reader.load(user_id=USER)) == {"likes tea"}, "not the replica's empty answer"


def share(storage: SqlMemoryStorage, owner: str, fact_id: str, content: str, visibility: str) -> None:
    editor = storage.for_identity(roles=["editor"])
    document = editor.load(user_id=owner)
    shared = fact(fact_id, content)
    shared["visibility"] = visibility
    document["facts"] = [item for item in document["facts"] if item["id"] != fact_id] + [shared]
    assert editor.save(document, user_id=owner)


def others_facts(storage: SqlMemoryStorage) -> dict[str, set[str]]:
    """What alice reads of other users' facts, by every cross-user read path."""
    where = FactFilter(user_id=USER)
    return {
        "visible": {item["content"] for item in storage.visible_facts(user_id=USER)},
        "query": {hit.content for hit in storage.query_facts(where, search=None, limit=10, offset=0).facts},
        "search": {
            hit.content for hit in storage.query_facts(where, search="fridays", limit=10, offset=0).facts
        },
        "history": {entry.entity_id for entry in storage.history(where, fact_id=None, limit=10)},
    }


@pytest.mark.postgres
def test_other_users_reads_see_an_erase_or_unsharing_of_this_process_at_once(urls: tuple[str, str]) -> None:
    url, read_url = urls
    storage = SqlMemoryStorage()
    share(storage, "bob", "fact_pub", "bob deploys on fridays", "public")
    share(storage, "carol", "fact_car", "carol deploys on fridays", "public")
    caught_up(url, read_url)
    both = {"bob deploys on fridays", "carol deploys on fridays"}
    assert others_facts(storage)["visible"] == both
    with lagging(read_url):
        storage.erase_user("bob")
        share(storage, "carol", "fact_car", "carol deploys on fridays", "private")
        before = served("primary")
        seen = others_facts(storage)
        assert seen["visible"] == seen["query"] == seen["search"] == set(), seen
        assert served("primary") - before == 4, "served by the primary"
        assert SqlMemoryStorage().visible_facts(user_id=USER) == [], "a storage on the same URLs too"
        stale = another_process(url, read_url)  # the replica's view, which still shows both
        assert {item["content"] for item in stale.visible_facts(user_id=USER)} == both
        # Another tenant's reads are not held back by this tenant's writes.
        with statements_by_port() as sent:
            storage.for_identity(tenant_id="other").visible_facts(user_id=USER)
        assert sent[port(url)] == 0
    caught_up(url, read_url)
    with statements_by_port() as sent:
        assert others_facts(storage)["visible"] == set()
    assert sent[port(url)] == 0, "once the replica has the writes, it serves them again"


@pytest.mark.postgres
def test_storages_on_the_same_urls_share_read_your_writes_and_its_bound_holds_a_tenant(
    urls: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, read_url = urls
    monkeypatch.setattr("memstore.storage.sql.replica_pending.MAX_PENDING_SCOPES", 2)
    writer = SqlMemoryStorage()
    with lagging(read_url):
        remember(writer, "tea")
        adapter = SqlMemoryStorage()  # a host's adapter builds its own storage on the same URLs
        assert contents(adapter.load(user_id=USER)) == {"likes tea"}
        for user in ("bob", "carol"):  # USER's pending scope is forgotten past the bound ...
            document = adapter.load(user_id=user)
            document["facts"] = [fact("f", "x")]
            assert writer.save(document, user_id=user)
        before = served("primary")
        assert contents(another_process(url, read_url).load(user_id=USER)) == set()
        assert contents(SqlMemoryStorage().load(user_id=USER)) == {"likes tea"}  # ... its tenant held
        assert served("primary") - before == 1


@pytest.mark.postgres
def test_vectors_stored_are_searched_at_once(urls: tuple[str, str]) -> None:
    url, read_url = urls
    storage = SqlMemoryStorage()
    remember(storage, "tea")
    caught_up(url, read_url)
    assert storage.load(user_id=USER)["facts"]  # the replica has the scope: no pending revision
    with lagging(read_url):
        storage.vectors.store_vectors((USER, None), "m", [("fact_tea", "likes tea", unit(1, 0))])
        near = storage.vectors.nearest_facts(
            FactFilter(user_id=USER), unit(1, 0), model="m", limit=1, offset=0
        )
        assert [hit.content for hit in near.facts] == ["likes tea"]
        assert set(storage.vectors.fact_vectors((USER, None), "m", [("fact_tea", "likes tea")])) == {
            "fact_tea"
        }
        stale = another_process(url, read_url).vectors
        assert (
            stale.nearest_facts(FactFilter(user_id=USER), unit(1, 0), model="m", limit=1, offset=0).facts
            == []
        )


@pytest.mark.postgres
def test_a_frozen_replica_sends_reads_to_the_primary(
    servers: tuple[PgCluster, PgCluster], urls: tuple[str, str]
) -> None:
    url, read_url = urls
    _, replica = servers
    storage = SqlMemoryStorage()
    remember(storage, "tea")
    caught_up(url, read_url)
    reader = another_process(url, read_url)
    assert contents(reader.load(user_id=USER)) == {"likes tea"}  # a pooled replica connection
    remember(storage, "chess")
    caught_up(url, read_url)
    result: dict[str, Any] = {}

    def read() -> None:
        try:
            result["document"] = contents(another_process(url, read_url).load(user_id=USER))
        except Exception as exc:  # reported by the assertion below
            result["error"] = exc

    replica.freeze()
    try:
        thread = threading.Thread(target=read, daemon=True)
        thread.start()
        thread.join(WAIT_SECONDS)
        assert not thread.is_alive(), "a read hung on the frozen replica"
        assert result == {"document": {"likes tea", "likes chess"}}
        page = reader.query_facts(FactFilter(user_id=USER), search="chess", limit=10, offset=0)
        assert [hit.content for hit in page.facts] == ["likes chess"]  # the primary, while down
    finally:
        replica.thaw()


@pytest.mark.postgres
def test_an_error_on_the_replica_is_retried_on_the_primary_without_a_back_off(
    servers: tuple[PgCluster, PgCluster], urls: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    url, read_url = urls
    primary, _ = servers
    with primary.database() as unmigrated:  # the replica "behind a migration": no tables there
        replica_db = unmigrated.replace(f":{primary.port}/", f":{port(read_url)}/")
        caught_up(url, replica_db)
        set_memory_config(MemoryConfig(database_url=url, database_read_url=replica_db))
        writer = SqlMemoryStorage()
        remember(writer, "tea")
        caplog.set_level(logging.WARNING, logger="memstore.storage.sql.replica")
        before = served("fallback")
        for _ in range(3):
            with statements_by_port() as sent:
                assert contents(another_process(url, replica_db).load(user_id=USER)) == {"likes tea"}
            assert sent[port(read_url)] > 0, "the replica is asked every time: no back-off"
        assert served("fallback") - before == 3
        noted = [r.getMessage() for r in caplog.records if "could not serve" in r.getMessage()]
        assert len(noted) == 2 and all("UndefinedTable" in message for message in noted), noted  # per URL
        assert not [r for r in caplog.records if "unreachable" in r.getMessage()]
        dispose_engines()


@pytest.mark.postgres
def test_a_replica_role_that_row_level_security_does_not_bind_is_refused(
    urls: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    url, read_url = urls
    with app_role_url(url) as app_url:
        set_memory_config(MemoryConfig(database_url=app_url, database_read_url=read_url))  # a superuser
        storage = SqlMemoryStorage()
        remember(storage, "tea")
        caught_up(url, read_url)
        caplog.set_level(logging.ERROR, logger="memstore.storage.sql.replica")
        before = served("fallback")
        with statements_by_port() as sent:
            assert contents(another_process(app_url, read_url).load(user_id=USER)) == {"likes tea"}
            assert contents(SqlMemoryStorage().load(user_id=USER)) == {"likes tea"}
        assert served("fallback") - before == 2
        refused = [r for r in caplog.records if r.levelno == logging.ERROR and "refused" in r.getMessage()]
        assert refused and "row-level security" in refused[0].getMessage()
        assert sent[port(read_url)] <= 2, "only the role checks reach the replica"

        app_read_url = app_url.replace(f":{port(url)}/", f":{port(read_url)}/")  # the role replicated
        set_memory_config(MemoryConfig(database_url=app_url, database_read_url=app_read_url))
        other = another_process(app_url, app_read_url)
        with statements_by_port() as sent, recorded_statements() as statements:
            assert contents(other.load(user_id=USER)) == {"likes tea"}
            assert other.query_facts(FactFilter(user_id="bob"), search=None, limit=10, offset=0).facts == []
        assert sent[port(url)] == 0 and sent[port(read_url)] > 0
        assert any("set_config('memstore.tenant_id'" in statement for statement in statements), (
            "the replica's reads run under the policies"
        )
        dispose_engines()


@contextmanager
def recorded_statements() -> Iterator[list[str]]:
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    event.listen(Engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(Engine, "before_cursor_execute", record)


@pytest.mark.postgres
def test_a_replica_down_sends_reads_to_the_primary_until_it_returns(
    servers: tuple[PgCluster, PgCluster], urls: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    url, read_url = urls
    _, replica = servers
    storage = SqlMemoryStorage()
    remember(storage, "tea")
    caught_up(url, read_url)
    assert contents(SqlMemoryStorage().load(user_id=USER)) == {"likes tea"}  # pools a replica connection
    replica.stop()
    caplog.set_level(logging.INFO, logger="memstore.storage.sql.replica")
    remember(storage, "chess")
    before = served("fallback")
    for _ in range(5):
        other = SqlMemoryStorage()
        assert contents(other.load(user_id=USER)) == {"likes tea", "likes chess"}
        page = other.query_facts(FactFilter(user_id=USER), search="chess", limit=10, offset=0)
        assert [fact.content for fact in page.facts] == ["likes chess"]
    assert served("fallback") - before == 10
    down = [r for r in caplog.records if "unreachable" in r.getMessage()]
    assert len(down) == 1 and f":{replica.port}/" in down[0].getMessage(), "logged once per outage"

    replica.start()
    caught_up(url, read_url)
    deadline = time.monotonic() + 60
    while True:  # the replica is tried again after its back-off
        with statements_by_port() as sent:
            assert contents(SqlMemoryStorage().load(user_id=USER)) == {"likes tea", "likes chess"}
        if sent[port(read_url)] > 0 and sent[port(url)] == 0:
            break
        assert time.monotonic() < deadline, "the replica never served reads again"
        time.sleep(0.2)
    assert any("serves reads again" in r.getMessage() for r in caplog.records)
    assert len([r for r in caplog.records if "unreachable" in r.getMessage()]) == 1


@pytest.mark.postgres
def test_the_async_face_reads_the_replica_through_its_own_engine(urls: tuple[str, str]) -> None:
    url, read_url = urls
    writer = SqlMemoryStorage()
    remember(writer, "tea")
    caught_up(url, read_url)
    reader = SqlMemoryStorage()

    async def load() -> dict[str, Any]:
        try:
            with statements_by_port() as sent:
                document = await run_on_loop(reader.load, user_id=USER)
            assert sent[port(url)] == 0 and sent[port(read_url)] > 0
            return dict(document)
        finally:
            await dispose_loop_engines()

    assert contents(asyncio.run(load())) == {"likes tea"}
    with lagging(read_url):
        remember(writer, "chess")

        async def own_write() -> dict[str, Any]:
            try:
                return dict(await run_on_loop(writer.load, user_id=USER))
            finally:
                await dispose_loop_engines()

        assert contents(asyncio.run(own_write())) == {"likes tea", "likes chess"}


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        ({"database_read_url": "postgresql://r/memstore"}, "needs database_url"),
        ({"database_url": "sqlite:///m.db", "database_read_url": "postgresql://r/m"}, "needs database_url"),
        ({"database_url": "postgresql://p/m", "database_read_url": "sqlite:///m.db"}, "must be a postgresql"),
        ({"database_url": "postgresql://p/m", "database_read_url": "mysql://r/m"}, "must be a postgresql"),
        ({"database_url": "postgresql://p/m", "database_read_url": "not a url"}, "must be a postgresql"),
    ],
)
def test_a_replica_must_be_postgresql_behind_a_postgresql_primary(
    values: dict[str, str], problem: str
) -> None:
    with pytest.raises(ConfigError, match=problem):
        build_memory_config(values)


def test_a_storage_on_another_database_ignores_the_replica(tmp_path: Any) -> None:
    set_memory_config(
        MemoryConfig(
            database_url="postgresql://127.0.0.1:1/p",
            database_read_url="postgresql://127.0.0.1:1/r",
            auto_migrate=True,
        )
    )
    try:
        storage = SqlMemoryStorage(f"sqlite:///{tmp_path / 'other.db'}")
        assert not storage._routes.replicated
        assert storage.load(user_id=USER)["facts"] == []
    finally:
        set_memory_config(None)
        dispose_engines()
