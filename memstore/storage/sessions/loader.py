"""The process's session store for a configuration: ``session_backend`` decides which.

``database`` (the default with the SQL provider) keeps sessions in the memory database;
``redis`` in the server at ``session_redis_url`` (the ``redis`` extra); ``memory`` in this
process (the default with any other provider). One store per distinct target, shared by every
thread, as the engines and embedders are.
"""

from __future__ import annotations

import threading

from memstore.async_face import held
from memstore.config import MemoryConfig, get_memory_config
from memstore.errors import ConfigError
from memstore.storage.loader import load_storage_class
from memstore.storage.sessions.contract import SessionStore
from memstore.storage.sessions.memory import InMemorySessionStore
from memstore.storage.sql.documents.provider import SqlMemoryStorage
from memstore.storage.sql.engine import database_url_from_config

_stores: dict[tuple[str, str], SessionStore] = {}
_lock = threading.Lock()


def session_backend(config: MemoryConfig) -> str:
    """The backend ``config`` selects; ``database`` with a provider other than SQL is refused."""
    sql = issubclass(load_storage_class(config.storage_class), SqlMemoryStorage)
    backend = config.session_backend or ("database" if sql else "memory")
    if backend == "database" and not sql:
        raise ConfigError(
            f"session_backend 'database' needs the SQL provider, but storage_class is "
            f"{config.storage_class}; set session_backend: memory or redis"
        )
    return backend


def _target(config: MemoryConfig, backend: str) -> str:
    if backend == "database":
        return database_url_from_config(config)
    if backend == "redis":
        assert config.session_redis_url is not None  # the config's validator requires it
        return config.session_redis_url.get_secret_value()
    return f"{config.storage_class} {config.data_dir}"


def get_session_store(config: MemoryConfig | None = None) -> SessionStore:
    config = config or get_memory_config()
    backend = session_backend(config)
    key = (backend, _target(config, backend))
    with held(_lock):  # building a store may read the database: on the async face, yield meanwhile
        store = _stores.get(key)
        if store is None:
            store = _build(backend, key[1])
            _stores[key] = store
        return store


def _build(backend: str, target: str) -> SessionStore:
    if backend == "database":
        from memstore.storage.sql.sessions.store import DatabaseSessionStore

        return DatabaseSessionStore(target)
    if backend == "redis":
        try:
            from memstore.storage.sessions.redis_store import RedisSessionStore
        except ImportError as exc:
            raise ConfigError(
                "session_backend 'redis' needs the redis extra: pip install 'memstore[redis]'"
            ) from exc
        return RedisSessionStore(target)
    return InMemorySessionStore()


def reset_session_stores() -> None:
    """Close and forget every store (tests, and a process that changes its configuration)."""
    with _lock:
        stores = list(_stores.values())
        _stores.clear()
    for store in stores:
        store.close()
