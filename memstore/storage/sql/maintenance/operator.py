"""The connection for work that crosses tenants: erase, vacuum, backup and restore.

On PostgreSQL with row-level security, the application's role sees only the identity it set,
so these run on ``operator_database_url`` (a superuser or ``BYPASSRLS`` role) whenever it names
the same database as the engine they were handed; and they refuse, naming the setting, an
engine whose role the policies bind rather than silently erase, purge or back up nothing.
"""

from __future__ import annotations

from sqlalchemy import Engine
from sqlalchemy.engine import URL

from memstore.config import get_memory_config
from memstore.errors import ConfigError
from memstore.storage.sql.engine import engine_for, get_engine, mask_url, normalize_url
from memstore.storage.sql.identity import policies_apply


def operator_engine(engine: Engine, work: str) -> Engine:
    """``engine``, or the operator's engine on its database; ``work`` names the job in the refusal."""
    configured = get_memory_config().operator_database_url
    if (
        configured
        and engine.dialect.name == "postgresql"
        and _same_database(normalize_url(configured), engine.url)
    ):
        engine = get_engine(configured)
    engine = engine_for(engine)
    if policies_apply(engine):
        raise ConfigError(
            f"{work} crosses tenants, and the role of {mask_url(engine.url)} is bound by row-level "
            "security: set operator_database_url (MEMSTORE_OPERATOR_DATABASE_URL) to a superuser or "
            "BYPASSRLS role on the same database"
        )
    return engine


def _same_database(operator: URL, app: URL) -> bool:
    return (operator.host, operator.port or 5432, operator.database) == (
        app.host,
        app.port or 5432,
        app.database,
    )
