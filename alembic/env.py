"""Alembic environment for memstore, online and offline (``--sql``), SQLite and PostgreSQL.

The database comes from, first match wins: the connection or URL handed over by
``memstore.storage.sql.schema.migrate``; ``alembic -x url=...``; ``sqlalchemy.url`` in alembic.ini;
memstore's own configuration (``MEMSTORE_DATABASE_URL``, the YAML file, else the embedded SQLite
file). Online runs started by the ``alembic`` command take the same migration lock as memstore.

From an installed wheel, an ini of two lines is enough (docs/operations.md):
``[alembic]`` and ``script_location = memstore:_alembic``; its logging sections are optional.
"""

from __future__ import annotations

import logging
import warnings
from logging.config import fileConfig
from typing import Any

from alembic import context
from sqlalchemy import Connection
from sqlalchemy.engine import URL

from memstore.config import get_memory_config
from memstore.storage.sql.engine import database_url_from_config, get_engine, normalize_url
from memstore.storage.sql.schema.autogen import SKIPPED_EXPRESSION_INDEX_WARNINGS, include_object, render_item
from memstore.storage.sql.schema.migrate import migration_connection
from memstore.storage.sql.schema.models import Base

LOGGING_SECTIONS = ("loggers", "handlers", "formatters")

config = context.config
if config.config_file_name is not None:
    # The `alembic` command. An ini with the logging sections (the checkout's) configures logging;
    # a minimal one (two lines, beside an installed wheel) gets Alembic's progress on stderr.
    if all(config.file_config.has_section(section) for section in LOGGING_SECTIONS):
        fileConfig(config.config_file_name, disable_existing_loggers=False)
    else:
        logging.basicConfig(level=logging.WARNING, format="%(levelname)-5.5s [%(name)s] %(message)s")
        logging.getLogger("alembic").setLevel(logging.INFO)


def database_url() -> URL:
    handed = config.attributes.get("url")
    if handed is not None:
        return normalize_url(handed)
    given = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
    return normalize_url(given or database_url_from_config(get_memory_config()))


def run_migrations(dialect: str, **options: Any) -> None:
    context.configure(
        target_metadata=Base.metadata,
        compare_type=True,
        render_item=render_item,
        include_object=include_object,
        # Autogenerate wraps ALTERs in batch operations that SQLite can run (table recreate).
        render_as_batch=dialect == "sqlite",
        # Offline SQLite scripts get BEGIN/COMMIT too, so a failed script leaves nothing half-applied.
        transactional_ddl=True,
        **options,
    )
    with warnings.catch_warnings(), context.begin_transaction():
        for message in SKIPPED_EXPRESSION_INDEX_WARNINGS:
            warnings.filterwarnings("ignore", message=message)
        context.run_migrations()


def run_online(connection: Connection) -> None:
    run_migrations(connection.dialect.name, connection=connection)


if context.is_offline_mode():
    url = database_url()
    run_migrations(url.get_backend_name(), url=url, literal_binds=True, dialect_opts={"paramstyle": "named"})
elif (handed_connection := config.attributes.get("connection")) is not None:
    run_online(handed_connection)
else:
    with migration_connection(get_engine(database_url())) as locked:
        run_online(locked)
