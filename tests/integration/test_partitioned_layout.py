"""``memstore db partition``: the migration keeps every row, key, grant and policy; history's months.

The storage contract suite runs on the partitioned layout too (``postgresql-partitioned`` in
``conftest.py``); these tests cover what only this layout has.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from memstore.config import MemoryConfig
from memstore.document import create_empty_memory
from memstore.ops.embeddings import embed_facts
from memstore.queries import FactFilter, search_facts
from memstore.storage.loader import reset_memory_storage
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import dispose_engines, get_engine
from memstore.storage.sql.maintenance import history_months, partition
from memstore.storage.sql.maintenance.erase import vacuum
from memstore.storage.sql.maintenance.history_months import DEFAULT_PARTITION, Month
from memstore.storage.sql.schema import migrate, rls
from memstore.storage.sql.schema.models import Base
from memstore.storage.sql.schema.partition_layout import is_partitioned
from tests.support.app_role import app_role_url
from tests.support.openai_server import OpenAIStubServer
from tests.support.postgres import fresh_database
from tests.support.semantic import MODEL

pytestmark = pytest.mark.postgres
_NOW = datetime.now(UTC)
_HISTORY_COLUMNS = "scope_id, revision, changed_at, entity, entity_id, action, origin"


def _fact(fact_id: str, content: str, **extra: Any) -> dict[str, Any]:
    return {"id": fact_id, "content": content, "category": "context", "confidence": 0.8,
            "createdAt": "2026-07-14T15:35:46Z", "source": "thread-1", **extra}  # fmt: skip


def _doc(*facts: dict[str, Any]) -> dict[str, Any]:
    doc = create_empty_memory()
    doc["facts"] = list(facts)
    return doc


def _memstore(*args: str) -> subprocess.CompletedProcess[str]:
    executable = shutil.which("memstore", path=str(Path(sys.executable).parent))
    assert executable is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTORE_")}
    return subprocess.run([executable, *args], capture_output=True, text=True, env=env, check=False)


def _rows(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every memory table, in a stable order."""
    with get_engine(url).connect() as conn:
        return {
            name: sorted(map(tuple, conn.execute(text(f"SELECT * FROM {name}")).all()), key=repr)
            for name in sorted(Base.metadata.tables)
        }


def _fill(url: str) -> None:
    storage = SqlMemoryStorage(url)
    for user in ("alice", "bob", "carol"):
        facts = [_fact(f"fact_{user}_{i:02d}", f"{user} fact {i}", tags=["t1"]) for i in range(5)]
        assert storage.save(_doc(*facts), user_id=user)
        assert storage.save(_doc(*facts[1:]), user_id=user)  # a tombstone and more history
    with get_engine(url).begin() as conn:  # history of past months, as a long-lived database has
        conn.execute(
            text(
                f"INSERT INTO memory_history ({_HISTORY_COLUMNS}) "
                "SELECT id, 1, :now - make_interval(days => 40 * g), 'fact', 'old', 'insert', 'test' "
                "FROM memory_scopes, generate_series(1, 6) g"
            ),
            {"now": _NOW},
        )


def _partition(url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    done = _memstore("db", "partition", "--partitions", "4", "--url", url, *extra)
    dispose_engines()
    return done


def test_the_migration_keeps_every_row_and_the_schema_checks(postgres_url: str) -> None:
    _fill(postgres_url)
    before = _rows(postgres_url)

    done = _partition(postgres_url)

    assert done.returncode == 0, done.stderr
    assert _rows(postgres_url) == before
    with get_engine(postgres_url).connect() as conn:
        assert all(is_partitioned(conn, name) for name in partition.TABLES)
    assert migrate.check(postgres_url).differences == ()
    assert migrate.upgrade(postgres_url) == (migrate.head(), migrate.head())
    # The layout serves as before: loads, a save with a new fact (the id sequence carried over).
    storage = SqlMemoryStorage(postgres_url)
    assert len(storage.load(user_id="alice")["facts"]) == 4
    doc = storage.load(user_id="alice")
    doc["facts"].append(_fact("fact_alice_new", "alice is partitioned"))
    assert storage.save(doc, user_id="alice")
    with get_engine(postgres_url).connect() as conn:
        newest = conn.execute(text("SELECT max(id) FROM memory_facts")).scalar_one()
    assert newest > max(row[0] for row in before["memory_facts"])


def test_sql_prints_one_transaction_and_changes_nothing(postgres_url: str) -> None:
    printed = _partition(postgres_url, "--sql")
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.startswith("BEGIN;\n") and printed.stdout.endswith("COMMIT;\n")
    assert "PARTITION BY HASH (scope_id)" in printed.stdout
    assert "PARTITION OF memory_history__unpartitioned DEFAULT" in printed.stdout
    with get_engine(postgres_url).connect() as conn:
        assert not is_partitioned(conn, "memory_facts")
    # What it printed is what a DBA runs: psql-free, statement by statement, in one transaction.
    with get_engine(postgres_url).begin() as conn:
        for statement in printed.stdout.removeprefix("BEGIN;\n").removesuffix("COMMIT;\n").split(";\n"):
            if statement.strip():
                conn.exec_driver_sql(statement)
    assert migrate.check(postgres_url).differences == ()


def test_it_refuses_sqlite_a_second_run_and_a_database_behind_head(
    postgres_url: str, pg_url: str, tmp_path: Path
) -> None:
    sqlite = _partition(f"sqlite:///{tmp_path / 'm.db'}")
    assert sqlite.returncode == 1 and "SQLite has no table partitioning" in sqlite.stderr
    empty = _partition(pg_url)
    assert empty.returncode == 1 and "run `memstore db upgrade`" in empty.stderr
    assert _partition(postgres_url).returncode == 0
    again = _partition(postgres_url)
    assert again.returncode == 1 and "already partitioned" in again.stderr


def test_forced_row_level_security_binds_every_parent_and_partition(postgres_partitioned_url: str) -> None:
    url = postgres_partitioned_url
    _fill(url)
    with get_engine(url).connect() as conn:
        flags = conn.execute(
            text(
                "SELECT c.relname, c.relrowsecurity AND c.relforcerowsecurity, c.relispartition, "
                "(SELECT count(*) FROM pg_policy p WHERE p.polrelid = c.oid) FROM pg_class c "
                "WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p') "
                "AND c.relname LIKE 'memory\\_%'"
            )
        ).all()
    assert all(forced for _, forced, _, _ in flags)
    policies = {name: count for name, _, is_partition, count in flags if not is_partition}
    assert policies == {table: len(rls.POLICIES[table]) for table in rls.POLICIES}
    assert all(count == 0 for _, _, is_partition, count in flags if is_partition)
    with app_role_url(url) as app:
        alice = SqlMemoryStorage(app).for_identity()
        assert len(alice.load(user_id="alice")["facts"]) == 4
        engine = create_engine(app)
        try:
            with engine.begin() as conn:  # the policies, through the parent: bob sees only bob's
                conn.execute(text("SELECT set_config('memstore.tenant_id', 'default', true)"))
                conn.execute(text("SELECT set_config('memstore.user_id', 'bob', true)"))
                contents = conn.execute(text("SELECT content FROM memory_facts")).scalars().all()
                assert contents and all(content.startswith("bob ") for content in contents)
            with pytest.raises(Exception, match="permission denied"), engine.begin() as conn:
                conn.execute(text("SELECT count(*) FROM memory_facts_p000"))
        finally:
            engine.dispose()


def test_vacuum_drops_whole_months_and_counts_what_the_plain_layout_deletes(
    postgres_url: str, pg_server_url: str, pg_template: str
) -> None:
    cutoff = Month.of(_NOW).plus(-3).start + timedelta(days=10)  # inside a month: rows are deleted there
    with fresh_database(pg_server_url, template=pg_template) as parted:
        counts = {}
        for url in (postgres_url, parted):
            _fill(url)
        assert _partition(parted).returncode == 0
        for url in (postgres_url, parted):
            counts[url] = vacuum(get_engine(url), cutoff)
        assert counts[postgres_url] == counts[parted]
        assert counts[postgres_url]["memory_history"] > 0
        with get_engine(parted).connect() as conn:
            months = history_months.existing_months(conn)
            oldest = conn.execute(text("SELECT min(changed_at) FROM memory_history")).scalar_one()
        dispose_engines()
    assert months[0] == Month.of(cutoff)  # the older months went whole
    assert months[-1] == Month.of(_NOW).plus(history_months.MONTHS_AHEAD)
    assert oldest >= cutoff


def test_a_new_month_takes_over_the_default_partitions_rows(postgres_partitioned_url: str) -> None:
    url = postgres_partitioned_url
    _fill(url)
    later = Month.of(_NOW).plus(history_months.MONTHS_AHEAD + 2)
    future = f"SELECT count(*) FROM {{}} WHERE changed_at >= '{later.start.isoformat()}'"
    with get_engine(url).begin() as conn:  # past the months created ahead: the default takes it
        conn.execute(
            text(
                f"INSERT INTO memory_history ({_HISTORY_COLUMNS}) "
                "SELECT min(id), 9, :at, 'fact', 'future', 'insert', 'test' FROM memory_scopes"
            ),
            {"at": later.start + timedelta(days=3)},
        )
        assert conn.exec_driver_sql(future.format(DEFAULT_PARTITION)).scalar_one() == 1
    with get_engine(url).begin() as conn:
        created = history_months.ensure_months(conn, later.start)
        assert created[0] == later.name  # the months ahead of ``later``'s follow it
        assert conn.exec_driver_sql(future.format(DEFAULT_PARTITION)).scalar_one() == 0
        assert conn.exec_driver_sql(f"SELECT count(*) FROM {later.name}").scalar_one() == 1
        forced = conn.execute(
            text("SELECT relforcerowsecurity FROM pg_class WHERE relname = :name"), {"name": later.name}
        ).scalar_one()
    assert forced


@pytest.fixture
def partitioned_semantic(
    postgres_partitioned_url: str, isolated_config: MemoryConfig, openai_server: OpenAIStubServer
) -> Iterator[SqlMemoryStorage]:
    isolated_config.database_url = postgres_partitioned_url
    isolated_config.embedding_model = MODEL
    isolated_config.embedding_base_url = openai_server.base_url
    isolated_config.embedding_provider = "openai"
    reset_memory_storage()
    yield SqlMemoryStorage(postgres_partitioned_url)
    reset_memory_storage()


def test_vectors_are_stored_and_replaced_on_the_partitioned_layout(
    partitioned_semantic: SqlMemoryStorage, postgres_partitioned_url: str
) -> None:
    storage = partitioned_semantic
    assert storage.save(_doc(_fact("fact_tea", "Alice drinks green tea every morning")), user_id="alice")
    assert embed_facts(storage=storage) == 1  # an insert
    assert embed_facts(storage=storage, rebuild=True) == 1  # the upsert's update of the same key
    alice = FactFilter(user_id="alice")
    page = search_facts("green tea", alice, mode="semantic", limit=1, storage=storage)
    assert [found.fact_id for found in page.facts] == ["fact_tea"]
    with get_engine(postgres_partitioned_url).connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM memory_fact_embeddings")).scalar_one() == 1


def test_the_scale_bench_runs_both_layouts_and_drops_its_databases(
    pg_server_url: str, tmp_path: Path
) -> None:
    """``bench.py --only scale --smoke``: the harness only (20,000 facts); timings are not asserted."""
    env = {**os.environ, "MEMSTORE_BENCH_PG_URL": pg_server_url}
    bench = Path(__file__).resolve().parents[2] / "scripts" / "bench.py"
    argv = [sys.executable, str(bench), "--only", "scale", "--smoke", "--out", str(tmp_path)]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    for operation in (
        "load",
        "save",
        "search_user",
        "search_all_users",
        "erase_user",
        "vacuum_by_month",
        "reclaim_history",
    ):
        assert f"| {operation} |" in done.stdout
    used = re.search(r"scale: databases (\S+), (\S+) ", done.stdout)
    assert used is not None
    assert _bench_databases(pg_server_url).isdisjoint(used.groups())  # its own two are gone


def _bench_databases(server_url: str) -> set[str]:
    admin = create_engine(server_url)
    try:
        with admin.connect() as conn:
            query = "SELECT datname FROM pg_database WHERE datname LIKE 'memstore_bench_scale%'"
            names = conn.execute(text(query))
            return set(names.scalars())
    finally:
        admin.dispose()
