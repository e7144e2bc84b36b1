"""``memstore db partition``: move a PostgreSQL database at head to the partitioned layout.

The per-user tables are hash-partitioned on the key every per-user statement filters on:
``memory_facts`` and ``memory_fact_embeddings`` on ``scope_id``, ``memory_sessions`` and
``memory_session_turns`` on ``user_id``. ``memory_history`` is range-partitioned on ``changed_at``
by month, with a DEFAULT partition (``history_months.py``), so retention drops whole months.

Everything else stays as it was, read from the catalog so nothing is forgotten: columns,
defaults, NOT NULL and CHECK constraints (``LIKE ... INCLUDING``), every index (by
``pg_get_indexdef``), the foreign keys in and out, the id sequences (re-owned), the owner, the
grants (table and column), and row-level security (``rls.py``'s policies, ``FORCE``d, on each
parent; every partition also has row-level security forced with no policy, so reading a partition
directly returns nothing to a role the policies bind). PostgreSQL asks a primary key or unique
index of a partitioned table to contain the partition key, which changes three keys:

- ``memory_facts``: primary key ``(id, scope_id)`` (``uq_memory_facts_id_scope_id`` was already
  unique); ``memory_history``: ``(id, changed_at)``; ``memory_fact_embeddings``:
  ``(fact_row_id, scope_id)``. The ids still come from one sequence each, but nothing stops an explicit id
  repeating in another scope: ``rls.py``'s policies match a fact by ``(id, scope_id)``;
- ``fk_memory_fact_embeddings_fact_row_id_memory_facts`` references ``memory_facts (id, scope_id)``
  from ``(fact_row_id, scope_id)`` (a vector's fact is in its scope already: the policies check it).

The whole move runs in one transaction under the migration lock: it commits complete or not at
all. Its first statements lock every table it reads or rewrites (``LOCKED``) in ``EXCLUSIVE``
mode, with a ``lock_timeout``: a save waits for the move and then writes into the new
tables, never into an old one after its rows were copied; reads go on until the old tables are
dropped. It rewrites the tables (``INSERT ... SELECT``), so writes wait for as long as that takes.
``render`` prints the same SQL for a DBA to read or run (``--sql``), behind the migration lock and
a check that the database is still at the revision it was read at. Policies memstore did not create
on these tables, or a publication of them, are refused: the move would not carry them. Identifiers
read from the catalog are quoted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, Engine, text

from memstore.errors import ConfigError
from memstore.storage.sql.maintenance import history_months
from memstore.storage.sql.maintenance.history_months import DEFAULT_PARTITION, HISTORY, HISTORY_KEY, Month
from memstore.storage.sql.schema import migrate, rls
from memstore.storage.sql.schema.partition_layout import is_partitioned

HASHED: dict[str, str] = {
    "memory_facts": "scope_id",
    "memory_fact_embeddings": "scope_id",
    "memory_sessions": "user_id",
    "memory_session_turns": "user_id",
}
"""The hash-partitioned tables and their partition key."""
TABLES = (*HASHED, HISTORY)
LOCKED = (
    "memory_scopes",
    "memory_facts",
    "memory_fact_embeddings",
    "memory_fact_tags",
    "memory_fact_grants",
    "memory_fact_relations",
    HISTORY,
    "memory_sessions",
    "memory_session_turns",
)
"""Every table the move reads or rewrites (its foreign keys are dropped and re-added): locked
``EXCLUSIVE`` before any copy, so a save waits for the move instead of writing rows the copy has
already passed, while plain reads go on until the old tables are dropped. Not ``SHARE ROW
EXCLUSIVE``: that lets a save's first statement, ``SELECT ... FOR UPDATE`` of its scope row, through,
and the save's next write then deadlocks with the move's ``DROP CONSTRAINT`` (which needs the
scopes table ``ACCESS EXCLUSIVE``): ``EXCLUSIVE`` stops a save before it holds anything."""
LOCK_TIMEOUT = "60s"
"""How long the move waits for one lock (a long save or read in the way) before it gives up whole."""
DEFAULT_PARTITIONS = 16
MAX_PARTITIONS = 256
MAX_MONTHS_BACK = 120
"""Months of existing history given a partition of their own; older rows go to the DEFAULT one."""
_SUFFIX = "__unpartitioned"
_POLICIES_READING = tuple(
    table
    for table, policies in rls.POLICIES.items()
    if any(
        re.search(rf"\b{name}\b", clause or "")
        for _, _, *clauses in policies
        for clause in clauses
        for name in TABLES
    )
)
# Grants are read by memory_facts' policies: recreated with them, so the pair stays scope-aware.
_POLICIES_RECREATED = tuple(
    table for table in rls.POLICIES if table in _POLICIES_READING or table == "memory_fact_grants"
)
_quote = history_months.quote
_FOREIGN_KEY = re.compile(r"FOREIGN KEY \(([^)]*)\) REFERENCES (\w+)\(([^)]*)\)(.*)", re.DOTALL)


@dataclass(frozen=True)
class _Table:
    name: str
    key: str
    owner: str
    indexes: tuple[tuple[str, str], ...]  # (name, definition) of plain indexes
    keys: tuple[tuple[str, str, str], ...]  # (name, kind p/u, columns) of key constraints
    sequences: tuple[tuple[str, str], ...]  # (sequence, column)
    grants: tuple[str, ...]


def _partition_key(table: str) -> str:
    return HISTORY_KEY if table == HISTORY else HASHED[table]


def check_partitions(partitions: int) -> int:
    if not 2 <= partitions <= MAX_PARTITIONS:
        raise ConfigError(f"--partitions {partitions}: use 2 to {MAX_PARTITIONS}")
    return partitions


def check_months_ahead(months: int) -> int:
    if not 0 <= months <= history_months.MAX_MONTHS_AHEAD:
        raise ConfigError(f"--months-ahead {months}: use 0 to {history_months.MAX_MONTHS_AHEAD}")
    return months


def statements(
    conn: Connection,
    *,
    partitions: int = DEFAULT_PARTITIONS,
    months_ahead: int = history_months.MONTHS_AHEAD,
    now: datetime | None = None,
) -> list[str]:
    """The SQL that partitions the database behind ``conn``, in order; refuses what it cannot do."""
    check_partitions(partitions)
    check_months_ahead(months_ahead)
    _refuse(conn)
    tables = [_read(conn, name) for name in TABLES]
    months = _history_months(conn, Month.of(now or datetime.now(UTC)), months_ahead)
    inbound = _foreign_keys_into(conn)
    plan = lock_statements()
    for table in tables:
        plan.extend(_create(table, partitions, months))
    plan.extend(f"ALTER TABLE {child} DROP CONSTRAINT {_quote(name)}" for child, name, _ in inbound)
    # A policy that reads a partitioned table (a tag or a vector is read where its fact is) would
    # keep the old table alive: dropped here, created again with the rest (grants' too, so every
    # policy matching a fact by id also matches its scope: ids repeat across scopes from now on).
    plan.extend(rls.drop_statements(_POLICIES_RECREATED))
    for table in tables:
        new = f"{table.name}{_SUFFIX}"
        plan.extend(
            f"ALTER SEQUENCE {_quote(seq)} OWNED BY {new}.{_quote(column)}" for seq, column in table.sequences
        )
        plan.append(f"DROP TABLE {table.name}")
        plan.append(f"ALTER TABLE {table.name}{_SUFFIX} RENAME TO {table.name}")
    for table in tables:
        plan.extend(_keys_and_indexes(table))
    plan.extend(_foreign_key(child, name, definition) for child, name, definition in inbound)
    plan.extend(rls.create_statements((*TABLES, *_POLICIES_RECREATED)))  # each table once, in POLICIES' order
    for table in tables:
        plan.extend(table.grants)
        plan.append(f"ANALYZE {table.name}")
    return plan


def render(
    conn: Connection,
    *,
    partitions: int = DEFAULT_PARTITIONS,
    months_ahead: int = history_months.MONTHS_AHEAD,
) -> str:
    """``statements`` as one script a DBA can read, or run with ``psql -f``."""
    guard = [
        # The migration lock, then the revision the plan was read at: nothing migrated meanwhile.
        f"SELECT pg_advisory_xact_lock({migrate.PG_MIGRATION_LOCK_KEY})",
        "DO $$ BEGIN IF (SELECT string_agg(version_num, ',') FROM alembic_version) "
        f"IS DISTINCT FROM '{migrate.head()}' THEN RAISE EXCEPTION "
        f"'memstore db partition: the database is no longer at revision {migrate.head()}'; "
        "END IF; END $$",
    ]
    body = ";\n".join([*guard, *statements(conn, partitions=partitions, months_ahead=months_ahead)])
    return f"BEGIN;\n{body};\nCOMMIT;\n"


def lock_statements() -> list[str]:
    """The plan's first statements: a lock timeout, and every table the move touches locked so
    that writers wait for the move (and see its tables) while readers go on."""
    return [
        f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'",
        f"LOCK TABLE {', '.join(LOCKED)} IN EXCLUSIVE MODE",
    ]


def partition(
    engine: Engine,
    *,
    partitions: int = DEFAULT_PARTITIONS,
    months_ahead: int = history_months.MONTHS_AHEAD,
) -> list[str]:
    """Partition the database in one transaction, under the migration lock; returns the statements."""
    if engine.dialect.name != "postgresql":
        raise ConfigError("partitioned tables are PostgreSQL's: SQLite has no table partitioning")
    with migrate.migration_connection(engine) as conn:
        run = statements(conn, partitions=partitions, months_ahead=months_ahead)
        for statement in run:
            conn.exec_driver_sql(statement)
    return run


def _refuse(conn: Connection) -> None:
    if conn.dialect.name != "postgresql":
        raise ConfigError("partitioned tables are PostgreSQL's: SQLite has no table partitioning")
    found, target = MigrationContext.configure(conn).get_current_revision(), migrate.head()
    if found != target:
        raise ConfigError(
            f"the database is at revision {found or '<base>'}, head is {target}: "
            "run `memstore db upgrade` before partitioning"
        )
    done = [name for name in TABLES if is_partitioned(conn, name)]
    if done:
        raise ConfigError(f"already partitioned: {', '.join(done)}")
    triggers = (
        conn.execute(
            text(
                "SELECT DISTINCT c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
                "WHERE NOT t.tgisinternal AND c.relname = ANY(:tables) "
                "AND c.relnamespace = current_schema()::regnamespace"
            ),
            {"tables": list(TABLES)},
        )
        .scalars()
        .all()
    )
    if triggers:
        raise ConfigError(f"{', '.join(triggers)} carry triggers memstore did not create: partition by hand")
    recreated = sorted({*TABLES, *_POLICIES_RECREATED})
    policies = conn.execute(
        text(
            "SELECT c.relname, p.polname FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid "
            "WHERE c.relname = ANY(:tables) AND c.relnamespace = current_schema()::regnamespace "
            "ORDER BY 1, 2"
        ),
        {"tables": recreated},
    ).all()
    known = {(table, name) for table, rows in rls.POLICIES.items() for name, *_ in rows}
    foreign = [f"{table}.{name}" for table, name in policies if (table, name) not in known]
    if foreign:
        raise ConfigError(f"policies memstore did not create ({', '.join(foreign)}): partition by hand")
    published = (
        conn.execute(
            text(
                "SELECT DISTINCT c.relname FROM pg_publication_rel r JOIN pg_class c ON c.oid = r.prrelid "
                "WHERE c.relname = ANY(:tables) AND c.relnamespace = current_schema()::regnamespace "
                "ORDER BY 1"
            ),
            {"tables": list(TABLES)},
        )
        .scalars()
        .all()
    )
    if published:
        raise ConfigError(f"{', '.join(published)} are in a publication: partition by hand")


def _read(conn: Connection, name: str) -> _Table:
    """What the catalog says about one table, all of which the partitioned table must keep."""
    params = {"table": name}
    owner = conn.execute(
        text("SELECT pg_get_userbyid(relowner) FROM pg_class WHERE oid = to_regclass(:table)"), params
    ).scalar_one()
    keys = conn.execute(
        text(
            "SELECT c.conname, c.contype, pg_get_constraintdef(c.oid) FROM pg_constraint c "
            "WHERE c.conrelid = to_regclass(:table) AND c.contype IN ('p', 'u') ORDER BY c.conname"
        ),
        params,
    ).all()
    indexes = conn.execute(
        text(
            "SELECT i.relname, pg_get_indexdef(x.indexrelid) FROM pg_index x "
            "JOIN pg_class i ON i.oid = x.indexrelid WHERE x.indrelid = to_regclass(:table) "
            "AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = x.indexrelid "
            "AND c.conrelid = x.indrelid AND c.contype IN ('p', 'u')) ORDER BY i.relname"
        ),
        params,
    ).all()
    sequences = conn.execute(
        text(
            "SELECT s.relname, a.attname FROM pg_depend d JOIN pg_class s ON s.oid = d.objid "
            "JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid "
            "WHERE d.refobjid = to_regclass(:table) AND s.relkind = 'S' AND d.deptype = 'a'"
        ),
        params,
    ).all()
    return _Table(
        name=name,
        key=_partition_key(name),
        owner=str(owner),
        indexes=tuple((str(n), str(d)) for n, d in indexes),
        keys=tuple((str(n), str(k), _columns_of(str(d))) for n, k, d in keys),
        sequences=tuple((str(s), str(c)) for s, c in sequences),
        grants=tuple(_grants(conn, name, str(owner))),
    )


def _columns_of(definition: str) -> str:
    """``a, b`` of ``PRIMARY KEY (a, b)`` / ``UNIQUE (a, b)``."""
    return definition[definition.index("(") + 1 : definition.rindex(")")]


def _grants(conn: Connection, table: str, owner: str) -> list[str]:
    """The table's and its columns' grants to others than the owner, as GRANT statements."""
    acl = (
        "SELECT CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(g.grantee)) END, "
        "g.privilege_type, g.is_grantable{col} FROM {source}, aclexplode({column}) g "
        "WHERE {where} AND pg_get_userbyid(g.grantee) IS DISTINCT FROM :owner ORDER BY 1, 2"
    )
    table_rows = conn.execute(
        text(acl.format(col="", source="pg_class c", column="c.relacl", where="c.oid = to_regclass(:table)")),
        {"table": table, "owner": owner},
    ).all()
    column_rows = conn.execute(
        text(
            acl.format(
                col=", a.attname",
                source="pg_attribute a",
                column="a.attacl",
                where="a.attrelid = to_regclass(:table) AND a.attnum > 0 AND NOT a.attisdropped",
            )
        ),
        {"table": table, "owner": owner},
    ).all()
    grants = [
        f"GRANT {privilege} ON TABLE {table} TO {grantee}{' WITH GRANT OPTION' if grantable else ''}"
        for grantee, privilege, grantable in table_rows
    ]
    by_grant: dict[tuple[str, str, bool], list[str]] = {}
    for grantee, privilege, grantable, column in column_rows:
        by_grant.setdefault((str(grantee), str(privilege), bool(grantable)), []).append(_quote(str(column)))
    grants.extend(
        f"GRANT {privilege} ({', '.join(columns)}) ON TABLE {table} TO {grantee}"
        f"{' WITH GRANT OPTION' if grantable else ''}"
        for (grantee, privilege, grantable), columns in by_grant.items()
    )
    return grants


def _history_months(conn: Connection, current: Month, ahead: int) -> list[Month]:
    oldest = conn.exec_driver_sql(f"SELECT min({HISTORY_KEY}) FROM {HISTORY}").scalar_one()
    first = max(Month.of(oldest) if oldest is not None else current, current.plus(-MAX_MONTHS_BACK))
    first = min(first, current)
    count = (current.year - first.year) * 12 + current.month - first.month + ahead + 1
    return [first.plus(offset) for offset in range(count)]


def _create(table: _Table, partitions: int, months: list[Month]) -> list[str]:
    """The new parent under a temporary name, its partitions, and the rows copied in."""
    new = f"{table.name}{_SUFFIX}"
    how = f"RANGE ({table.key})" if table.name == HISTORY else f"HASH ({table.key})"
    plan = [
        f"CREATE TABLE {new} (LIKE {table.name} INCLUDING DEFAULTS INCLUDING CONSTRAINTS "
        f"INCLUDING STORAGE INCLUDING COMPRESSION) PARTITION BY {how}"
    ]
    if table.name == HISTORY:
        children = [(month.name, f"FOR VALUES {month.bounds()}") for month in months]
        children.append((DEFAULT_PARTITION, "DEFAULT"))
    else:
        children = [
            (f"{table.name}_p{index:03d}", f"FOR VALUES WITH (MODULUS {partitions}, REMAINDER {index})")
            for index in range(partitions)
        ]
    for child, bound in children:
        plan.append(f"CREATE TABLE {child} PARTITION OF {new} {bound}")
        plan.extend(history_months.secure_statements(child, table.owner))
    plan.append(f"ALTER TABLE {new} OWNER TO {_quote(table.owner)}")
    plan.append(f"INSERT INTO {new} SELECT * FROM {table.name}")
    return plan


def _keys_and_indexes(table: _Table) -> list[str]:
    """Primary and unique keys (the partition key added where missing), then the other indexes."""
    plan = []
    for name, kind, columns in table.keys:
        names = [column.strip() for column in columns.split(",")]
        if table.key not in names:
            names.append(table.key)
        what = "PRIMARY KEY" if kind == "p" else "UNIQUE"
        plan.append(f"ALTER TABLE {table.name} ADD CONSTRAINT {_quote(name)} {what} ({', '.join(names)})")
    # pg_get_indexdef names the table schema-qualified; a partitioned parent takes the same index.
    plan.extend(definition for _, definition in table.indexes)
    return plan


def _foreign_keys_into(conn: Connection) -> list[tuple[str, str, str]]:
    """Every foreign key from or to a table being partitioned: (table, name, definition)."""
    rows = conn.execute(
        text(
            "SELECT c.conrelid::regclass::text, c.conname, pg_get_constraintdef(c.oid) FROM pg_constraint c "
            "WHERE c.contype = 'f' AND (c.conrelid = ANY(:oids) OR c.confrelid = ANY(:oids)) "
            "ORDER BY 1, 2"
        ),
        {"oids": _oids(conn)},
    ).all()
    return [(str(child), str(name), str(definition)) for child, name, definition in rows]


def _oids(conn: Connection) -> list[int]:
    return [
        int(conn.execute(text("SELECT to_regclass(:table)::oid"), {"table": name}).scalar_one())
        for name in TABLES
    ]


def _foreign_key(child: str, name: str, definition: str) -> str:
    """Re-add a foreign key; one that references a key the partition key was added to references
    the widened key, from the same column of its own table (``scope_id`` for a fact's vector)."""
    match = _FOREIGN_KEY.fullmatch(definition)
    if match is not None and match.group(2) in HASHED:
        key = HASHED[match.group(2)]
        source = [column.strip() for column in match.group(1).split(",")]
        target = [column.strip() for column in match.group(3).split(",")]
        if key not in target:
            source.append(key)
            target.append(key)
            definition = (
                f"FOREIGN KEY ({', '.join(source)}) REFERENCES {match.group(2)}({', '.join(target)})"
                f"{match.group(4)}"
            )
    return f"ALTER TABLE {child} ADD CONSTRAINT {_quote(name)} {definition}"
