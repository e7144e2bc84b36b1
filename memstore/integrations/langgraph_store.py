"""``MemstoreStore``: memstore's memory database as a LangGraph store, sync and async.

    from memstore.integrations.langgraph_store import MemstoreStore

    store = MemstoreStore(namespace_user_index=1)          # namespaces like ("memories", user_id)
    graph = builder.compile(store=store)

Items live in ``memory_store_items`` (their puts and deletes in ``memory_store_item_history``,
the newest 20 per item) of the configured database, SQLite or PostgreSQL, under memstore's
identity, row-level security, caps, backups and ``memstore erase``.

**Whose items (the identity mapping).** Every operation runs for one ``(tenant, user, agent)``:

- tenant: ``tenant_id``, else the tenant bound by ``set_current_user`` when the call runs (the
  default tenant when none is);
- user: with ``namespace_user_index`` set, the namespace label at that index (``1`` for
  LangGraph's usual ``("memories", user_id)``), which must be a valid memstore user id (normalise
  external ids with ``memstore.scope.make_safe_user_id``). A put or get whose namespace is too short
  is refused; a search or ``list_namespaces`` whose prefix does not name the user (too short, or
  ``*`` there) reaches the calling user's items only. Without it, ``user_id``, else the user bound
  when the call runs (``"default"`` when none is);
- agent: ``agent_name`` (none: ``''``).

The whole namespace is stored, so items round-trip exactly; two scopes never see each other's
items, and on PostgreSQL the row-level security of both tables enforces it.

**Batches.** ``batch`` checks every operation first (a bad one stops the batch and nothing is
stored), then runs the reads (they see the state before the batch's writes, as in LangGraph's
in-memory store), then the writes: the last put or delete of each item wins and all of them are
one transaction, whoever's items they are. ``abatch`` runs the same code on the event loop with the
async drivers (``memstore.async_face.run_on_loop``): no thread; a cancelled one stores nothing.

**Search.** Newest first (``updated_at``, then namespace and key). With ``query``: when memstore's
embeddings are configured (``embedding_provider``), each put embeds its indexed text (``index``:
``None`` every string in the value, a list the text at those LangGraph field paths, ``False``
nothing), and a query ranks by cosine similarity; otherwise it ranks by the share of the
query's words the indexed text holds, from 0 to 1. Scored items come first, best first; items not
indexed (or embedded by another model) follow, newest first, with ``score`` ``None``. A query
ranks the newest ``MAX_CANDIDATES`` items that match the prefix and the filter.

**Not supported:** TTL (``supports_ttl`` is ``False``; a put with ``ttl`` raises
``NotImplementedError``). A put or query whose embedding fails raises and stores nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

try:
    from langgraph.store.base import (
        BaseStore,
        GetOp,
        Item,
        ListNamespacesOp,
        Op,
        PutOp,
        Result,
        SearchItem,
        SearchOp,
    )
    from langgraph.store.base.embed import get_text_at_path
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "memstore.integrations.langgraph_store needs LangGraph: pip install 'memstore[langchain]'"
    ) from exc

from memstore.async_face import run_on_loop
from memstore.config import MemoryConfig, get_memory_config
from memstore.embedding.loader import get_embedder
from memstore.errors import ConfigError, InvalidScopeError, StoreItemError
from memstore.gateway.user_context import effective_tenant, get_effective_user_id
from memstore.scope import USER_ID_PATTERN, normalize_agent_name, validate_tenant_id, validate_user_id
from memstore.storage.loader import load_storage_class
from memstore.storage.sql.documents.provider import SqlMemoryStorage
from memstore.storage.sql.engine import database_url_from_config
from memstore.storage.sql.store_items.items import (
    DEFAULT_MAX_ITEMS,
    MAX_LABELS,
    ItemScope,
    ItemSearch,
    ItemWrite,
    MatchType,
    Namespace,
    Ranking,
    StoredItem,
    checked_filter,
    checked_key,
    checked_namespace,
    checked_page,
    checked_query,
    default_index_text,
    encoded_value,
    index_text,
    ranking_terms,
)
from memstore.storage.sql.store_items.store import ItemStore

__all__ = ["MAX_BATCH_OPS", "MemstoreStore"]

MAX_BATCH_OPS = 1000
MAX_INDEX_PATHS = 32
MAX_INDEX_PATH_CHARS = 256
MAX_ITEMS_CAP = 1_000_000


@dataclass(frozen=True)
class _Listing:
    scope: ItemScope
    conditions: list[tuple[MatchType, Namespace]]
    max_depth: int | None
    limit: int
    offset: int


@dataclass
class _Plan:
    """A checked batch: its reads by position, and its writes, the last one per item: the value's
    JSON text (``None``: a delete) and the text it is indexed by."""

    gets: dict[int, tuple[ItemScope, Namespace, str]] = field(default_factory=dict)
    searches: dict[int, tuple[ItemScope, ItemSearch, str | None]] = field(default_factory=dict)
    listings: dict[int, _Listing] = field(default_factory=dict)
    puts: dict[tuple[ItemScope, Namespace, str], tuple[str | None, str | None]] = field(default_factory=dict)


class MemstoreStore(BaseStore):
    """A LangGraph ``BaseStore`` on memstore's database (see the module's documentation).

    ``max_items``: the live items one ``(tenant, user, agent)`` may hold (a batch that would pass
    it raises ``StoreItemLimitError`` and stores nothing); ``config``: memstore's settings (the
    database and the embeddings), the process's when ``None``.
    """

    supports_ttl = False

    def __init__(
        self,
        *,
        agent_name: str | None = None,
        tenant_id: str | None = None,
        user_id: str | None = None,
        namespace_user_index: int | None = None,
        config: MemoryConfig | None = None,
        max_items: int = DEFAULT_MAX_ITEMS,
    ) -> None:
        if namespace_user_index is not None:
            if not isinstance(namespace_user_index, int) or isinstance(namespace_user_index, bool):
                raise ConfigError("namespace_user_index must be a whole number")
            if not 0 <= namespace_user_index < MAX_LABELS:
                raise ConfigError(f"namespace_user_index must be from 0 to {MAX_LABELS - 1}")
            if user_id is not None:
                raise ConfigError(
                    "pass user_id or namespace_user_index, not both: each says whose items they are"
                )
        if (
            not isinstance(max_items, int)
            or isinstance(max_items, bool)
            or not 1 <= max_items <= MAX_ITEMS_CAP
        ):
            raise ConfigError(f"max_items must be a whole number from 1 to {MAX_ITEMS_CAP}")
        self._agent_name = normalize_agent_name(agent_name) or ""
        self._tenant_id = None if tenant_id is None else validate_tenant_id(tenant_id)
        self._user_id = validate_user_id(user_id)
        self._user_index = namespace_user_index
        self._max_items = max_items
        self._config = config or get_memory_config()
        if not issubclass(load_storage_class(self._config.storage_class), SqlMemoryStorage):
            raise ConfigError(
                "MemstoreStore keeps items in the memory database and needs the SQL provider, but "
                f"storage_class is {self._config.storage_class}"
            )
        self._items = ItemStore(database_url_from_config(self._config))

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        ops = list(ops)
        if len(ops) > MAX_BATCH_OPS:
            raise StoreItemError(f"a batch holds {len(ops)} operations; at most {MAX_BATCH_OPS}")
        plan = self._plan(ops)
        results: list[Result] = [None] * len(ops)
        self._read(plan, results)
        if plan.puts:
            self._items.write(self._writes(plan), now=datetime.now(UTC), max_items=self._max_items)
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        return await run_on_loop(self.batch, ops)

    # -- checking ---------------------------------------------------------------------------------

    def _plan(self, ops: Sequence[Op]) -> _Plan:
        plan = _Plan()
        tenant = validate_tenant_id(
            self._tenant_id if self._tenant_id is not None else effective_tenant(None)
        )
        for position, op in enumerate(ops):
            if isinstance(op, GetOp):
                namespace = checked_namespace(op.namespace)
                plan.gets[position] = (
                    self._scope(tenant, namespace, exact=True),
                    namespace,
                    checked_key(op.key),
                )
            elif isinstance(op, SearchOp):
                prefix = checked_namespace(op.namespace_prefix, what="namespace prefix")
                limit, offset = checked_page(op.limit, op.offset)
                search = ItemSearch(prefix, checked_filter(op.filter), limit, offset)
                plan.searches[position] = (
                    self._scope(tenant, prefix, exact=False),
                    search,
                    checked_query(op.query),
                )
            elif isinstance(op, ListNamespacesOp):
                plan.listings[position] = self._listing(tenant, op)
            elif isinstance(op, PutOp):
                self._plan_put(plan, tenant, op)
            else:
                raise StoreItemError(
                    f"operation {position} is a {type(op).__name__}, not a LangGraph store op"
                )
        return plan

    def _plan_put(self, plan: _Plan, tenant: str, op: PutOp) -> None:
        if op.ttl is not None:
            raise NotImplementedError(
                "TTL is not supported by MemstoreStore: items stay until deleted (put with ttl=None)"
            )
        namespace = checked_namespace(op.namespace)
        if not namespace:
            raise StoreItemError("namespace is empty: an item needs at least one label")
        key = checked_key(op.key)
        scope = self._scope(tenant, namespace, exact=True)
        if op.value is None:
            plan.puts[(scope, namespace, key)] = (None, None)  # the last write of an item wins
            return
        value, text = encoded_value(op.value)
        plan.puts[(scope, namespace, key)] = (text, _indexed(value, op.index))

    def _scope(self, tenant: str, namespace: Namespace, *, exact: bool) -> ItemScope:
        index = self._user_index
        if index is None:
            return ItemScope(tenant, self._user_id or _current_user(), self._agent_name)
        if len(namespace) > index:
            return ItemScope(tenant, _label_user(namespace[index], index), self._agent_name)
        if exact:
            raise StoreItemError(
                f"namespace has {len(namespace)} labels, but namespace_user_index {index} needs at least "
                f"{index + 1}: the label at {index} says whose item it is"
            )
        return ItemScope(tenant, _current_user(), self._agent_name)

    def _listing(self, tenant: str, op: ListNamespacesOp) -> _Listing:
        conditions = _conditions(op)
        limit, offset = checked_page(op.limit, op.offset)
        depth = op.max_depth
        if depth is not None and (not isinstance(depth, int) or isinstance(depth, bool) or depth < 1):
            raise StoreItemError("max_depth must be a whole number of at least 1")
        index, named = self._user_index, cast(Namespace, ())
        for match_type, path in conditions:
            if index is not None and match_type == "prefix" and len(path) > index and path[index] != "*":
                named = path
                break
        return _Listing(self._scope(tenant, named, exact=False), conditions, depth, limit, offset)

    # -- running ------------------------------------------------------------------------------------

    def _read(self, plan: _Plan, results: list[Result]) -> None:
        by_scope: dict[ItemScope, list[int]] = {}
        for position, (scope, _, _) in plan.gets.items():
            by_scope.setdefault(scope, []).append(position)
        for scope, positions in by_scope.items():
            found = self._items.get(scope, [plan.gets[p][1:] for p in positions])
            for position in positions:
                stored = found.get(plan.gets[position][1:])
                results[position] = None if stored is None else _item(stored)
        for position, (scope, search, query) in plan.searches.items():
            ranked = search if query is None else _with_ranking(search, self._ranking(query))
            results[position] = [_search_item(stored) for stored in self._items.search(scope, ranked)]
        for position, listing in plan.listings.items():
            results[position] = self._items.list_namespaces(
                listing.scope,
                listing.conditions,
                max_depth=listing.max_depth,
                limit=listing.limit,
                offset=listing.offset,
            )

    def _ranking(self, query: str) -> Ranking:
        embedder = get_embedder(self._config)
        if embedder is None:
            return Ranking(terms=ranking_terms(query))
        return Ranking(vector=embedder.embed_query(query), model=embedder.model)

    def _writes(self, plan: _Plan) -> list[ItemWrite]:
        embedder = get_embedder(self._config)
        texts = [indexed for text, indexed in plan.puts.values() if indexed is not None]
        vectors = iter(embedder.embed_documents(texts) if embedder is not None and texts else [])
        writes = []
        for (scope, namespace, key), (text, indexed) in plan.puts.items():
            vector = next(vectors) if embedder is not None and indexed is not None else None
            model = embedder.model if embedder is not None else None
            writes.append(ItemWrite(scope, namespace, key, text, indexed, vector, model))
        return writes


def _current_user() -> str:
    user = get_effective_user_id()
    if not USER_ID_PATTERN.fullmatch(user):
        raise InvalidScopeError(
            "the current user's id is not a memstore user id (1-128 of A-Z a-z 0-9 _ -): "
            "bind make_safe_user_id(raw) with set_current_user"
        )
    return user


def _label_user(label: str, index: int) -> str:
    if not USER_ID_PATTERN.fullmatch(label):
        raise InvalidScopeError(
            f"namespace label {index} (namespace_user_index) is not a memstore user id: use 1-128 "
            "characters from A-Z a-z 0-9 _ - (normalise external ids with make_safe_user_id)"
        )
    return label


def _conditions(op: ListNamespacesOp) -> list[tuple[MatchType, Namespace]]:
    conditions: list[tuple[MatchType, Namespace]] = []
    for condition in op.match_conditions or ():
        if condition.match_type not in ("prefix", "suffix"):
            raise StoreItemError("a match condition's match_type must be 'prefix' or 'suffix'")
        path = checked_namespace(condition.path, what=f"{condition.match_type} path")
        conditions.append((condition.match_type, path))
    return conditions


def _indexed(value: dict[str, Any], index: object) -> str | None:
    """The text a query ranks the item by: LangGraph's ``index`` of the put, over its value."""
    if index is None:
        return default_index_text(value)
    if index is False:
        return None
    if not isinstance(index, list) or len(index) > MAX_INDEX_PATHS:
        raise StoreItemError(f"index must be False, None or a list of at most {MAX_INDEX_PATHS} field paths")
    texts: list[str] = []
    for path in index:
        if not isinstance(path, str) or not 0 < len(path) <= MAX_INDEX_PATH_CHARS:
            raise StoreItemError(
                f"an index field path must be a string of 1 to {MAX_INDEX_PATH_CHARS} characters"
            )
        try:
            texts.extend(get_text_at_path(value, path))
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            raise StoreItemError("an index field path is not one LangGraph can read") from exc
    return index_text(texts)


def _with_ranking(search: ItemSearch, ranking: Ranking) -> ItemSearch:
    return ItemSearch(search.prefix, search.filter, search.limit, search.offset, ranking)


def _item(stored: StoredItem) -> Item:
    return Item(
        value=stored.value,
        key=stored.key,
        namespace=stored.namespace,
        created_at=stored.created_at,
        updated_at=stored.updated_at,
    )


def _search_item(stored: StoredItem) -> SearchItem:
    return SearchItem(
        stored.namespace, stored.key, stored.value, stored.created_at, stored.updated_at, stored.score
    )
