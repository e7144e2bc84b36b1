"""``RedisSessionStore``: sessions in Redis, for gateways whose replicas share no database.

Every write is one Lua script, so Redis runs it atomically: an append checks the caps, allocates
its ``seq`` numbers and stores its turns in one step, and a compression removes exactly the turns
it summarised, so turns another replica appends meanwhile are neither lost nor summarised.

Layout, under ``<prefix>:{<tenant>:<user>}:`` (the *user base*):

- ``s:<agent>:<session>:meta``  hash: epoch, next_seq, turn_count, token_count, compressions,
  created_at, updated_at, expires_at, summary_seq, agent, session_id;
- ``s:<agent>:<session>:turns`` sorted set: one JSON turn per member, scored by its ``seq``;
- ``index``                    sorted set of the user's sessions (``<agent>:<session>``), scored by
  their ``expires_at``: counts the live sessions for the cap, lists them, finds them to erase.

Each component is encoded (``=`` + percent-encoding, ``-`` for ``None``), so no component holds a
``:`` and no two keys can collide, whatever the ids. The hash tag ``{<tenant>:<user>}`` puts all of
a user's keys (each session's meta and turns, and the index) in one Redis Cluster slot, so every
script touches a single slot. The erase script derives session keys from the index members instead
of receiving them in ``KEYS``; they share the tag, hence the slot, which Redis Cluster accepts.

Times come from the caller (``now``) and are stored as integer microseconds since the Unix epoch:
exact in a Lua number (below 2**53) and in a sorted-set score. Expiry is checked against them, and
each append also gives every key of the session a Redis TTL of ``ttl_seconds``, so Redis deletes
what nobody reads again; ``expire()`` has nothing left to do.

Every call goes through ``RedisClients.run`` (``redis_clients``): the sync client, or on the async
face the event loop's asyncio client, awaited so that the loop is never blocked.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote, urlsplit

import redis.exceptions

from memstore.errors import SessionStoreUnavailableError
from memstore.session import AppendResult, SessionInfo, SessionKey, SessionLimits, SessionTurn
from memstore.storage.sessions.contract import SessionStore, too_many_sessions, too_many_turns
from memstore.storage.sessions.redis_clients import RedisClients

SCAN_BATCH = 500
"""Keys per SCAN step and per DEL when ``erase_user`` sweeps the user's base."""
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_UNAVAILABLE = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.BusyLoadingError,
    # Past maxmemory (noeviction): the writes carry a shebang, so Redis refuses them whole.
    redis.exceptions.OutOfMemoryError,
)

# KEYS: meta, turns, index. ARGV: now, expires_at, ttl_ms, max_stored_turns, max_sessions, new epoch,
# index member, user base, tokens of the turns, agent, session_id, then one JSON turn (no seq) each.
_APPEND = """#!lua
local meta, turns, index = KEYS[1], KEYS[2], KEYS[3]
local now, ttl, n = tonumber(ARGV[1]), tonumber(ARGV[3]), #ARGV - 11
for _, member in ipairs(redis.call('ZRANGEBYSCORE', index, '-inf', ARGV[1])) do
  if redis.call('EXISTS', ARGV[8] .. 's:' .. member .. ':meta') == 0 then
    redis.call('ZREM', index, member)
  end
end
local expires = redis.call('HGET', meta, 'expires_at')
local live = expires and tonumber(expires) > now
local raw = n
if live then
  raw = raw + tonumber(redis.call('HGET', meta, 'turn_count'))
else
  local others = redis.call('ZCOUNT', index, '(' .. ARGV[1], '+inf')
  local own = redis.call('ZSCORE', index, ARGV[7])
  if own and tonumber(own) > now then others = others - 1 end
  if others >= tonumber(ARGV[5]) then return {'sessions'} end
end
if raw > tonumber(ARGV[4]) then return {'turns'} end
if not live then
  redis.call('DEL', meta, turns)
  redis.call('HSET', meta, 'epoch', ARGV[6], 'next_seq', 0, 'turn_count', 0, 'token_count', 0,
    'compressions', 0, 'created_at', ARGV[1], 'summary_seq', '', 'agent', ARGV[10], 'session_id', ARGV[11])
end
local first = redis.call('HINCRBY', meta, 'next_seq', n) - n + 1
for i = 1, n do
  local seq = first + i - 1
  redis.call('ZADD', turns, seq, '{"seq":' .. seq .. ',' .. string.sub(ARGV[11 + i], 2))
end
redis.call('HINCRBY', meta, 'turn_count', n)
redis.call('HINCRBY', meta, 'token_count', ARGV[9])
redis.call('HSET', meta, 'updated_at', ARGV[1], 'expires_at', ARGV[2])
redis.call('PEXPIRE', meta, ttl)
redis.call('PEXPIRE', turns, ttl)
redis.call('ZADD', index, ARGV[2], ARGV[7])
if redis.call('PTTL', index) < ttl then redis.call('PEXPIRE', index, ttl) end
return {first, redis.call('HGETALL', meta)}
"""

# KEYS: meta, turns. ARGV: now, epoch, upto_seq, the summary as JSON (no seq).
_COMPRESS = """#!lua
local meta, turns = KEYS[1], KEYS[2]
local f = redis.call('HMGET', meta, 'expires_at', 'epoch', 'summary_seq')
if not f[1] or tonumber(f[1]) <= tonumber(ARGV[1]) or f[2] ~= ARGV[2] then return 0 end
local upto = tonumber(ARGV[3])
if f[3] and f[3] ~= '' and tonumber(f[3]) >= upto then return 0 end
local pttl = redis.call('PTTL', meta)
redis.call('ZREMRANGEBYSCORE', turns, '-inf', ARGV[3])
local count, tokens = 0, 0
for _, member in ipairs(redis.call('ZRANGE', turns, 0, -1)) do
  count = count + 1
  tokens = tokens + cjson.decode(member)['tokens']
end
redis.call('ZADD', turns, ARGV[3], '{"seq":' .. ARGV[3] .. ',' .. string.sub(ARGV[4], 2))
if pttl > 0 then redis.call('PEXPIRE', turns, pttl) end
redis.call('HSET', meta, 'turn_count', count, 'token_count', tokens, 'summary_seq', ARGV[3])
redis.call('HINCRBY', meta, 'compressions', 1)
return 1
"""

# KEYS: meta, turns, index. ARGV: index member.
_CLEAR = """
local existed = redis.call('DEL', KEYS[1])
redis.call('DEL', KEYS[2])
redis.call('ZREM', KEYS[3], ARGV[1])
return existed
"""

# KEYS: index. ARGV: user base. Every session of the user is in the index (an append adds it in
# the same script that creates it, and only a session whose keys are gone leaves it).
_ERASE = """
local erased = 0
for _, member in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local session = ARGV[1] .. 's:' .. member
  erased = erased + redis.call('DEL', session .. ':meta')
  redis.call('DEL', session .. ':turns')
end
redis.call('DEL', KEYS[1])
return erased
"""


def _glob_literal(text: str) -> str:
    """``text`` as a SCAN pattern that matches only itself (``*?[]\\`` escaped)."""
    return "".join(f"\\{char}" if char in "*?[]\\" else char for char in text)


def masked_url(url: str) -> str:
    """``url`` with its password (in the authority or a ``password=`` query) shown as ``***``."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return "<unparsable Redis URL>"
    masked = url
    if password:
        masked = masked.replace(f":{password}@", ":***@", 1)
    if "password=" in parts.query:
        query = "&".join(
            "password=***" if item.startswith("password=") else item for item in parts.query.split("&")
        )
        masked = masked.replace(parts.query, query, 1)
    return masked


def _secrets_of(url: str) -> list[str]:
    """The passwords ``url`` carries, to scrub from any message that might echo them."""
    try:
        parts = urlsplit(url)
        found = [parts.password or ""]
    except ValueError:
        return []
    found += [item.partition("=")[2] for item in parts.query.split("&") if item.startswith("password=")]
    return [secret for secret in found if secret]


def _part(value: str | None) -> str:
    """One key component: ``None`` is ``-``, a value ``=`` + its percent-encoding (never ``:``)."""
    return "-" if value is None else "=" + quote(value, safe="")


def _micros(moment: datetime) -> int:
    """Microseconds since the epoch; a naive ``moment`` is taken as UTC."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - _EPOCH) // timedelta(microseconds=1)


def _moment(micros: str | int) -> datetime:
    return _EPOCH + timedelta(microseconds=int(micros))


def _turn_json(turn: SessionTurn, *, created_at: int, summary: bool) -> str:
    """The turn as stored, without ``seq``: the script writes ``{"seq":N,`` in front of it."""
    body = {
        "role": turn.role,
        "content": turn.content,
        "name": turn.name,
        "tool_calls": turn.tool_calls,
        "created_at": created_at,
        "tokens": int(turn.tokens),
        "summary": summary,
    }
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _turn(member: str) -> SessionTurn:
    data = json.loads(member)
    return SessionTurn(
        role=data["role"],
        content=data["content"],
        name=data["name"],
        tool_calls=data["tool_calls"],
        seq=int(data["seq"]),
        created_at=_moment(data["created_at"]),
        tokens=int(data["tokens"]),
        summary=bool(data["summary"]),
    )


def _flat_hash(values: Sequence[Any]) -> dict[str, str]:
    """A Lua script's ``HGETALL`` reply (``[field, value, ...]``) as a dict."""
    return {str(values[i]): str(values[i + 1]) for i in range(0, len(values), 2)}


def _info(key: SessionKey, meta: dict[str, str]) -> SessionInfo:
    summary_seq = meta.get("summary_seq", "")
    return SessionInfo(
        key=key,
        turn_count=int(meta["turn_count"]),
        token_count=int(meta["token_count"]),
        compressions=int(meta["compressions"]),
        created_at=_moment(meta["created_at"]),
        updated_at=_moment(meta["updated_at"]),
        expires_at=_moment(meta["expires_at"]),
        epoch=meta["epoch"],
        summary_seq=int(summary_seq) if summary_seq else None,
    )


class RedisSessionStore(SessionStore):
    """Sessions of every tenant in one Redis database, under ``key_prefix``."""

    def __init__(self, url: str, *, key_prefix: str = "memstore") -> None:
        if not key_prefix or any(char in key_prefix for char in "{}"):
            raise ValueError("key_prefix must be non-empty and hold no { or } (they pick the hash slot)")
        self.key_prefix = key_prefix
        self._masked = masked_url(url)
        self._secrets = _secrets_of(url)
        self._clients = RedisClients(
            url, {"append": _APPEND, "compress": _COMPRESS, "clear": _CLEAR, "erase": _ERASE}
        )

    # -- keys --------------------------------------------------------------------------------

    def user_base(self, tenant_id: str, user_id: str | None) -> str:
        """The start of every key of the user's sessions, hash tag included."""
        return f"{self.key_prefix}:{{{_part(tenant_id)}:{_part(user_id)}}}:"

    @staticmethod
    def _member(key: SessionKey) -> str:
        return f"{_part(key.agent_name)}:{_part(key.session_id)}"

    def _keys(self, key: SessionKey) -> tuple[str, str, str]:
        """The session's meta and turns keys and its user's index."""
        base = self.user_base(key.tenant_id, key.user_id)
        session = f"{base}s:{self._member(key)}"
        return f"{session}:meta", f"{session}:turns", f"{base}index"

    @contextmanager
    def _answering(self) -> Iterator[None]:
        try:
            yield
        except _UNAVAILABLE as exc:
            detail = str(exc) or type(exc).__name__
            for secret in self._secrets:
                detail = detail.replace(secret, "***")
            raise SessionStoreUnavailableError(
                f"the Redis session store at {self._masked} did not answer: {detail}"
            ) from None

    # -- the contract ------------------------------------------------------------------------

    def append(
        self, key: SessionKey, turns: Sequence[SessionTurn], *, now: datetime, limits: SessionLimits
    ) -> AppendResult:
        now_us = _micros(now)
        expires_us = _micros(now + timedelta(seconds=limits.ttl_seconds))
        ttl_ms = max(1, math.ceil(limits.ttl_seconds * 1000))
        meta, stored, index = self._keys(key)
        args: list[str | int] = [
            now_us,
            expires_us,
            ttl_ms,
            limits.max_stored_turns,
            limits.max_sessions_per_user,
            uuid.uuid4().hex[:16],
            self._member(key),
            self.user_base(key.tenant_id, key.user_id),
            sum(int(turn.tokens) for turn in turns),
            key.agent_name or "",
            key.session_id,
            *(_turn_json(turn, created_at=now_us, summary=False) for turn in turns),
        ]
        with self._answering():
            reply = self._clients.run(
                lambda link: link.script("append", keys=[meta, stored, index], args=args)
            )
        if reply[0] == "sessions":
            raise too_many_sessions(limits)
        if reply[0] == "turns":
            raise too_many_turns(limits)
        first = int(reply[0])
        created = _moment(now_us)
        appended = [
            SessionTurn(
                role=turn.role,
                content=turn.content,
                name=turn.name,
                tool_calls=turn.tool_calls,
                seq=first + offset,
                created_at=created,
                tokens=int(turn.tokens),
            )
            for offset, turn in enumerate(turns)
        ]
        return AppendResult(_info(key, _flat_hash(reply[1])), appended)

    def read(self, key: SessionKey, *, now: datetime) -> tuple[SessionInfo | None, list[SessionTurn]]:
        meta_key, turns_key, _ = self._keys(key)
        both = [("hgetall", meta_key), ("zrange", turns_key, 0, -1)]
        with self._answering():  # MULTI/EXEC: meta and turns of one moment
            meta, members = self._clients.run(lambda link: link.pipelined(both, transaction=True))
        if not meta or int(meta["expires_at"]) <= _micros(now):
            return None, []
        return _info(key, meta), [_turn(member) for member in members]

    def compress(
        self, key: SessionKey, *, epoch: str, upto_seq: int, summary: SessionTurn, now: datetime
    ) -> bool:
        meta, stored, _ = self._keys(key)
        now_us = _micros(now)
        body = _turn_json(summary, created_at=now_us, summary=True)
        with self._answering():
            done = self._clients.run(
                lambda link: link.script(
                    "compress", keys=[meta, stored], args=[now_us, epoch, int(upto_seq), body]
                )
            )
        return bool(done)

    def clear(self, key: SessionKey) -> bool:
        meta, stored, index = self._keys(key)
        with self._answering():
            existed = self._clients.run(
                lambda link: link.script("clear", keys=[meta, stored, index], args=[self._member(key)])
            )
        return bool(existed)

    def list_sessions(
        self, tenant_id: str, user_id: str | None, *, now: datetime, limit: int = 100, offset: int = 0
    ) -> list[SessionInfo]:
        """Read every live session of the user (at most ``max_sessions_per_user``) and sort them
        here, with the same tie-break as the other backends (``updated_at``, then session id)."""
        base = self.user_base(tenant_id, user_id)
        now_us = _micros(now)
        with self._answering():
            live = self._clients.run(
                lambda link: link.client.zrangebyscore(f"{base}index", f"({now_us}", "+inf")
            )
            reads = [("hgetall", f"{base}s:{member}:meta") for member in live]
            metas: list[dict[str, str]] = (
                self._clients.run(lambda link: link.pipelined(reads)) if reads else []
            )
        infos = [
            _info(SessionKey(user_id, meta["session_id"], meta["agent"] or None, tenant_id), meta)
            for meta in metas
            if meta and int(meta["expires_at"]) > now_us
        ]
        infos.sort(key=lambda info: (info.updated_at, info.key.session_id), reverse=True)
        return infos[offset : offset + limit]

    def erase_user(self, tenant_id: str, user_id: str) -> int:
        """Every session in the user's index, then any key left under the user's base that the
        index no longer names (an eviction policy may have dropped the index alone)."""
        base = self.user_base(tenant_id, user_id)
        pattern = _glob_literal(base) + "*"
        with self._answering():
            erased = int(
                self._clients.run(lambda link: link.script("erase", keys=[f"{base}index"], args=[base]))
            )
            names = self._clients.run(lambda link: link.client.scan_iter(match=pattern, count=SCAN_BATCH))
            deletes = [
                ("delete", *names[start : start + SCAN_BATCH]) for start in range(0, len(names), SCAN_BATCH)
            ]
            if deletes:
                self._clients.run(lambda link: link.pipelined(deletes))
        return erased + sum(1 for name in names if str(name).endswith(":meta"))

    def expire(self, now: datetime) -> int:
        """Nothing to do: every key carries a Redis TTL, and appends prune the index of the
        sessions Redis has expired. Returns 0."""
        return 0

    def close(self) -> None:
        """Close the sync client; an event loop's client is closed by ``memstore.aio.aclose()``."""
        self._clients.close()
