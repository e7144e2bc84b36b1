"""Questions across users and scopes, and the operator's maintenance calls, from Python.

On the SQL provider each call is a few indexed statements (no document is loaded); on the
file provider it scans the tree. ``storage`` defaults to the configured provider.

    from memstore.ops.queries import FactFilter, list_facts, search_facts
    page = list_facts(FactFilter(category="preference", min_confidence=0.8), limit=50)
    hits = search_facts("deer-flow", FactFilter(user_id="alice"))
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from memstore.errors import MemstoreError, QueryError
from memstore.scope import Scope, validate_user_id
from memstore.storage.base import MemoryStorage
from memstore.storage.loader import get_memory_storage
from memstore.storage.operations import StorageOperations
from memstore.storage.records import (
    FACT_ORDERS,
    FactFilter,
    FactOrder,
    FactPage,
    HistoryEntry,
    MemoryStats,
    check_paging,
)


def operations_of(storage: MemoryStorage | None = None) -> StorageOperations:
    """The provider's query surface; a custom provider without one gets a clear error."""
    storage = storage if storage is not None else get_memory_storage()
    if not isinstance(storage, StorageOperations):
        raise MemstoreError(
            f"{type(storage).__name__} does not support queries or maintenance; "
            "use SqlMemoryStorage or FileMemoryStorage"
        )
    return storage


def list_facts(
    where: FactFilter | None = None,
    *,
    limit: int = 50,
    offset: int = 0,
    order: FactOrder = "newest",
    storage: MemoryStorage | None = None,
) -> FactPage:
    """Live facts, one page plus the total, each with its retention ``score``.

    ``order``: ``newest`` (ties broken by insertion order), ``score`` (highest first; reads every
    matching fact, so narrow the filter at scale), ``last_accessed`` or ``access_count``.
    """
    check_paging(limit, offset)
    if order not in FACT_ORDERS:
        raise QueryError(f"unknown order {order!r}; use one of {', '.join(FACT_ORDERS)}")
    return operations_of(storage).query_facts(
        where or FactFilter(), search=None, limit=limit, offset=offset, order=order
    )


def search_facts(
    query: str,
    where: FactFilter | None = None,
    *,
    limit: int = 20,
    offset: int = 0,
    storage: MemoryStorage | None = None,
) -> FactPage:
    """Facts matching every word of ``query``, most relevant first, then by confidence.

    The text is never parsed as query syntax. The page's ``search_mode`` says whether the
    full-text index served it or substring matching did (CJK text, index unavailable). This is
    an operator's search across scopes, so it counts as no access of the facts it finds (a
    user's own search, ``ops.facts.search_memory_facts``, does).
    """
    if not isinstance(query, str) or not query.strip():
        raise QueryError("the search query is empty")
    check_paging(limit, offset)
    return operations_of(storage).query_facts(
        where or FactFilter(), search=query.strip(), limit=limit, offset=offset
    )


def count_facts(where: FactFilter | None = None, *, storage: MemoryStorage | None = None) -> int:
    return list_facts(where, limit=1, storage=storage).total


def memory_stats(*, storage: MemoryStorage | None = None) -> MemoryStats:
    return operations_of(storage).stats()


def list_scopes(user_id: str | None = None, *, storage: MemoryStorage | None = None) -> list[Scope]:
    return operations_of(storage).list_scopes(validate_user_id(user_id))


def memory_history(
    where: FactFilter, *, fact_id: str | None = None, limit: int = 100, storage: MemoryStorage | None = None
) -> list[HistoryEntry]:
    """The audit trail of the scopes ``where`` selects (its fact filters are ignored), oldest first."""
    check_paging(limit, 0)
    return operations_of(storage).history(where, fact_id=fact_id, limit=limit)


def erase_user(user_id: str, *, storage: MemoryStorage | None = None) -> dict[str, int]:
    """Delete everything stored for ``user_id``, audit history included; returns the counts removed."""
    if validate_user_id(user_id) is None:
        raise QueryError("erase needs a user id")
    return operations_of(storage).erase_user(user_id)


def vacuum(older_than: timedelta, *, storage: MemoryStorage | None = None) -> dict[str, int]:
    """Purge audit history and tombstones older than ``older_than``; returns the counts purged."""
    if older_than < timedelta(0):
        raise QueryError("older_than must not be negative")
    return operations_of(storage).vacuum(datetime.now(UTC) - older_than)
