"""DDL for the full-text index on ``memory_facts.content``, owned by Alembic revision 0002.

It lives outside ``models.py`` because neither structure is a plain table or index that
SQLAlchemy metadata can describe: SQLite gets an external-content FTS5 table kept in sync by
triggers, PostgreSQL a GIN expression index. Both are maintained by the database inside the
transaction that writes the fact, so a save and its index entries commit (or roll back)
together. ``alembic check`` skips these names (see ``is_fts_object``).
"""

from __future__ import annotations

FTS_TABLE = "memory_facts_fts"
PG_FTS_INDEX = "ix_memory_facts_content_fts"
# 'simple' (no stemming, no stop words) matches SQLite's unicode61 tokenizer, so a query finds
# the same facts on both backends.
PG_TS_CONFIG = "simple"

SQLITE_CREATE = (
    f"CREATE VIRTUAL TABLE {FTS_TABLE} USING fts5("
    "content, content='memory_facts', content_rowid='id', tokenize='unicode61 remove_diacritics 2')",
    f"CREATE TRIGGER {FTS_TABLE}_ai AFTER INSERT ON memory_facts BEGIN "
    f"INSERT INTO {FTS_TABLE}(rowid, content) VALUES (new.id, new.content); END",
    f"CREATE TRIGGER {FTS_TABLE}_ad AFTER DELETE ON memory_facts BEGIN "
    f"INSERT INTO {FTS_TABLE}({FTS_TABLE}, rowid, content) VALUES ('delete', old.id, old.content); END",
    f"CREATE TRIGGER {FTS_TABLE}_au AFTER UPDATE OF content ON memory_facts BEGIN "
    f"INSERT INTO {FTS_TABLE}({FTS_TABLE}, rowid, content) VALUES ('delete', old.id, old.content); "
    f"INSERT INTO {FTS_TABLE}(rowid, content) VALUES (new.id, new.content); END",
    f"INSERT INTO {FTS_TABLE}({FTS_TABLE}) VALUES ('rebuild')",
)
SQLITE_DROP = (
    f"DROP TRIGGER {FTS_TABLE}_au",
    f"DROP TRIGGER {FTS_TABLE}_ad",
    f"DROP TRIGGER {FTS_TABLE}_ai",
    f"DROP TABLE {FTS_TABLE}",
)
POSTGRESQL_CREATE = (
    f"CREATE INDEX {PG_FTS_INDEX} ON memory_facts "
    f"USING gin (to_tsvector('{PG_TS_CONFIG}'::regconfig, content))",
)
POSTGRESQL_DROP = (f"DROP INDEX {PG_FTS_INDEX}",)


def is_fts_object(name: str | None) -> bool:
    """The FTS5 table, its shadow tables (``memory_facts_fts_data`` ...) and the GIN index."""
    return name is not None and (name == PG_FTS_INDEX or name.startswith(FTS_TABLE))
