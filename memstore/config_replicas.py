"""The read-replica setting, a part of ``MemoryConfig`` kept in its own module.

``database_read_url`` names a PostgreSQL streaming replica of ``database_url``; the SQL provider
serves its cold loads, searches and queries from it (``storage/sql/replica.py``), while writes and
the revision checks that guard them stay on ``database_url``.
"""

from __future__ import annotations

from pydantic import BaseModel, Field, model_validator
from sqlalchemy.engine import make_url

MAX_URL_CHARS = 4096


class ReplicaSettings(BaseModel):
    database_read_url: str | None = Field(default=None, max_length=MAX_URL_CHARS)
    """A PostgreSQL hot standby of ``database_url`` (``postgresql://…``); unset: every read goes
    to ``database_url``."""

    @model_validator(mode="after")
    def _replica_is_postgresql(self) -> ReplicaSettings:
        if self.database_read_url is None:
            return self
        if _backend(self.database_read_url) != "postgresql":
            raise ValueError("database_read_url must be a postgresql:// URL (a streaming replica)")
        primary = getattr(self, "database_url", None)  # MemoryConfig's
        if not isinstance(primary, str) or _backend(primary) != "postgresql":
            raise ValueError(
                "database_read_url needs database_url to be the PostgreSQL primary it replicates "
                "(the embedded SQLite database has no replicas)"
            )
        return self


def _backend(url: str) -> str | None:
    try:
        return make_url(url).get_backend_name()
    except Exception:
        return None
