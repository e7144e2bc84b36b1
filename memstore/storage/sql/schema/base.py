"""The declarative base, the column types every table shares, and the constraint naming rule."""

from __future__ import annotations

from sqlalchemy import JSON, BigInteger, DateTime, Integer, LargeBinary, MetaData, String, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# BIGINT on PostgreSQL; INTEGER on SQLite so the column is the rowid alias and autoincrements.
Id = BigInteger().with_variant(Integer(), "sqlite")
Json = JSON().with_variant(postgresql.JSONB(), "postgresql")
# Python None as SQL NULL (not JSON ``null``), for a column where NULL means "not set"; JSON on
# PostgreSQL too, which keeps the text as given (JSONB rewrites numbers: 1e16, -0.0).
NullableJson = JSON(none_as_null=True)
Timestamp = DateTime(timezone=True)
# float32 little-endian bytes on SQLite (what sqlite-vec reads); ``real[]`` on PostgreSQL, which
# pgvector casts to ``vector`` when the extension is installed.
Vector = LargeBinary().with_variant(postgresql.ARRAY(postgresql.REAL()), "postgresql")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


TenantId = String(128)


def tenant_column() -> Mapped[str]:
    return mapped_column(TenantId, nullable=False, server_default=text("'default'"))
