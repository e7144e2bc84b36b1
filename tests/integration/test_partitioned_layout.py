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
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

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


def test_a_save_during_the_move_waits_for_it_and_lands_in_the_new_tables(postgres_url: str) -> None:
    """C1: the move locks every table it copies before the first copy; a writer waits, then writes
    into the partitioned tables (before the fix, a save between a copy and its DROP vanished)."""
    storage = SqlMemoryStorage(postgres_url)
    assert storage.save(_doc(_fact("fact_alice", "alice before the move")), user_id="alice")
    outcome: dict[str, Any] = {}

    def save_bob() -> None:
        try:
            outcome["saved"] = SqlMemoryStorage(postgres_url).save(
                _doc(_fact("fact_bob", "bob during the move", tags=["b"])), user_id="bob"
            )
        except Exception as exc:  # reported below
            outcome["error"] = exc

    with migrate.migration_connection(get_engine(postgres_url)) as conn:
        plan = partition.statements(conn, partitions=4)
        assert plan[:2] == partition.lock_statements()
        assert all(name in plan[1] for name in partition.LOCKED)
        copy = plan.index("INSERT INTO memory_facts__unpartitioned SELECT * FROM memory_facts")
        for statement in plan[: copy + 1]:
            conn.exec_driver_sql(statement)
        other = create_engine(postgres_url)
        try:  # a writer cannot get in meanwhile: here it gives up after its own lock timeout
            for table, values in (
                ("memory_scopes (tenant_id, user_id, agent_name)", "('default', 'dave', '')"),
                (f"memory_history ({_HISTORY_COLUMNS})", "(1, 9, now(), 'fact', 'x', 'insert', 't')"),
            ):
                with pytest.raises(OperationalError, match="lock timeout"), other.begin() as probe:
                    probe.exec_driver_sql("SET LOCAL lock_timeout = '200ms'")
                    probe.exec_driver_sql(f"INSERT INTO {table} VALUES {values}")
            with other.begin() as probe:  # readers go on
                assert probe.exec_driver_sql("SELECT count(*) FROM memory_facts").scalar_one() == 1
        finally:
            other.dispose()
        thread = threading.Thread(target=save_bob)
        thread.start()
        thread.join(1.0)
        assert thread.is_alive()  # the save waits for the move
        for statement in plan[copy + 1 :]:
            conn.exec_driver_sql(statement)
    thread.join(30)
    assert outcome == {"saved": True}
    dispose_engines()
    with get_engine(postgres_url).connect() as conn:
        assert is_partitioned(conn, "memory_facts")
        facts = conn.execute(text("SELECT fact_id FROM memory_facts ORDER BY 1")).scalars().all()
        tags = conn.execute(text("SELECT tag FROM memory_fact_tags")).scalars().all()
    assert facts == ["fact_alice", "fact_bob"] and tags == ["b"]
    assert [f["id"] for f in SqlMemoryStorage(postgres_url).load(user_id="bob")["facts"]] == ["fact_bob"]


def test_the_printed_script_takes_the_migration_lock_and_checks_the_revision(postgres_url: str) -> None:
    printed = _partition(postgres_url, "--sql")
    assert printed.returncode == 0, printed.stderr
    lines = printed.stdout.removeprefix("BEGIN;\n").split(";\n")
    assert lines[0] == f"SELECT pg_advisory_xact_lock({migrate.PG_MIGRATION_LOCK_KEY})"
    assert "alembic_version" in lines[1] and "RAISE EXCEPTION" in lines[1]
    assert lines[2:4] == partition.lock_statements()
    with get_engine(postgres_url).begin() as conn:  # the database moved on: the script refuses
        conn.exec_driver_sql("UPDATE alembic_version SET version_num = 'elsewhere'")
    with pytest.raises(Exception, match="no longer at revision"), get_engine(postgres_url).begin() as conn:
        for statement in printed.stdout.removeprefix("BEGIN;\n").removesuffix("COMMIT;\n").split(";\n"):
            if statement.strip():
                conn.exec_driver_sql(statement)
    with get_engine(postgres_url).connect() as conn:
        assert not is_partitioned(conn, "memory_facts")


def test_it_refuses_policies_and_publications_it_would_not_carry(postgres_url: str) -> None:
    with get_engine(postgres_url).begin() as conn:
        conn.exec_driver_sql("CREATE POLICY site_extra ON memory_facts FOR SELECT USING (true)")
    refused = _partition(postgres_url)
    assert refused.returncode == 1 and "memory_facts.site_extra" in refused.stderr
    with get_engine(postgres_url).begin() as conn:
        conn.exec_driver_sql("DROP POLICY site_extra ON memory_facts")
        conn.exec_driver_sql("CREATE PUBLICATION memstore_test_pub FOR TABLE memory_history")
    try:
        refused = _partition(postgres_url)
        assert refused.returncode == 1 and "publication" in refused.stderr
    finally:
        with get_engine(postgres_url).begin() as conn:
            conn.exec_driver_sql("DROP PUBLICATION memstore_test_pub")
    assert _partition(postgres_url).returncode == 0


def test_a_reused_fact_id_reveals_nothing_of_another_users_fact(postgres_partitioned_url: str) -> None:
    """H1: fact ids repeat across scopes on this layout; the policies match (id, scope)."""
    url = postgres_partitioned_url
    storage = SqlMemoryStorage(url)
    assert storage.save(_doc(_fact("fact_a", "alice secret", tags=["alice-secret"])), user_id="alice")
    assert storage.save(_doc(_fact("fact_m", "mallory", tags=["m"])), user_id="mallory")
    with get_engine(url).begin() as conn:  # alice's fact: shared with bob, tagged, embedded
        alice_id, alice_scope = conn.execute(
            text("SELECT id, scope_id FROM memory_facts WHERE fact_id = 'fact_a'")
        ).one()
        conn.execute(text("UPDATE memory_facts SET visibility = 'shared' WHERE id = :id"), {"id": alice_id})
        conn.execute(
            text(
                "INSERT INTO memory_fact_grants (fact_row_id, scope_id, tenant_id, grantee_kind, grantee) "
                "VALUES (:id, :scope, 'default', 'user', 'bob')"
            ),
            {"id": alice_id, "scope": alice_scope},
        )
        conn.execute(
            text(
                "INSERT INTO memory_fact_embeddings (fact_row_id, scope_id, model, dimension, content_key, "
                "vector, embedded_at) VALUES (:id, :scope, 'm', 2, 'k', '{0.1,0.2}', now())"
            ),
            {"id": alice_id, "scope": alice_scope},
        )
        policies: dict[str, str] = dict(
            conn.execute(
                text(
                    "SELECT c.relname || '.' || p.polname, pg_get_expr(p.polqual, p.polrelid) "
                    "FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid "
                    "WHERE p.polname = 'memstore_read'"
                )
            ).all()
        )
    assert "scope_id" in policies["memory_fact_tags.memstore_read"]
    assert "scope_id" in policies["memory_fact_embeddings.memstore_read"]
    with app_role_url(url) as app:
        engine = create_engine(app)
        try:
            with engine.begin() as conn:
                conn.execute(text("SELECT set_config('memstore.tenant_id', 'default', true)"))
                conn.execute(text("SELECT set_config('memstore.user_id', 'mallory', true)"))
                conn.execute(  # alice's fact id, in mallory's own scope, shared: the layout takes it
                    text(
                        "INSERT INTO memory_facts (id, scope_id, tenant_id, fact_id, position, content, "
                        "content_key, category, confidence, created_at, source, extra, added_revision, "
                        "updated_revision, visibility) SELECT :id, s.id, 'default', 'fact_dup', 9, 'x', 'x', "
                        "'context', 0.5, now(), 't', '{}', 1, 1, 'shared' FROM memory_scopes s "
                        "WHERE s.user_id = 'mallory'"
                    ),
                    {"id": alice_id},
                )
                conn.execute(  # and a grant of "its" id to herself, in her own scope
                    text(
                        "INSERT INTO memory_fact_grants (fact_row_id, scope_id, tenant_id, grantee_kind, "
                        "grantee) SELECT :id, s.id, 'default', 'user', 'mallory' FROM memory_scopes s "
                        "WHERE s.user_id = 'mallory'"
                    ),
                    {"id": alice_id},
                )
                tags = conn.execute(text("SELECT tag FROM memory_fact_tags ORDER BY 1")).scalars().all()
                vectors = conn.execute(text("SELECT count(*) FROM memory_fact_embeddings")).scalar_one()
                contents = conn.execute(text("SELECT content FROM memory_facts ORDER BY 1")).scalars().all()
        finally:
            engine.dispose()
    assert tags == ["m"]
    assert vectors == 0
    assert "alice secret" not in contents


def test_a_new_month_locks_the_default_partition_until_it_is_attached(postgres_partitioned_url: str) -> None:
    """H2: an insert into the default partition between the move of its rows and the ATTACH would
    make the ATTACH fail; the default partition is locked first, so the insert waits instead."""
    url = postgres_partitioned_url
    _fill(url)
    later = Month.of(_NOW).plus(history_months.MONTHS_AHEAD + 2)
    insert = text(
        f"INSERT INTO memory_history ({_HISTORY_COLUMNS}) "
        "SELECT min(id), 9, :at, 'fact', 'future', 'insert', 'test' FROM memory_scopes"
    )
    at = {"at": later.start + timedelta(days=3)}
    with get_engine(url).begin() as conn:
        conn.execute(insert, at)
    plan = history_months.create_month_statements(later, "postgres")
    assert plan[0] == f"LOCK TABLE {DEFAULT_PARTITION} IN SHARE ROW EXCLUSIVE MODE"
    other = create_engine(url)
    try:
        with get_engine(url).begin() as conn:
            for statement in plan[:3]:  # locked, created, the default's rows moved
                conn.exec_driver_sql(statement)
            with pytest.raises(OperationalError, match="lock timeout"), other.begin() as probe:
                probe.exec_driver_sql("SET LOCAL lock_timeout = '200ms'")
                probe.execute(insert, at)
            for statement in plan[3:]:
                conn.exec_driver_sql(statement)
        with other.begin() as probe:  # afterwards the row goes to the new month
            probe.execute(insert, at)
            assert probe.exec_driver_sql(f"SELECT count(*) FROM {later.name}").scalar_one() == 2
    finally:
        other.dispose()


def test_vacuum_drops_months_after_its_purge_and_leaves_a_busy_one_for_later(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """H3, M3, L2: month drops run after the purge commits, each in a short transaction with a lock
    timeout; a month whose lock is not had is left (and not counted) for the next vacuum; a naive
    cut-off is UTC."""
    url = postgres_url
    _fill(url)
    assert _partition(url).returncode == 0  # the old months get partitions of their own
    monkeypatch.setattr(history_months, "LOCK_TIMEOUT", "200ms")
    cutoff = Month.of(_NOW).plus(-3).start + timedelta(days=10)
    older = f"SELECT count(*) FROM memory_history WHERE changed_at < '{cutoff.isoformat()}'"
    with get_engine(url).connect() as conn:
        droppable = history_months.droppable_months(conn, cutoff)
        total = conn.exec_driver_sql(older).scalar_one()
        busy_rows = conn.exec_driver_sql(f"SELECT count(*) FROM {droppable[-1].name}").scalar_one()
    assert len(droppable) >= 2 and busy_rows > 0
    holder = create_engine(url)
    try:
        with holder.connect() as held, held.begin():  # a long reader of one old month
            held.exec_driver_sql(f"SELECT count(*) FROM {droppable[-1].name}")
            first = vacuum(get_engine(url), cutoff.replace(tzinfo=None))
            with get_engine(url).connect() as conn:  # the purge committed while the reader holds on
                months = history_months.existing_months(conn)
                assert conn.exec_driver_sql(older).scalar_one() == busy_rows
    finally:
        holder.dispose()
    assert droppable[-1] in months and droppable[0] not in months
    assert first["memory_history"] == total - busy_rows
    second = vacuum(get_engine(url), cutoff)
    assert second["memory_history"] == busy_rows
    with get_engine(url).connect() as conn:
        assert history_months.droppable_months(conn, cutoff) == []
        assert conn.exec_driver_sql(older).scalar_one() == 0


def test_catalog_identifiers_are_quoted() -> None:
    """L3: an owner (or any name read from the catalog) is quoted where it needs to be."""
    assert history_months.secure_statements("t", 'Odd"Owner')[-1] == 'ALTER TABLE t OWNER TO "Odd""Owner"'
    assert history_months.secure_statements("t", "plain")[-1] == "ALTER TABLE t OWNER TO plain"
