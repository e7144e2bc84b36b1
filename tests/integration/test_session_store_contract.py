"""The contract every session store honours (``memstore/storage/sessions/contract.py``), run on
each backend: process memory (the reference), Redis, SQLite and PostgreSQL."""

from __future__ import annotations

import json
import multiprocessing
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from memstore.errors import SessionLimitError
from memstore.session import SessionInfo, SessionKey, SessionLimits, SessionTurn
from memstore.storage.sessions.contract import SessionStore
from memstore.storage.sessions.memory import InMemorySessionStore
from memstore.storage.sessions.redis_store import RedisSessionStore
from tests.support.redis_server import delete_prefix, new_key_prefix

T0 = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)
TTL = 3600.0
LIMITS = SessionLimits(max_stored_turns=50, max_sessions_per_user=20, ttl_seconds=TTL)
KEY = SessionKey("alice", "chat-1", "helper", "acme")
RACE_TURNS = 100
RACE_DEADLINE_SECONDS = 300


@dataclass
class Backend:
    """A store under test, and what a child process needs to open the same one."""

    kind: str
    store: SessionStore
    url: str = ""
    prefix: str = ""


def open_store(kind: str, url: str, prefix: str) -> SessionStore:
    """The store of ``kind`` on ``url`` (also what a spawned child runs)."""
    if kind == "redis":
        return RedisSessionStore(url, key_prefix=prefix)
    from memstore.storage.sql.sessions.store import DatabaseSessionStore  # written alongside this suite

    store: SessionStore = DatabaseSessionStore(url)
    return store


@pytest.fixture(
    params=[
        pytest.param("memory", id="memory"),
        pytest.param("redis", id="redis", marks=pytest.mark.redis),
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres),
    ]
)
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    kind = str(request.param)
    if kind == "memory":
        yield Backend(kind, InMemorySessionStore())
        return
    url = str(
        request.getfixturevalue({"redis": "redis_url", "sqlite": "sqlite_url"}.get(kind, "postgres_url"))
    )
    prefix = new_key_prefix() if kind == "redis" else ""
    store = open_store(kind, url, prefix)
    try:
        yield Backend(kind, store, url, prefix)
    finally:
        store.close()
        if kind == "redis":
            delete_prefix(url, prefix)


@pytest.fixture
def session_store(backend: Backend) -> SessionStore:
    return backend.store


def _turn(content: str, *, role: str = "user", tokens: int = 1, **extra: Any) -> SessionTurn:
    return SessionTurn(role=role, content=content, tokens=tokens, **extra)


def _append(store: SessionStore, key: SessionKey, *contents: str, now: datetime = T0, **kw: Any) -> Any:
    limits = kw.pop("limits", LIMITS)
    return store.append(key, [_turn(text, **kw) for text in contents], now=now, limits=limits)


def _contents(store: SessionStore, key: SessionKey, now: datetime = T0) -> list[str]:
    return [turn.content for turn in store.read(key, now=now)[1]]


def _info(store: SessionStore, key: SessionKey, now: datetime = T0) -> SessionInfo:
    info = store.read(key, now=now)[0]
    assert info is not None
    return info


# -- append and read ------------------------------------------------------------------------


def test_append_numbers_turns_in_order(session_store: SessionStore) -> None:
    first = _append(session_store, KEY, "one", "two", tokens=2)
    later = T0 + timedelta(seconds=5)
    second = _append(session_store, KEY, "three", "four", "five", tokens=3, now=later)
    assert [turn.seq for turn in first.turns] == [1, 2]
    assert [turn.seq for turn in second.turns] == [3, 4, 5]
    info, turns = session_store.read(KEY, now=later)
    assert [(turn.seq, turn.content) for turn in turns] == list(
        enumerate(["one", "two", "three", "four", "five"], start=1)
    )
    assert all(turn.role == "user" and not turn.summary for turn in turns)
    assert [turn.created_at for turn in turns] == [T0, T0, later, later, later]
    assert info is not None and info == second.info
    assert (info.key, info.turn_count, info.token_count, info.compressions) == (KEY, 5, 13, 0)
    assert (info.created_at, info.updated_at) == (T0, later)
    assert info.expires_at == later + timedelta(seconds=TTL)
    assert info.summary_seq is None and info.epoch == first.info.epoch


def test_a_missing_session_reads_as_nothing(session_store: SessionStore) -> None:
    assert session_store.read(KEY, now=T0) == (None, [])
    _append(session_store, KEY, "hello")
    assert session_store.read(SessionKey("alice", "chat-2", "helper", "acme"), now=T0) == (None, [])


# -- caps ----------------------------------------------------------------------------------


def test_the_turn_cap_refuses_the_whole_append(session_store: SessionStore) -> None:
    limits = SessionLimits(max_stored_turns=3, max_sessions_per_user=5, ttl_seconds=TTL)
    _append(session_store, KEY, "a", "b", limits=limits)
    with pytest.raises(SessionLimitError) as refused:
        _append(session_store, KEY, "c", "d", limits=limits)
    assert refused.value.kind == "turns"
    assert _contents(session_store, KEY) == ["a", "b"]
    assert _info(session_store, KEY).turn_count == 2
    assert [turn.seq for turn in _append(session_store, KEY, "c", limits=limits).turns] == [3]

    fresh = SessionKey("alice", "chat-2", "helper", "acme")
    with pytest.raises(SessionLimitError):
        _append(session_store, fresh, "1", "2", "3", "4", limits=limits)
    assert session_store.read(fresh, now=T0) == (None, [])
    assert [info.key for info in session_store.list_sessions("acme", "alice", now=T0)] == [KEY]


def test_the_session_cap_counts_live_sessions_of_the_user(session_store: SessionStore) -> None:
    limits = SessionLimits(max_stored_turns=10, max_sessions_per_user=2, ttl_seconds=60)
    one, two, three = (SessionKey("alice", f"s{n}", None, "acme") for n in range(3))
    _append(session_store, one, "x", limits=limits)
    _append(session_store, two, "x", limits=limits, now=T0 + timedelta(seconds=30))
    with pytest.raises(SessionLimitError) as refused:
        _append(session_store, three, "x", limits=limits)
    assert refused.value.kind == "sessions"
    assert session_store.read(three, now=T0) == (None, [])
    _append(session_store, one, "more", limits=limits)  # an existing session still takes turns
    _append(session_store, SessionKey("bob", "s2", None, "acme"), "x", limits=limits)  # another user
    _append(session_store, SessionKey("alice", "s2", None, "other"), "x", limits=limits)  # another tenant
    assert session_store.clear(two)
    half = T0 + timedelta(seconds=30)
    _append(session_store, three, "x", limits=limits, now=half)  # clearing one freed its place
    with pytest.raises(SessionLimitError):
        _append(session_store, two, "x", limits=limits, now=half)
    # Once ``one`` has expired (60 s after its last turn), it no longer counts.
    later = T0 + timedelta(seconds=61)
    _append(session_store, two, "x", limits=limits, now=later)
    assert {info.key for info in session_store.list_sessions("acme", "alice", now=later)} == {two, three}


# -- expiry -------------------------------------------------------------------------------


def test_a_session_expires_ttl_after_its_last_turn(session_store: SessionStore) -> None:
    limits = SessionLimits(max_stored_turns=10, max_sessions_per_user=5, ttl_seconds=60)
    first = _append(session_store, KEY, "old", limits=limits)
    _append(session_store, KEY, "older", limits=limits, now=T0 + timedelta(seconds=30))
    assert _contents(session_store, KEY, T0 + timedelta(seconds=89)) == ["old", "older"]
    gone = T0 + timedelta(seconds=90)
    assert session_store.read(KEY, now=gone) == (None, [])
    assert session_store.list_sessions("acme", "alice", now=gone) == []

    restarted = _append(session_store, KEY, "new", limits=limits, now=gone + timedelta(seconds=1))
    assert [turn.seq for turn in restarted.turns] == [1]
    assert restarted.info.epoch != first.info.epoch
    fresh = restarted.info
    assert (fresh.turn_count, fresh.compressions, fresh.summary_seq) == (1, 0, None)
    assert restarted.info.created_at == gone + timedelta(seconds=1)
    assert _contents(session_store, KEY, gone + timedelta(seconds=2)) == ["new"]


def test_expire_deletes_exactly_the_expired_sessions(session_store: SessionStore) -> None:
    limits = SessionLimits(max_stored_turns=10, max_sessions_per_user=5, ttl_seconds=60)
    other = SessionKey("bob", "s2", None, "globex")
    _append(session_store, KEY, "old", limits=limits)
    _append(session_store, other, "recent", limits=limits, now=T0 + timedelta(seconds=50))
    removed = session_store.expire(T0 + timedelta(seconds=70))
    # Redis expires keys on its own clock, so its expire() has nothing left to do.
    assert removed in (0, 1) and (removed == 1 or type(session_store).__name__ == "RedisSessionStore")
    assert session_store.read(KEY, now=T0 + timedelta(seconds=70)) == (None, [])
    assert _contents(session_store, other, T0 + timedelta(seconds=70)) == ["recent"]


# -- compression --------------------------------------------------------------------------


def test_compress_puts_the_summary_first_and_recounts(session_store: SessionStore) -> None:
    for index in range(1, 6):
        session_store.append(KEY, [_turn(f"t{index}", tokens=index)], now=T0, limits=LIMITS)
    epoch = _info(session_store, KEY).epoch
    later = T0 + timedelta(seconds=10)
    summary = _turn("summary of 1-3", role="system", tokens=7)
    assert session_store.compress(KEY, epoch=epoch, upto_seq=3, summary=summary, now=later)
    info, turns = session_store.read(KEY, now=later)
    assert [(turn.seq, turn.content, turn.summary) for turn in turns] == [
        (3, "summary of 1-3", True),
        (4, "t4", False),
        (5, "t5", False),
    ]
    assert (turns[0].role, turns[0].tokens, turns[0].created_at) == ("system", 7, later)
    assert info is not None
    assert (info.turn_count, info.token_count, info.compressions, info.summary_seq) == (2, 9, 1, 3)

    assert [turn.seq for turn in _append(session_store, KEY, "t6", tokens=6).turns] == [6]  # never reused
    summary = _turn("summary of 1-5", role="system", tokens=4)
    assert session_store.compress(KEY, epoch=epoch, upto_seq=5, summary=summary, now=later)
    info, turns = session_store.read(KEY, now=later)
    assert [(turn.seq, turn.content, turn.summary) for turn in turns] == [
        (5, "summary of 1-5", True),
        (6, "t6", False),
    ]
    assert info is not None
    assert (info.turn_count, info.token_count, info.compressions, info.summary_seq) == (1, 6, 2, 5)


def test_compressing_everything_leaves_only_the_summary(session_store: SessionStore) -> None:
    _append(session_store, KEY, "a", "b")
    epoch = _info(session_store, KEY).epoch
    summary = _turn("ab", role="system")
    assert session_store.compress(KEY, epoch=epoch, upto_seq=2, summary=summary, now=T0)
    info, turns = session_store.read(KEY, now=T0)
    assert [(turn.seq, turn.content, turn.summary) for turn in turns] == [(2, "ab", True)]
    assert info is not None and (info.turn_count, info.token_count) == (0, 0)


def test_a_stale_or_repeated_compression_changes_nothing(session_store: SessionStore) -> None:
    _append(session_store, KEY, "a", "b", "c", "d")
    epoch = _info(session_store, KEY).epoch
    summary = _turn("s", role="system")
    before = session_store.read(KEY, now=T0)
    assert not session_store.compress(KEY, epoch="not-the-epoch", upto_seq=2, summary=summary, now=T0)
    assert session_store.read(KEY, now=T0) == before

    assert session_store.compress(KEY, epoch=epoch, upto_seq=3, summary=summary, now=T0)
    compressed = session_store.read(KEY, now=T0)
    for upto in (3, 2):  # already compressed up to 3
        assert not session_store.compress(KEY, epoch=epoch, upto_seq=upto, summary=_turn("x"), now=T0)
    assert session_store.read(KEY, now=T0) == compressed

    assert session_store.clear(KEY)
    assert not session_store.compress(KEY, epoch=epoch, upto_seq=4, summary=summary, now=T0)
    assert session_store.read(KEY, now=T0) == (None, [])  # not brought back

    # Started again: a compression planned on the old epoch must not touch the new turns.
    _append(session_store, KEY, "n1", "n2", "n3", "n4", "n5")
    assert not session_store.compress(KEY, epoch=epoch, upto_seq=4, summary=summary, now=T0)
    assert _contents(session_store, KEY) == ["n1", "n2", "n3", "n4", "n5"]

    gone = T0 + timedelta(seconds=TTL)  # expired: nothing to compress
    fresh = _info(session_store, KEY).epoch
    assert not session_store.compress(KEY, epoch=fresh, upto_seq=4, summary=summary, now=gone)
    assert session_store.read(KEY, now=gone) == (None, [])


# -- clear, list, erase -------------------------------------------------------------------


def test_clear_deletes_only_that_session(session_store: SessionStore) -> None:
    other = SessionKey("alice", "chat-2", "helper", "acme")
    first = _append(session_store, KEY, "a", "b")
    _append(session_store, other, "keep")
    assert session_store.clear(KEY)
    assert not session_store.clear(KEY)
    assert not session_store.clear(SessionKey("nobody", "x"))
    assert session_store.read(KEY, now=T0) == (None, [])
    assert [info.key for info in session_store.list_sessions("acme", "alice", now=T0)] == [other]
    assert _contents(session_store, other) == ["keep"]
    again = _append(session_store, KEY, "c")
    assert [turn.seq for turn in again.turns] == [1] and again.info.epoch != first.info.epoch


def test_list_sessions_most_recent_first_with_paging(session_store: SessionStore) -> None:
    keys = [SessionKey("alice", f"s{n}", "helper", "acme") for n in range(4)]
    for n, key in enumerate(keys):
        _append(session_store, key, f"in s{n}", now=T0 + timedelta(seconds=n))
    _append(session_store, keys[1], "again", now=T0 + timedelta(seconds=10))
    now = T0 + timedelta(seconds=20)
    expected = [keys[1], keys[3], keys[2], keys[0]]
    listed = session_store.list_sessions("acme", "alice", now=now)
    assert [info.key for info in listed] == expected
    assert [info.updated_at for info in listed] == [T0 + timedelta(seconds=s) for s in (10, 3, 2, 0)]
    assert listed[0].turn_count == 2
    first_page = session_store.list_sessions("acme", "alice", now=now, limit=2)
    assert [info.key for info in first_page] == expected[:2]
    paged = session_store.list_sessions("acme", "alice", now=now, limit=2, offset=2)
    assert [info.key for info in paged] == expected[2:]
    assert session_store.list_sessions("acme", "alice", now=now, offset=4) == []


def test_sessions_are_isolated_by_tenant_user_and_agent(session_store: SessionStore) -> None:
    keys = [
        SessionKey("alice", "chat", None, "acme"),
        SessionKey("alice", "chat", "helper", "acme"),
        SessionKey("bob", "chat", None, "acme"),
        SessionKey("alice", "chat", None, "globex"),
        SessionKey(None, "chat", None, "acme"),
    ]
    for index, key in enumerate(keys):
        _append(session_store, key, f"turn of session {index}")
    for index, key in enumerate(keys):
        assert _contents(session_store, key) == [f"turn of session {index}"]
    alice = session_store.list_sessions("acme", "alice", now=T0)
    assert sorted((info.key.agent_name or "") for info in alice) == ["", "helper"]
    assert {info.key for info in alice} == set(keys[:2])
    assert [info.key for info in session_store.list_sessions("acme", "bob", now=T0)] == [keys[2]]
    assert [info.key for info in session_store.list_sessions("globex", "alice", now=T0)] == [keys[3]]
    assert [info.key for info in session_store.list_sessions("acme", None, now=T0)] == [keys[4]]
    assert session_store.list_sessions("globex", "bob", now=T0) == []


def test_erase_user_deletes_every_session_of_that_user_in_that_tenant(session_store: SessionStore) -> None:
    mine = [SessionKey("alice", "s1", None, "acme"), SessionKey("alice", "s2", "helper", "acme")]
    others = [
        SessionKey("alice", "s1", None, "globex"),
        SessionKey("bob", "s1", None, "acme"),
        SessionKey(None, "s1", None, "acme"),
    ]
    for key in [*mine, *others]:
        _append(session_store, key, "x")
    assert session_store.erase_user("acme", "alice") == 2
    for key in mine:
        assert session_store.read(key, now=T0) == (None, [])
    assert session_store.list_sessions("acme", "alice", now=T0) == []
    for key in others:
        assert _contents(session_store, key) == ["x"]
    assert session_store.erase_user("acme", "alice") == 0


# -- content fidelity ---------------------------------------------------------------------


def test_content_name_and_tool_calls_round_trip_exactly(session_store: SessionStore) -> None:
    tricky = (
        'Grüße 👋🏽 — 中文 עברית "quotes" \\back\\slash\n\ttab \u2028 \u200b e\u0301 '
        '{"json": [1, 2]} %s %% ${x} \U0001f9ea'
    )
    large = ("ø∑😀 long line\n" * 2700)[:32000]
    calls = [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "lookup", "arguments": '{"q": "Zürich 🏔"}'},
        },
        {"nested": {"list": [1, 2.5, True, None, "ü"], "deep": {"a": {"b": {"c": []}}}}},
    ]
    turns = [
        _turn(tricky, tokens=5),
        _turn("", role="assistant", tool_calls=calls, tokens=2),
        _turn(large, role="tool", name="lookup_tool", tokens=9000),
    ]
    session_store.append(KEY, turns, now=T0, limits=LIMITS)
    _, stored = session_store.read(KEY, now=T0)
    assert [turn.content.encode("utf-8") for turn in stored] == [t.content.encode("utf-8") for t in turns]
    assert [(turn.role, turn.name, turn.tool_calls, turn.tokens) for turn in stored] == [
        ("user", None, None, 5),
        ("assistant", None, calls, 2),
        ("tool", "lookup_tool", None, 9000),
    ]
    assert stored[1].as_message() == {"role": "assistant", "content": "", "tool_calls": calls}


# -- two writers and a compressor at once -------------------------------------------------


def _race_child(kind: str, url: str, prefix: str, who: str) -> None:
    store = open_store(kind, url, prefix)
    limits = SessionLimits(max_stored_turns=10 * RACE_TURNS, max_sessions_per_user=5, ttl_seconds=TTL)
    try:
        for index in range(RACE_TURNS):
            store.append(KEY, [_turn(f"{who}-{index:03d}")], now=T0, limits=limits)
    finally:
        store.close()


def _compress_all(store: SessionStore) -> bool:
    """Summarise every raw turn: the summary's content is the list of every content it covers."""
    info, turns = store.read(KEY, now=T0)
    raw = [turn for turn in turns if not turn.summary]
    if info is None or not raw:
        return False
    covered = json.loads(turns[0].content) if turns[0].summary else []
    content = json.dumps([*covered, *(turn.content for turn in raw)])
    summary = _turn(content, role="system", tokens=0)
    return store.compress(KEY, epoch=info.epoch, upto_seq=raw[-1].seq, summary=summary, now=T0)


# Every backend that two processes share (process memory is not one).
@pytest.mark.parametrize(
    "backend",
    [
        pytest.param("redis", id="redis", marks=pytest.mark.redis),
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres),
    ],
    indirect=True,
)
def test_concurrent_appends_and_compressions_lose_and_duplicate_nothing(backend: Backend) -> None:
    context = multiprocessing.get_context("spawn")
    children = [
        context.Process(target=_race_child, args=(backend.kind, backend.url, backend.prefix, who))
        for who in ("p0", "p1")
    ]
    for child in children:
        child.start()
    compressions = 0
    deadline = time.monotonic() + RACE_DEADLINE_SECONDS  # only a guard against hanging forever
    while any(child.is_alive() for child in children) and time.monotonic() < deadline:
        compressions += _compress_all(backend.store)
    for child in children:
        child.join(timeout=RACE_DEADLINE_SECONDS)
    assert [child.exitcode for child in children] == [0, 0]
    compressions += _compress_all(backend.store)

    info, turns = backend.store.read(KEY, now=T0)
    assert info is not None and compressions >= 1 and info.compressions == compressions
    assert turns[0].summary
    seen = [*json.loads(turns[0].content), *(turn.content for turn in turns[1:])]
    expected = [f"{who}-{index:03d}" for who in ("p0", "p1") for index in range(RACE_TURNS)]
    assert Counter(seen) == Counter(expected)  # every turn exactly once
    for who in ("p0", "p1"):
        assert [content for content in seen if content.startswith(who)] == sorted(
            content for content in expected if content.startswith(who)
        )
