"""The Redis session store on both faces (``face``): the same results, caps and errors, and on the
async face an event loop that is never blocked by Redis I/O (``memstore.storage.sessions.redis_clients``)."""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis
from pydantic import SecretStr

from memstore import aio
from memstore.async_face import run_on_loop
from memstore.config import MemoryConfig, set_memory_config
from memstore.errors import SessionLimitError, SessionStoreUnavailableError
from memstore.gateway.middleware import MemoryMiddleware
from memstore.ops import sessions
from memstore.session import SessionKey, SessionLimits, SessionTurn
from memstore.storage.sessions.loader import get_session_store, reset_session_stores
from memstore.storage.sessions.redis_store import RedisSessionStore
from tests.support.faces import AsyncFace, Face
from tests.support.redis_server import delete_prefix, new_key_prefix

pytestmark = pytest.mark.redis

T = TypeVar("T")
TTL_SECONDS = 120.0
TURNS = [{"role": "user", "content": "I like green tea"}, {"role": "assistant", "content": "Noted."}]


def on_face(face: Face, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """A core call the public API does not expose (erase, the store itself) on ``face``."""
    if isinstance(face, AsyncFace):
        return face.run(lambda: run_on_loop(fn, *args, **kwargs))
    return fn(*args, **kwargs)


def _config(tmp_path: Path, url: str, **settings: Any) -> MemoryConfig:
    config = MemoryConfig(
        data_dir=str(tmp_path / "data"),
        session_backend="redis",
        session_redis_url=SecretStr(url),
        session_ttl_seconds=TTL_SECONDS,
        session_max_stored_turns=20,
        session_max_per_user=3,
        **settings,
    )
    set_memory_config(config)
    reset_session_stores()
    return config


@pytest.fixture
def tenant(tmp_path: Path, redis_url: str) -> Iterator[str]:
    """Sessions in Redis under a tenant of this test's own (the store's key prefix is the default)."""
    _config(tmp_path, redis_url)
    name = f"t-{uuid.uuid4().hex[:12]}"
    yield name
    reset_session_stores()
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        doomed = list(client.scan_iter(match=f"memstore:\\{{={name}:*", count=500))
        if doomed:
            client.delete(*doomed)
    finally:
        client.close()


def test_append_read_context_list_clear_on_each_face(face: Face, tenant: str) -> None:
    appended = face.call(
        "append_session_turns", "alice", "chat", TURNS, agent_name="helper", tenant_id=tenant
    )
    assert [turn.seq for turn in appended.turns] == [1, 2]
    face.call("append_session_turns", "alice", "other", TURNS[:1], tenant_id=tenant)

    info, turns = face.call("read_session", "alice", "chat", agent_name="helper", tenant_id=tenant)
    assert info is not None and info == appended.info and info.turn_count == 2
    assert [(turn.seq, turn.role, turn.content) for turn in turns] == [
        (1, "user", "I like green tea"),
        (2, "assistant", "Noted."),
    ]
    assert face.call("read_session", "bob", "chat", agent_name="helper", tenant_id=tenant) == (None, [])

    context = face.session_context(
        MemoryMiddleware("helper", session_memory=True), session_id="chat", user_id="alice", tenant_id=tenant
    )
    assert [message["content"] for message in context.messages] == ["I like green tea", "Noted."]
    direct = face.call("session_context", "alice", "chat", agent_name="helper", tenant_id=tenant)
    assert direct.messages == context.messages

    listed = face.call("list_sessions", "alice", tenant_id=tenant)
    assert sorted(info.key.session_id for info in listed) == ["chat", "other"]
    assert [
        info.key.session_id for info in face.call("list_sessions", "alice", tenant_id=tenant, limit=1)
    ] == [listed[0].key.session_id]

    assert face.call("clear_session", "alice", "chat", agent_name="helper", tenant_id=tenant) is True
    assert face.call("clear_session", "alice", "chat", agent_name="helper", tenant_id=tenant) is False
    assert face.call("read_session", "alice", "chat", agent_name="helper", tenant_id=tenant) == (None, [])
    assert [info.key.session_id for info in face.call("list_sessions", "alice", tenant_id=tenant)] == [
        "other"
    ]


def test_every_key_gets_the_ttl_and_erase_leaves_nothing_on_each_face(
    face: Face, tenant: str, redis_url: str
) -> None:
    for session_id in ("s1", "s2"):
        face.call("append_session_turns", "alice", session_id, TURNS, tenant_id=tenant)
    face.call("append_session_turns", "bob", "s1", TURNS, tenant_id=tenant)
    store = get_session_store()
    assert isinstance(store, RedisSessionStore)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        alice = store.user_base(tenant, "alice").replace("{", "\\{").replace("}", "\\}") + "*"
        names = list(client.scan_iter(match=alice, count=500))
        assert len(names) == 5  # two sessions' meta and turns, and the index
        assert all(0 < client.pttl(name) <= TTL_SECONDS * 1000 for name in names)

        # A summary that replaces every turn keeps the TTL (the store's compress, on this face).
        info = face.call("read_session", "alice", "s1", tenant_id=tenant)[0]
        summary = SessionTurn("system", "green tea", tokens=1)
        key = SessionKey("alice", "s1", None, tenant)
        assert on_face(
            face, store.compress, key, epoch=info.epoch, upto_seq=2, summary=summary, now=info.updated_at
        )
        assert [turn.summary for turn in face.call("read_session", "alice", "s1", tenant_id=tenant)[1]] == [
            True
        ]
        assert all(0 < client.pttl(name) <= TTL_SECONDS * 1000 for name in client.scan_iter(match=alice))

        # Erase sweeps keys the index no longer names (an eviction policy may drop the index alone).
        client.delete(store.user_base(tenant, "alice") + "index")
        assert on_face(face, sessions.erase_user_sessions, "alice", tenant_id=tenant) == 2
        assert list(client.scan_iter(match=alice)) == []
        assert face.call("list_sessions", "alice", tenant_id=tenant) == []
        assert len(face.call("list_sessions", "bob", tenant_id=tenant)) == 1
        assert store.expire(datetime.now(UTC) + timedelta(days=1)) == 0
    finally:
        client.close()


def test_the_caps_refuse_alike_on_each_face(face: Face, tenant: str) -> None:
    many = [{"role": "user", "content": f"turn {n}"} for n in range(21)]
    with pytest.raises(SessionLimitError) as turns:
        face.call("append_session_turns", "alice", "big", many, tenant_id=tenant)
    assert turns.value.kind == "turns"
    assert face.call("read_session", "alice", "big", tenant_id=tenant) == (None, [])
    for number in range(3):
        face.call("append_session_turns", "alice", f"s{number}", TURNS, tenant_id=tenant)
    with pytest.raises(SessionLimitError) as refused:
        face.call("append_session_turns", "alice", "s3", TURNS, tenant_id=tenant)
    assert refused.value.kind == "sessions"


def test_async_reads_leave_the_event_loop_free(tenant: str) -> None:
    """50 concurrent reads on one loop: a ticker task runs while they wait for Redis. A read that
    blocked the loop would finish within the step that started it, so the ticker would never see
    one in flight."""
    face = AsyncFace()
    try:
        face.call("append_session_turns", "alice", "chat", TURNS, tenant_id=tenant)

        async def scenario() -> tuple[list[int], list[Any]]:
            in_flight = 0
            seen: list[int] = []
            done = asyncio.Event()

            async def ticker() -> None:
                while not done.is_set():
                    seen.append(in_flight)
                    await asyncio.sleep(0)

            async def read() -> Any:
                nonlocal in_flight
                in_flight += 1
                try:
                    return await aio.read_session("alice", "chat", tenant_id=tenant)
                finally:
                    in_flight -= 1

            ticking = asyncio.create_task(ticker())
            await asyncio.sleep(0)
            results = await asyncio.gather(*(read() for _ in range(50)))
            done.set()
            await ticking
            return seen, results

        seen, results = face.run(scenario)
        assert all(info is not None and [turn.seq for turn in turns] == [1, 2] for info, turns in results)
        assert max(seen) > 1, "no read was in flight while the ticker ran: the loop was blocked"
        assert sum(1 for count in seen if count) >= 2  # it ticked again while reads were pending
    finally:
        face.close()


def test_aclose_closes_the_loops_redis_clients(tenant: str, tmp_path: Path, redis_url: str) -> None:
    name = f"memstore-test-{uuid.uuid4().hex[:12]}"  # the server lists our connections by it
    _config(tmp_path, f"{redis_url}{'&' if '?' in redis_url else '?'}client_name={name}")
    client = redis.Redis.from_url(redis_url, decode_responses=True)

    def connections() -> int:
        return sum(1 for entry in client.client_list() if entry.get("name") == name)

    face = AsyncFace()
    try:
        face.call("append_session_turns", "alice", "chat", TURNS, tenant_id=tenant)
        assert face.call("read_session", "alice", "chat", tenant_id=tenant)[0] is not None
        assert connections() >= 1
        face.run(aio.aclose)
        deadline = time.monotonic() + 10  # the server drops a closed connection when it sees EOF
        while connections() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert connections() == 0
    finally:
        face.close()
        client.close()


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_redis_that_is_down_fails_alike_on_each_face(face: Face, tmp_path: Path) -> None:
    port = _closed_port()
    config = _config(tmp_path, f"redis://:s3cret@127.0.0.1:{port}/0")
    started = time.monotonic()
    with pytest.raises(SessionStoreUnavailableError) as down:
        face.call("read_session", "alice", "chat")
    assert f"127.0.0.1:{port}" in str(down.value) and "s3cret" not in str(down.value)
    with pytest.raises(SessionStoreUnavailableError):
        face.call("append_session_turns", "alice", "chat", TURNS)
    context = face.session_context(MemoryMiddleware(session_memory=True), session_id="chat", user_id="alice")
    assert context.messages == [] and context.summary is None
    assert time.monotonic() - started < config.memory_context_timeout_seconds
    reset_session_stores()


def test_stores_under_their_own_prefix_share_no_key_across_faces(face: Face, redis_url: str) -> None:
    """A store built directly (not by the loader) also works on the async face."""
    prefix = new_key_prefix()
    store = RedisSessionStore(redis_url, key_prefix=prefix)
    key = SessionKey("alice", "chat", None, "acme")
    limits = SessionLimits(max_stored_turns=5, max_sessions_per_user=2, ttl_seconds=TTL_SECONDS)
    now = datetime.now(UTC)
    try:
        turn = [SessionTurn("user", "hello", tokens=1)]
        assert [t.seq for t in on_face(face, store.append, key, turn, now=now, limits=limits).turns] == [1]
        info, turns = on_face(face, store.read, key, now=now)
        assert info is not None and [t.content for t in turns] == ["hello"]
        assert [i.key for i in on_face(face, store.list_sessions, "acme", "alice", now=now)] == [key]
        assert on_face(face, store.clear, key) is True
    finally:
        store.close()
        delete_prefix(redis_url, prefix)
