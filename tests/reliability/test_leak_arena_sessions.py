"""The leak arena for short-term memory: canary turns in sessions of many tenants, users and
agents (the same session id everywhere), read back by every identity through every session read
path, on every backend: process memory, Redis, SQLite, PostgreSQL as a superuser and PostgreSQL as
an application role that row-level security binds. A session is its user's alone: an identity
must see exactly its own canaries, never another's, whatever it asks for."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from memstore.inject.session_context import build_session_context
from memstore.session import SessionKey, SessionLimits, SessionTurn
from memstore.storage.sessions.contract import SessionStore
from memstore.storage.sessions.memory import InMemorySessionStore
from tests.support.app_role import app_role_url

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
LIMITS = SessionLimits(max_stored_turns=100, max_sessions_per_user=100, ttl_seconds=86_400)
OWNERS = [
    ("acme", "alice", None),
    ("acme", "alice", "helper"),
    ("acme", "bob", None),
    ("globex", "alice", None),
    ("globex", "alice", "helper"),
    ("initech", None, None),
]
SESSION_IDS = ("s1", "shared-id")


@pytest.fixture(params=["memory", "redis", "sqlite", "postgresql", "postgresql-app-role"])
def stores(request: pytest.FixtureRequest) -> Iterator[tuple[SessionStore, SessionStore]]:
    """The store the canaries are written through and the one the readers use."""
    if request.param == "memory":
        store: SessionStore = InMemorySessionStore()
        yield store, store
        return
    if request.param == "redis":
        request.applymarker(pytest.mark.redis)
        from tests.support.redis_server import redis_session_store

        with redis_session_store(str(request.getfixturevalue("redis_url"))) as redis_store:
            yield redis_store, redis_store
        return
    from memstore.storage.sql.sessions.store import DatabaseSessionStore

    if request.param == "sqlite":
        sqlite = DatabaseSessionStore(str(request.getfixturevalue("sqlite_url")))
        yield sqlite, sqlite
        return
    request.applymarker(pytest.mark.postgres)
    owner_url = str(request.getfixturevalue("postgres_url"))
    owner = DatabaseSessionStore(owner_url)
    if request.param == "postgresql":
        yield owner, owner
        return
    with app_role_url(owner_url, "memstore_sessions") as url:
        yield owner, DatabaseSessionStore(url)


Session = tuple[str, str | None, str | None, str]
"""``(tenant, user, agent, session id)``."""


def _seed(store: SessionStore) -> dict[Session, list[str]]:
    """Three canaries per session: two turns, the first of them then compressed into a summary
    that also carries the third."""
    canaries: dict[Session, list[str]] = {}
    for tenant, user, agent in OWNERS:
        for session_id in SESSION_IDS:
            texts = [f"canary-{secrets.token_hex(8)}" for _ in range(3)]
            canaries[(tenant, user, agent, session_id)] = texts
            key = SessionKey(user, session_id, agent, tenant)
            turns = [SessionTurn("user", text, tokens=1) for text in texts[:2]]
            store.append(key, turns, now=NOW, limits=LIMITS)
            info, _ = store.read(key, now=NOW)
            assert info is not None
            summary = SessionTurn("system", f"{texts[0]} {texts[2]}", tokens=1)
            assert store.compress(key, epoch=info.epoch, upto_seq=1, summary=summary, now=NOW)
    return canaries


def _everything_read(store: SessionStore, tenant: str, user: str | None, now: datetime = NOW) -> str:
    """Every session read path's output for the identity ``(tenant, user)``, as one text."""
    seen: list[object] = [store.list_sessions(tenant, user, now=now, limit=1000)]
    for _, _, agent in OWNERS:
        for session_id in (*SESSION_IDS, "missing"):
            key = SessionKey(user, session_id, agent, tenant)
            info, turns = store.read(key, now=now)
            seen += [info, turns, build_session_context(turns, max_tokens=10_000, use_tiktoken=False)]
    return repr(seen)


def _identities() -> list[tuple[str, str | None]]:
    owners = {(tenant, user) for tenant, user, _ in OWNERS}
    return sorted(owners | {("acme", "carol"), ("umbrella", "alice")}, key=str)


def test_no_identity_reads_a_session_canary_of_another(stores: tuple[SessionStore, SessionStore]) -> None:
    writer, reader = stores
    canaries = _seed(writer)
    everyone = {text for texts in canaries.values() for text in texts}
    for tenant, user in _identities():
        seen = _everything_read(reader, tenant, user)
        own = {text for (t, u, _, _), texts in canaries.items() if (t, u) == (tenant, user) for text in texts}
        assert {text for text in everyone if text in seen} == own, (tenant, user)


def test_clear_and_erase_reach_only_their_own(stores: tuple[SessionStore, SessionStore]) -> None:
    writer, reader = stores
    canaries = _seed(writer)
    cleared: Session = ("acme", "alice", None, "shared-id")
    assert reader.clear(SessionKey("alice", "shared-id", None, "acme"))
    assert reader.erase_user("globex", "alice") == 4
    left = "".join(_everything_read(reader, tenant, user) for tenant, user in _identities())
    for session, texts in canaries.items():
        gone = session == cleared or session[:2] == ("globex", "alice")
        assert all((text in left) != gone for text in texts), session
    # Expired sessions are no one's: a later read sees none of them.
    later = NOW + timedelta(seconds=LIMITS.ttl_seconds + 1)
    after_expiry = "".join(_everything_read(reader, tenant, user, later) for tenant, user in _identities())
    assert not any(text in after_expiry for texts in canaries.values() for text in texts)
