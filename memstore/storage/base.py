"""The storage contract every provider implements; the pipeline above it depends only on this."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from memstore.document import MemoryDocument, create_empty_memory
from memstore.errors import InvalidScopeError
from memstore.retention import FactSignals
from memstore.scope import DEFAULT_IDENTITY, DEFAULT_TENANT_ID, Identity, validate_roles, validate_tenant_id


class MemoryStorage(ABC):
    """Loads and saves one memory document per scope ``(user_id, agent_name)``.

    Contract shared by all providers (checked by ``tests/integration/test_storage_contract.py``):
    an unknown scope loads as an empty document whose ``lastUpdated`` is ``""``
    (``unstored_memory``); ``load`` returns a document the caller may mutate without affecting
    the provider; ``save`` never mutates its argument, sets
    ``lastUpdated`` on what it stores, and returns ``False`` (leaving the previous data
    readable) when it cannot persist the document; scopes never see each other's data.
    ``load`` and ``save`` raise ``StorageUnavailableError`` when the backing store cannot be
    reached, so callers can retry later instead of treating the update as bad.
    """

    @property
    def identity(self) -> Identity:
        """The tenant and roles this handle acts for (its ``user_id`` is unset: each call names one)."""
        return DEFAULT_IDENTITY

    def for_identity(self, tenant_id: str | None = None, roles: Iterable[str] | None = None) -> MemoryStorage:
        """A handle on the same store that acts inside ``tenant_id`` with ``roles``.

        Every call on it (``load``, ``save`` ...) reads and writes that tenant's scopes only; the
        roles decide which shared facts it reads. A provider without tenants (this default, the
        file provider) keeps the default tenant and refuses any other.
        """
        tenant = validate_tenant_id(DEFAULT_TENANT_ID if tenant_id is None else tenant_id)
        validate_roles(roles)
        if tenant != DEFAULT_TENANT_ID:
            raise InvalidScopeError(
                f"{type(self).__name__} keeps one tenant: tenants need the SQL provider "
                "(storage_class: memstore.storage.sql.SqlMemoryStorage)"
            )
        return self

    @abstractmethod
    def load(self, agent_name: str | None = None, *, user_id: str | None = None) -> MemoryDocument:
        """The scope's document, served from a cache only when it is provably current."""

    @abstractmethod
    def reload(self, agent_name: str | None = None, *, user_id: str | None = None) -> MemoryDocument:
        """The scope's document read from the backing store, bypassing any cache."""

    @abstractmethod
    def save(
        self,
        memory: MemoryDocument,
        agent_name: str | None = None,
        *,
        user_id: str | None = None,
        origin: str | None = None,
        captured_at: datetime | None = None,
        removals: Mapping[str, Mapping[str, Any]] | None = None,
        confirmed: Collection[str] = (),
        folded: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    ) -> bool:
        """Persist ``memory`` for the scope; ``True`` once it is durable.

        ``removals`` (fact id to a JSON object such as ``{"reason": "stale"}``) says why facts
        missing from ``memory`` went, ``confirmed`` names live facts an update re-stated, and
        ``folded`` (live fact id to one JSON object per new fact folded into it) the live facts
        that new, similar facts were folded into (``update.similarity``); a provider with an audit
        trail and retention signals records them, the others ignore them. A provider that merges
        concurrent writers raises ``FoldTargetGoneError``, saving nothing, when a fold target is
        no longer live after the merge (another writer deleted it), since the folded facts would
        be lost with it.

        ``origin`` (a thread id, ``manual``, ``import``...) labels the change in an audit trail,
        where the provider keeps one. ``captured_at`` is when the conversation behind the
        document was queued. A provider that records erasures refuses, with a logged
        ``StaleDocumentError`` and no change, a document captured before the scope was erased
        or cleared, or loaded before it was erased (whatever revision the scope has reached
        since), so a late update cannot bring erased memory back and is never reported saved.
        """

    def fact_signals(
        self, agent_name: str | None = None, *, user_id: str | None = None
    ) -> dict[str, FactSignals]:
        """Retention signals of the scope's facts by id; a provider that keeps none has none."""
        return {}

    def clear(self, agent_name: str | None = None, *, user_id: str | None = None) -> bool:
        """Empty the scope: a deliberate overwrite, audited with origin ``erase`` where audited."""
        return self.save(create_empty_memory(), agent_name, user_id=user_id, origin="erase")

    def record_access(self, agent_name: str | None, *, user_id: str | None, fact_ids: Iterable[str]) -> None:
        """Note that these facts were injected into a prompt or returned by a search.

        A hint for retention, never a content change: no revision, no audit row. Providers
        without access columns (this default, the file provider) ignore it; the SQL provider
        counts in memory and writes in batches.
        """
        return None
