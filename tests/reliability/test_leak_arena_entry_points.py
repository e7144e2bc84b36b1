"""The leak arena through every entry point: the storage arena's canaries and identities
(``test_leak_arena``), read back through what an application calls, not the provider.

Two sets of canaries are seeded, one in the users' own scope (no agent: what the HTTP router,
MCP and DeerFlow's default bucket serve) and one in the agent ``helper``'s. Each identity then
reads through the middleware's ``memory_context`` (with and without a query), the fact helpers,
the async face (``amemory_context``, ``memstore.aio`` and its queries, on one event loop),
``memstore.queries`` (list, search in every mode, history, scopes), tool mode, the HTTP router
(bare, and as ``memstore serve`` builds it from its headers), the MCP tools over the SDK's
in-memory client, the DeerFlow adapters and the export. A path that merges must show exactly the
canaries the identity may read (its own, shared with its user or a role, shared to ``admin``,
public in its tenant), a path of the own document exactly its own, and none may show a canary
the identity may not read. Last, a queued conversation of one identity is invisible to every
other, in the queue table and after the worker saved it.

SQLite, PostgreSQL as a superuser (memstore's predicates) and PostgreSQL as an application role
that row-level security binds (the predicates and the policies).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient
from mcp import Client
from sqlalchemy import select, text

from memstore import aio
from memstore.aio import queries as async_queries
from memstore.cli.serve_app import create_app, header_roles, header_tenant, header_user
from memstore.config import MemoryConfig
from memstore.gateway import tools
from memstore.gateway.middleware import MemoryMiddleware
from memstore.integrations.deerflow import DeerMemStore, SeedStore
from memstore.integrations.fastapi import create_memory_router
from memstore.integrations.mcp import create_mcp_server, fixed_identity
from memstore.ops import sessions
from memstore.ops.embeddings import embed_facts
from memstore.ops.facts import get_memory_data, reload_memory_data, search_memory_facts
from memstore.ops.transfer import export_scopes
from memstore.queries import FactFilter, list_facts, list_scopes, memory_history, search_facts
from memstore.queue import get_memory_queue, reset_memory_queue
from memstore.scope import Identity
from memstore.storage.loader import get_memory_storage, reset_memory_storage
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import get_engine
from memstore.storage.sql.identity import policies_apply, transaction
from memstore.storage.sql.schema.models import queue_table
from tests.reliability.test_leak_arena import AGENT, IDENTITIES, Canary, _canaries, _may_read, seed
from tests.support.app_role import app_role_url
from tests.support.openai_server import OpenAIStubServer
from tests.support.semantic import MODEL

DEERMEM_DEFAULT_BUCKET = "__default__"


@dataclass(frozen=True)
class Arena:
    url: str
    """What every entry point reads through (the application role on ``postgresql-app-role``)."""
    owner_url: str
    """The database's owner: embeds every tenant's facts and reads the queue table unfiltered."""
    app_role: bool


@pytest.fixture(params=["sqlite", "postgresql", "postgresql-app-role"])
def arena(request: pytest.FixtureRequest) -> Iterator[Arena]:
    if request.param == "sqlite":
        url = str(request.getfixturevalue("sqlite_url"))
        yield Arena(url, url, app_role=False)
        return
    request.applymarker(pytest.mark.postgres)
    owner_url = str(request.getfixturevalue("postgres_url"))
    if request.param == "postgresql":
        yield Arena(owner_url, owner_url, app_role=False)
        return
    with app_role_url(owner_url, "memstore_entry") as app_url:
        try:
            yield Arena(app_url, owner_url, app_role=True)
        finally:
            reset_memory_queue()
            reset_memory_storage()


@pytest.fixture
def configured(
    arena: Arena, isolated_config: MemoryConfig, openai_server: OpenAIStubServer
) -> Iterator[MemoryConfig]:
    """The process-wide config on the arena's database, with embeddings (so search by meaning and
    ranked injection run) and a durable queue nobody drains unless the test flushes it."""
    isolated_config.database_url = arena.url
    isolated_config.operator_database_url = arena.owner_url if arena.app_role else None
    # Every read must answer: a loaded machine's slow first read on a new loop is not a leak.
    isolated_config.memory_context_timeout_seconds = 30
    isolated_config.embedding_model = MODEL
    isolated_config.embedding_base_url = openai_server.base_url
    isolated_config.embedding_provider = "openai"
    isolated_config.extractor = "rules"
    isolated_config.queue_workers = 0
    reset_memory_storage()
    reset_memory_queue()
    yield isolated_config
    reset_memory_queue()
    reset_memory_storage()


# -- seeding --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Seeded:
    own_scope: list[Canary]
    """Seeded into the owners' scopes without an agent."""
    helper: list[Canary]
    """Seeded into the agent ``helper``'s scopes."""

    @property
    def every(self) -> list[Canary]:
        return self.own_scope + self.helper


@pytest.fixture
def seeded(arena: Arena, configured: MemoryConfig) -> Seeded:
    seeded = Seeded(_canaries(), _canaries())
    seed(arena.url, seeded.own_scope, None)
    seed(arena.url, seeded.helper, AGENT)
    owner = SqlMemoryStorage(arena.owner_url)
    try:
        assert embed_facts(config=configured, storage=owner) == len(seeded.every)
    finally:
        owner.close()
    return seeded


# -- the entry points -------------------------------------------------------------------------------

MERGED, OWN, NO_LEAK = "merged", "own", "no leak"
"""What a path must show: exactly the readable canaries; exactly the own ones; the own ones and no
other it may not read (a path that does not merge: search by meaning ranks the own facts only)."""

Read = Callable[[Identity], object]


@dataclass(frozen=True)
class EntryPoint:
    name: str
    rule: str
    agents: tuple[str | None, ...]
    read: Read


def _scope(identity: Identity) -> dict[str, Any]:
    return {"user_id": identity.user_id, "tenant_id": identity.tenant_id, "roles": identity.roles}


def _mine(identity: Identity) -> FactFilter:
    return FactFilter(user_id=identity.user_id)


def _library_paths() -> list[EntryPoint]:
    """The Python entry points: middleware, fact helpers, ``memstore.queries``, tool mode."""
    both = (None, AGENT)

    def context(agent: str | None, query: str | None) -> Read:
        return lambda who: MemoryMiddleware(agent).memory_context(query=query, **_scope(who))

    def helper_search(agent: str | None, mode: Any) -> Read:
        return lambda who: search_memory_facts(
            "canary", None, 100, agent_name=agent, mode=mode, **_scope(who)
        )

    def query_search(mode: Any) -> Read:
        return lambda who: search_facts("canary", _mine(who), mode=mode, limit=100, **_tenant(who)).facts

    def tool_search(mode: Any) -> Read:
        return lambda who: _tool(
            tools.memory_search("canary", limit=100, agent_name=AGENT, mode=mode, **_scope(who))
        )

    def tool_context(query: str) -> Read:
        return lambda who: _tool(tools.memory_context(query, agent_name=AGENT, **_scope(who)))

    return [
        EntryPoint("middleware memory_context", MERGED, (AGENT,), context(AGENT, None)),
        EntryPoint("middleware memory_context query", MERGED, (AGENT,), context(AGENT, "canary")),
        EntryPoint("middleware memory_context no agent", MERGED, (None,), context(None, "canary")),
        EntryPoint("search_memory_facts fulltext", MERGED, (AGENT,), helper_search(AGENT, "fulltext")),
        EntryPoint("search_memory_facts fulltext no agent", MERGED, (None,), helper_search(None, "fulltext")),
        # By meaning, the helper ranks the user's own facts only (fact_search._shared_matches).
        EntryPoint("search_memory_facts semantic", NO_LEAK, (AGENT,), helper_search(AGENT, "semantic")),
        EntryPoint("search_memory_facts hybrid", NO_LEAK, (AGENT,), helper_search(AGENT, "hybrid")),
        EntryPoint("get_memory_data", OWN, (AGENT,), lambda who: get_memory_data(AGENT, **_scope(who))),
        EntryPoint("reload_memory_data", OWN, (None,), lambda who: reload_memory_data(None, **_scope(who))),
        EntryPoint(
            "queries.list_facts",
            MERGED,
            both,
            lambda who: list_facts(_mine(who), limit=1000, **_tenant(who)).facts,
        ),
        EntryPoint("queries.search_facts fulltext", MERGED, both, query_search("fulltext")),
        EntryPoint("queries.search_facts semantic", MERGED, both, query_search("semantic")),
        EntryPoint("queries.search_facts hybrid", MERGED, both, query_search("hybrid")),
        # History is the owner's alone: a shared fact's earlier text may predate its sharing.
        EntryPoint(
            "queries.memory_history",
            OWN,
            both,
            lambda who: memory_history(_mine(who), limit=1000, **_tenant(who)),
        ),
        EntryPoint("tools.memory_search fulltext", MERGED, (AGENT,), tool_search("fulltext")),
        EntryPoint("tools.memory_search default (hybrid)", NO_LEAK, (AGENT,), tool_search(None)),
        EntryPoint("tools.memory_context", MERGED, (AGENT,), tool_context("")),
        EntryPoint("tools.memory_context query", MERGED, (AGENT,), tool_context("canary")),
    ]


def _async_paths(runner: asyncio.Runner) -> list[EntryPoint]:
    """The async face (``memstore.aio``, ``MemoryMiddleware.a*``) on one event loop: the same core,
    reached through the async drivers and the async embeddings client."""
    both = (None, AGENT)

    def context(agent: str | None, query: str | None) -> Read:
        return lambda who: runner.run(MemoryMiddleware(agent).amemory_context(query=query, **_scope(who)))

    def query_search(mode: Any) -> Read:
        return lambda who: (
            runner.run(
                async_queries.search_facts("canary", _mine(who), mode=mode, limit=100, **_tenant(who))
            ).facts
        )

    return [
        EntryPoint("async amemory_context", MERGED, (AGENT,), context(AGENT, None)),
        EntryPoint("async amemory_context query", MERGED, (None,), context(None, "canary")),
        EntryPoint(
            "async search_memory_facts fulltext",
            MERGED,
            (AGENT,),
            lambda who: runner.run(
                aio.search_memory_facts("canary", None, 100, agent_name=AGENT, **_scope(who))
            ),
        ),
        EntryPoint(
            "async get_memory_data",
            OWN,
            (AGENT,),
            lambda who: runner.run(aio.get_memory_data(AGENT, **_scope(who))),
        ),
        EntryPoint(
            "async queries.list_facts",
            MERGED,
            both,
            lambda who: runner.run(async_queries.list_facts(_mine(who), limit=1000, **_tenant(who))).facts,
        ),
        EntryPoint("async queries.search_facts hybrid", MERGED, both, query_search("hybrid")),
        EntryPoint(
            "async queries.memory_history",
            OWN,
            both,
            lambda who: runner.run(async_queries.memory_history(_mine(who), limit=1000, **_tenant(who))),
        ),
    ]


def _tenant(identity: Identity) -> dict[str, Any]:
    return {"tenant_id": identity.tenant_id, "roles": identity.roles}


def _tool(answer: str) -> object:
    payload = json.loads(answer)
    assert "error" not in payload, payload
    return payload


def _http_app() -> FastAPI:
    """The router with the tenant and roles from headers, as a gateway behind its auth would."""

    def user(request: Request) -> str:
        return request.headers["X-User"]

    def tenant(request: Request) -> str:
        return request.headers["X-Tenant"]

    def roles(request: Request) -> list[str]:
        return [role for role in request.headers.get("X-Roles", "").split(",") if role]

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        await aio.aclose()  # as a gateway's shutdown does: the loop's clients and pools

    app = FastAPI(lifespan=lifespan)
    app.include_router(create_memory_router(user, current_tenant_id=tenant, current_roles=roles))
    return app


def _serve_app() -> FastAPI:
    """``memstore serve``'s app, with its user, tenant and roles headers."""
    return create_app(
        header_user("X-User"),
        allowed_hosts=["testserver"],
        max_body_bytes=1 << 20,
        tenant=header_tenant("X-Tenant"),
        roles=header_roles("X-Roles"),
    )


def _http_paths(client: TestClient, app: str) -> list[EntryPoint]:
    def get(path: str, method: str = "GET") -> Read:
        def read(who: Identity) -> object:
            headers = {"X-User": who.user_id or "", "X-Tenant": who.tenant_id}
            if who.roles:
                headers["X-Roles"] = who.roles_setting
            response = client.request(method, f"/api/memory{path}", headers=headers)
            assert response.status_code == 200, (path, response.text)
            return response.json()

        return read

    return [
        EntryPoint(f"{app} GET /api/memory", OWN, (None,), get("")),
        EntryPoint(f"{app} GET /api/memory/export", OWN, (None,), get("/export")),
        EntryPoint(f"{app} GET /api/memory/status", OWN, (None,), get("/status")),
        EntryPoint(f"{app} POST /api/memory/reload", OWN, (None,), get("/reload", "POST")),
        EntryPoint(
            f"{app} GET /api/memory/facts fulltext", MERGED, (None,), get("/facts?q=canary&limit=100")
        ),
        # By meaning, the search ranks the caller's own facts only, as the helper does.
        EntryPoint(
            f"{app} GET /api/memory/facts semantic",
            NO_LEAK,
            (None,),
            get("/facts?q=canary&limit=100&mode=semantic"),
        ),
    ]


def _mcp(tool: str, arguments: dict[str, Any]) -> Read:
    """One MCP tool call through the SDK's client, in memory, on a server fixed to the identity."""

    def read(who: Identity) -> object:
        async def call() -> object:
            caller = fixed_identity(who.user_id or "", tenant_id=who.tenant_id, roles=who.roles)
            async with Client(create_mcp_server(caller)) as client:
                result = await client.call_tool(tool, arguments)
            assert not result.is_error, (tool, result)
            return result.structured_content

        return asyncio.run(call())

    return read


def _mcp_paths() -> list[EntryPoint]:
    search = {"query": "canary", "limit": 100, "mode": "fulltext"}
    return [
        EntryPoint("MCP memory_search fulltext", MERGED, (None,), _mcp("memory_search", search)),
        EntryPoint("MCP memory_context", MERGED, (None,), _mcp("memory_context", {"query": ""})),
        EntryPoint("MCP memory_context query", MERGED, (None,), _mcp("memory_context", {"query": "canary"})),
    ]


def _deerflow_paths(url: str) -> list[EntryPoint]:
    def deermem(agent: str) -> Read:
        return lambda who: DeerMemStore(database_url=url, tenant_id=who.tenant_id).load(
            agent, user_id=who.user_id
        )

    def deermem_facts(who: Identity) -> object:
        # The ids every owner's seeded facts have: asking for them must find the caller's own only.
        store = DeerMemStore(database_url=url, tenant_id=who.tenant_id)
        return [
            store.get_fact(f"fact_{index:08d}", user_id=who.user_id, agent_name=AGENT) for index in range(4)
        ]

    def seed(agent: str | None) -> Read:
        return lambda who: dict(
            SeedStore(database_url=url, tenant_id=who.tenant_id).load(agent, user_id=who.user_id)
        )

    return [
        EntryPoint("DeerMem load default bucket", OWN, (None,), deermem(DEERMEM_DEFAULT_BUCKET)),
        EntryPoint("DeerMem load agent", OWN, (AGENT,), deermem(AGENT)),
        EntryPoint("DeerMem get_fact", OWN, (AGENT,), deermem_facts),
        EntryPoint("DeerFlow seed load", OWN, (None,), seed(None)),
        EntryPoint("DeerFlow seed load agent", OWN, (AGENT,), seed(AGENT)),
    ]


def _export_path(destination: Path) -> EntryPoint:
    def export(who: Identity) -> object:
        storage = get_memory_storage().for_identity(who.tenant_id, who.roles)
        target = destination / uuid.uuid4().hex
        written = export_scopes(storage, list_scopes(who.user_id, storage=storage), target)
        return [path.read_text(encoding="utf-8") for path in written]

    return EntryPoint("export_scopes", OWN, (None, AGENT), export)


# -- the arena ----------------------------------------------------------------------------------------


def _expected(rule: str, identity: Identity, canaries: list[Canary]) -> set[str]:
    if rule in (OWN, NO_LEAK):
        return {c.text for c in canaries if c.tenant == identity.tenant_id and c.owner == identity.user_id}
    return {c.text for c in canaries if _may_read(identity, c)}


def test_every_entry_point_shows_each_identity_exactly_what_it_may_read(
    arena: Arena, seeded: Seeded, tmp_path: Path, record: Callable[..., None]
) -> None:
    leaks: list[str] = []
    wrong: list[str] = []
    reads = 0
    with TestClient(_http_app()) as router, TestClient(_serve_app()) as serve, asyncio.Runner() as runner:
        paths = [
            *_library_paths(),
            *_async_paths(runner),
            *_http_paths(router, "router"),
            *_http_paths(serve, "serve"),
            *_mcp_paths(),
            *_deerflow_paths(arena.url),
            _export_path(tmp_path / "export"),
        ]
        for identity in IDENTITIES:
            for path in paths:
                shown = repr(path.read(identity))
                reads += 1
                found = {c.text for c in seeded.every if c.text in shown}
                readable = {c.text for c in seeded.every if _may_read(identity, c)}
                for canary in seeded.every:
                    if canary.text in found - readable:
                        leaks.append(f"{path.name}: {identity} sees {canary}")
                expected = _expected(path.rule, identity, _agents(seeded, path.agents))
                if found != expected and not (path.rule == NO_LEAK and found >= expected):
                    wrong.append(f"{path.name}: {identity} sees {sorted(found)}, expected {path.rule}")
        runner.run(aio.aclose())
    record(
        identities=len(IDENTITIES),
        canaries=len(seeded.every),
        paths=len(paths),
        reads=reads,
        leaks=len(leaks),
    )
    assert leaks == []
    assert wrong == []


def _agents(seeded: Seeded, agents: tuple[str | None, ...]) -> list[Canary]:
    return [*(seeded.own_scope if None in agents else []), *(seeded.helper if AGENT in agents else [])]


def test_scopes_are_listed_inside_the_tenant_only(seeded: Seeded) -> None:
    for identity in IDENTITIES:
        owned = {
            (c.owner, agent)
            for agent, group in ((None, seeded.own_scope), (AGENT, seeded.helper))
            for c in group
            if c.tenant == identity.tenant_id and c.owner == identity.user_id
        }
        assert set(list_scopes(identity.user_id, **_tenant(identity))) == owned, identity


# -- the queue ----------------------------------------------------------------------------------------


def test_a_queued_conversation_is_its_identitys_alone(arena: Arena, seeded: Seeded) -> None:
    secret = f"canary-{secrets.token_hex(8)}"
    writer = Identity("acme", "alice")
    messages = [
        {"role": "user", "content": f"I prefer {secret}."},
        {"role": "assistant", "content": "Noted."},
    ]
    MemoryMiddleware(AGENT).after_agent(
        messages, thread_id="arena-1", user_id=writer.user_id, tenant_id=writer.tenant_id
    )
    # The same thread and user id in another tenant: another conversation.
    other = [{"role": "user", "content": "I prefer rain."}, {"role": "assistant", "content": "Noted."}]
    MemoryMiddleware(AGENT).after_agent(other, thread_id="arena-1", user_id="alice", tenant_id="globex")

    with get_engine(arena.owner_url).connect() as conn:
        rows = conn.execute(select(queue_table)).mappings().all()
    holding = [row for row in rows if secret in repr(dict(row))]
    assert [(row["tenant_id"], row["user_id"]) for row in holding] == [("acme", "alice")]
    assert {row["tenant_id"] for row in rows} == {"acme", "globex"}

    if arena.app_role:
        app = get_engine(arena.url)
        assert policies_apply(app)
        with app.connect() as conn:  # no identity set: no row at all
            assert conn.execute(text("SELECT * FROM memory_queue")).all() == []
        for identity in IDENTITIES:  # no predicate: the policies alone decide
            with transaction(app, identity) as conn:
                seen = conn.execute(text("SELECT * FROM memory_queue")).mappings().all()
            assert {(row["tenant_id"], row["user_id"]) for row in seen} <= {
                (identity.tenant_id, identity.user_id)
            }, identity
            assert (secret in repr(seen)) == (identity == writer), identity
            queued_for_it = identity.user_id == "alice" and identity.tenant_id in ("acme", "globex")
            assert len(seen) == (1 if queued_for_it else 0), identity

    get_memory_queue().flush()  # the worker saves the row as its own identity
    for identity in IDENTITIES:
        shown = repr(
            [
                MemoryMiddleware(AGENT).memory_context(query="prefer", **_scope(identity)),
                list_facts(_mine(identity), limit=1000, **_tenant(identity)).facts,
                get_memory_data(AGENT, **_scope(identity)),
            ]
        )
        assert (secret in shown) == (identity == writer), identity


# -- sessions -----------------------------------------------------------------------------------------


def test_every_session_entry_point_shows_each_identity_its_own_sessions_only(
    arena: Arena, configured: MemoryConfig
) -> None:
    """Every user gets a session without an agent and one with ``helper``, under the same id, each
    turn (and the id of one more session) a canary; every entry point that reads sessions must
    show an identity exactly its user's own (roles change nothing: a session is never shared)."""
    canaries: dict[tuple[str, str | None], set[str]] = {}
    for who in IDENTITIES:
        if (who.tenant_id, who.user_id) in canaries:
            continue  # the same user with other roles
        mine = canaries.setdefault((who.tenant_id, who.user_id), set())
        for agent in (None, AGENT):
            text = f"canary-{secrets.token_hex(8)}"
            mine.add(text)
            turn = [{"role": "user", "content": text}]
            sessions.append_turns(who.user_id, "s1", turn, agent_name=agent, tenant_id=who.tenant_id)
        listed = f"canary-{secrets.token_hex(8)}"  # found only by listing the sessions
        mine.add(listed)
        sessions.append_turns(
            who.user_id, listed, [{"role": "user", "content": "hi"}], tenant_id=who.tenant_id
        )
    everyone = set().union(*canaries.values())

    def middleware(agent: str | None) -> Read:
        return lambda who: MemoryMiddleware(agent).session_context(
            session_id="s1", user_id=who.user_id, tenant_id=who.tenant_id
        )

    def ops_read(agent: str | None) -> Read:
        return lambda who: sessions.read_session(who.user_id, "s1", agent_name=agent, tenant_id=who.tenant_id)

    def ops_context(who: Identity) -> object:
        return sessions.session_context(who.user_id, "s1", agent_name=AGENT, tenant_id=who.tenant_id)

    def ops_list(who: Identity) -> object:
        return sessions.list_sessions(who.user_id, tenant_id=who.tenant_id)

    def http(client: TestClient, path: str) -> Read:
        def read(who: Identity) -> object:
            headers = {"X-User": who.user_id or "", "X-Tenant": who.tenant_id}
            if who.roles:
                headers["X-Roles"] = who.roles_setting
            response = client.get(f"/api/memory{path}", headers=headers)
            assert response.status_code == 200, (path, response.text)
            return response.json()

        return read

    with TestClient(_http_app()) as router, TestClient(_serve_app()) as serve:
        paths: list[tuple[str, Read]] = [
            ("middleware session_context", middleware(None)),
            ("middleware session_context helper", middleware(AGENT)),
            ("ops.read_session", ops_read(None)),
            ("ops.read_session helper", ops_read(AGENT)),
            ("ops.session_context helper", ops_context),
            ("ops.list_sessions", ops_list),
            ("MCP session_context", _mcp("session_context", {"session_id": "s1"})),
            ("MCP session_list", _mcp("session_list", {"limit": 100})),
        ]
        for name, client in (("router", router), ("serve", serve)):
            paths += [
                (f"{name} GET /sessions", http(client, "/sessions?limit=100")),
                (f"{name} GET /sessions/s1", http(client, "/sessions/s1")),
                (f"{name} GET /sessions/s1/context", http(client, "/sessions/s1/context")),
            ]
        for who in IDENTITIES:
            own = canaries[(who.tenant_id, who.user_id)]
            for name, read in paths:
                found = {text for text in everyone if text in repr(read(who))}
                assert found <= own, f"{name}: {who} sees another user's session"
                assert found, f"{name}: {who} sees none of its own sessions"
