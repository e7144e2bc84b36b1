"""Redis for tests: the server in MEMSTORE_TEST_REDIS_URL, one key prefix per test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import redis

from memstore.storage.sessions.redis_store import RedisSessionStore
from tests.support.postgres import configured_url_or_skip

REDIS_URL_ENV = "MEMSTORE_TEST_REDIS_URL"


def redis_url_or_skip() -> str:
    return configured_url_or_skip(REDIS_URL_ENV, "Redis")


def new_key_prefix() -> str:
    """A prefix no other test uses (hex only, so it is also a literal SCAN pattern)."""
    return f"memstore-t-{uuid.uuid4().hex[:12]}"


def keys_under(url: str, prefix: str) -> list[str]:
    """Every key of ``prefix`` on the server, by SCAN (never KEYS, which blocks the server)."""
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        return sorted(str(key) for key in client.scan_iter(match=f"{prefix}:*", count=500))
    finally:
        client.close()


def delete_prefix(url: str, prefix: str) -> None:
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        doomed = list(client.scan_iter(match=f"{prefix}:*", count=500))
        for start in range(0, len(doomed), 500):
            client.delete(*doomed[start : start + 500])
    finally:
        client.close()


@contextmanager
def redis_session_store(url: str, key_prefix: str | None = None) -> Iterator[RedisSessionStore]:
    """A store under its own key prefix; its keys are deleted afterwards."""
    prefix = key_prefix or new_key_prefix()
    store = RedisSessionStore(url, key_prefix=prefix)
    try:
        yield store
    finally:
        store.close()
        delete_prefix(url, prefix)
