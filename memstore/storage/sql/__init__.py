"""The SQL storage provider for SQLite and PostgreSQL.

Select it with ``storage_class: memstore.storage.sql.SqlMemoryStorage``.
"""

from memstore.storage.sql.documents.provider import SqlMemoryStorage

__all__ = ["SqlMemoryStorage"]
