"""What only the Redis session store has: key TTLs, its key layout, and a server that is down."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import redis
from redis.crc import key_slot

from memstore.errors import SessionStoreUnavailableError, StorageUnavailableError
from memstore.session import SessionKey, SessionLimits, SessionTurn
from memstore.storage.sessions.redis_store import RedisSessionStore, masked_url
from tests.support.redis_server import keys_under, redis_session_store

pytestmark = pytest.mark.redis

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
LIMITS = SessionLimits(max_stored_turns=50, max_sessions_per_user=50, ttl_seconds=120)


@pytest.fixture
def store(redis_url: str) -> Iterator[RedisSessionStore]:
    with redis_session_store(redis_url) as opened:
        yield opened


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    connection = redis.Redis.from_url(redis_url, decode_responses=True)
    yield connection
    connection.close()


def _append(store: RedisSessionStore, key: SessionKey, content: str, now: datetime = T0) -> None:
    store.append(key, [SessionTurn("user", content, tokens=1)], now=now, limits=LIMITS)


def test_every_key_of_a_session_gets_the_ttl(
    store: RedisSessionStore, client: redis.Redis, redis_url: str
) -> None:
    key = SessionKey("alice", "chat", "helper", "acme")
    _append(store, key, "one")
    _append(store, key, "two")
    keys = keys_under(redis_url, store.key_prefix)
    assert len(keys) == 3  # meta, turns and the user's index
    for name in keys:
        assert 0 < client.pttl(name) <= 120_000, name
    # Compressing every turn empties the turns key, and the summary must not be stored without a TTL.
    info = store.read(key, now=T0)[0]
    assert info is not None
    summary = SessionTurn("system", "both", tokens=1)
    assert store.compress(key, epoch=info.epoch, upto_seq=2, summary=summary, now=T0)
    for name in keys_under(redis_url, store.key_prefix):
        assert 0 < client.pttl(name) <= 120_000, name


def test_keys_of_different_scopes_never_collide(
    store: RedisSessionStore, client: redis.Redis, redis_url: str
) -> None:
    # Pairs that a naive "tenant:user:agent:session" join would map to the same key.
    keys = [
        SessionKey("a", "b:c", None, "t"),
        SessionKey("a", "c", "b", "t"),
        SessionKey(None, "s", None, "t"),
        SessionKey("-", "s", None, "t"),
        SessionKey("-", "s", "-", "t"),
        SessionKey("x", "s", None, "t-y"),
        SessionKey("y-x", "s", None, "t"),
        SessionKey("x", "s:y", None, "t"),
        SessionKey("x", "s", "y", "t"),
    ]
    for index, key in enumerate(keys):
        _append(store, key, f"session {index}")
    for index, key in enumerate(keys):
        assert [turn.content for turn in store.read(key, now=T0)[1]] == [f"session {index}"]

    names = keys_under(redis_url, store.key_prefix)
    metas = [name for name in names if name.endswith(":meta")]
    assert len(metas) == len(keys)
    stored_ids = sorted(client.hget(name, "session_id") or "" for name in metas)
    assert stored_ids == sorted(key.session_id for key in keys)
    users = {(key.tenant_id, key.user_id) for key in keys}
    assert len([name for name in names if name.endswith(":index")]) == len(users)
    for tenant_id, user_id in users:
        base = store.user_base(tenant_id, user_id)
        own = [name for name in names if name.startswith(base)]
        assert own and len({key_slot(name.encode()) for name in own}) == 1  # one Cluster slot per user
        assert all(name.count("{") == 1 and name.count("}") == 1 for name in own)
    assert len({store.user_base(t, u) for t, u in users}) == len(users)


def test_erase_user_leaves_no_key_of_the_user(store: RedisSessionStore, redis_url: str) -> None:
    for session_id in ("s1", "s2", "s3"):
        _append(store, SessionKey("alice", session_id, None, "acme"), "x")
    _append(store, SessionKey("alice", "s1", None, "globex"), "x")
    assert store.erase_user("acme", "alice") == 3
    names = keys_under(redis_url, store.key_prefix)
    assert not [name for name in names if name.startswith(store.user_base("acme", "alice"))]
    assert [name for name in names if name.startswith(store.user_base("globex", "alice"))]


def test_the_index_forgets_sessions_redis_has_expired(store: RedisSessionStore, client: redis.Redis) -> None:
    gone, kept = SessionKey("alice", "old", None, "acme"), SessionKey("alice", "new", None, "acme")
    _append(store, gone, "x")
    base = store.user_base("acme", "alice")
    for suffix in (":meta", ":turns"):  # what Redis does when the TTL runs out
        client.delete(f"{base}s:-:=old{suffix}")
    _append(store, kept, "y", now=T0 + timedelta(seconds=121))
    assert client.zrange(f"{base}index", 0, -1) == ["-:=new"]
    assert store.expire(T0 + timedelta(days=1)) == 0  # Redis expires the keys itself


def test_a_server_that_is_down_raises_unavailable_without_the_password() -> None:
    with socket.socket() as bound:  # a port that is ours and does not listen: connections are refused
        bound.bind(("127.0.0.1", 0))
        port = bound.getsockname()[1]
        url = f"redis://:s3cret-Pa55@127.0.0.1:{port}/0"
        store = RedisSessionStore(url)
        key = SessionKey("alice", "chat")
        with pytest.raises(SessionStoreUnavailableError) as down:
            store.read(key, now=T0)
        assert isinstance(down.value, StorageUnavailableError)
        with pytest.raises(SessionStoreUnavailableError) as refused:
            store.append(key, [SessionTurn("user", "hi")], now=T0, limits=LIMITS)
        store.close()
    for error in (down.value, refused.value):
        message = str(error)
        assert "s3cret-Pa55" not in message and f"127.0.0.1:{port}" in message
        assert ":***@" in message


def test_masked_url_hides_every_form_of_password() -> None:
    assert masked_url("redis://user:pw@host:6379/0") == "redis://user:***@host:6379/0"
    assert masked_url("rediss://:pw@host/1") == "rediss://:***@host/1"
    assert masked_url("unix:///run/redis.sock?db=0&password=pw") == "unix:///run/redis.sock?db=0&password=***"
    assert masked_url("redis://host:6379/0") == "redis://host:6379/0"


def test_erase_finds_sessions_whose_index_was_evicted(store: RedisSessionStore, client: redis.Redis) -> None:
    for session_id in ("s1", "s2"):
        _append(store, SessionKey("alice", session_id, None, "acme"), "x")
    client.delete(f"{store.user_base('acme', 'alice')}index")  # what an eviction policy may do
    assert store.erase_user("acme", "alice") == 2
    assert store.read(SessionKey("alice", "s1", None, "acme"), now=T0) == (None, [])
    assert not [name for name in client.scan_iter(match=f"{store.key_prefix}:*")]


@pytest.fixture
def small_redis(tmp_path: Path) -> Iterator[str]:
    """A throwaway redis-server with 2 MiB of ``maxmemory`` and no eviction."""
    binary = shutil.which("redis-server")
    if binary is None:
        message = "redis-server is not installed (scripts/with-redis.sh installs it)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    arguments = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    arguments += ["--maxmemory", "2mb", "--maxmemory-policy", "noeviction", "--dir", str(tmp_path)]
    server = subprocess.Popen([binary, *arguments], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis.from_url(url).ping()
                break
            except redis.exceptions.ConnectionError:
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)
        yield url
    finally:
        server.terminate()
        server.wait(10)


def test_a_full_redis_refuses_appends_whole_as_unavailable(small_redis: str) -> None:
    store = RedisSessionStore(small_redis)
    client = redis.Redis.from_url(small_redis)
    try:
        limits = SessionLimits(max_stored_turns=10_000, max_sessions_per_user=10_000, ttl_seconds=600)
        turn = [SessionTurn("user", "x" * 20_000, tokens=1)]
        with pytest.raises(SessionStoreUnavailableError, match=r"OOM|memory"):
            for number in range(1000):  # 20 MB: ten times what the server may hold
                store.append(SessionKey("alice", f"s{number}", None), turn, now=T0, limits=limits)
        used, cap = (client.info("memory")[name] for name in ("used_memory", "maxmemory"))
        assert used < 2 * cap  # refused before writing, not after
    finally:
        store.close()
        client.close()
