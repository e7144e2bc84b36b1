"""The leak arena for the agents' own documents: canary documents of two agents in several
tenants, the agent's own and each user's own, read back by every identity through every read
path (the ops that every entry point calls and the agent's file tools), with ``agent_doc_per_user``
off and on, on SQLite, on PostgreSQL as a superuser and on PostgreSQL as an application role that
row-level security binds. An identity must see exactly the documents its scope reaches, with
their history, and nothing of another tenant or of another user's own documents; what it writes
must land in its own scope; erasing a user takes exactly that user's documents and name.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import create_engine, select

from memstore.agent_doc import DocScope
from memstore.config import MemoryConfig, set_memory_config
from memstore.errors import AgentDocNotFoundError
from memstore.gateway import agent_doc_tools as tools
from memstore.ops import agent_docs as ops
from memstore.queries import erase_user
from memstore.storage.loader import reset_memory_storage
from memstore.storage.sql.schema.models import agent_document_versions_table, agent_documents_table
from tests.support.app_role import app_role_url

TENANTS = {"acme": ("alice", "bob"), "globex": ("alice",)}
AGENTS = (None, "coder")
PATHS = ("/memories/agent.md", "/memories/projects/x.md")
DELETED = "/memories/old.md"
READERS: tuple[tuple[str, str | None], ...] = (
    ("acme", "alice"),
    ("acme", "bob"),
    ("acme", "carol"),  # no documents of her own
    ("acme", None),  # a call naming no user: the agent's own documents
    ("globex", "alice"),  # the same user id in another tenant: another person
    ("globex", None),
    ("initech", "alice"),  # a tenant with nothing
)
Where = tuple[str, str, str]
"""A document scope as stored: ``(tenant, agent name or '', user or '')``."""


@dataclass
class Arena:
    writer: str
    """The URL the canaries are seeded through (the database's owner)."""
    reader: str
    """The URL every identity reads and writes through (the app role where there is one)."""
    operator: str | None


@pytest.fixture(params=["sqlite", "postgresql", "postgresql-app-role"])
def arena(request: pytest.FixtureRequest) -> Iterator[Arena]:
    if request.param == "sqlite":
        url = str(request.getfixturevalue("sqlite_url"))
        yield Arena(url, url, None)
        return
    request.applymarker(pytest.mark.postgres)
    owner = str(request.getfixturevalue("postgres_url"))
    if request.param == "postgresql":
        yield Arena(owner, owner, None)
        return
    with app_role_url(owner, "memstore_agent_docs") as url:
        yield Arena(owner, url, owner)
        ops.reset_agent_doc_stores()  # before the role's pools are closed and it is dropped


def _use(url: str, arena: Arena, *, per_user: bool) -> None:
    set_memory_config(
        MemoryConfig(
            database_url=url,
            operator_database_url=arena.operator if url == arena.reader else None,
            agent_doc_per_user=per_user,
        )
    )
    reset_memory_storage()
    ops.reset_agent_doc_stores()


def _canary() -> str:
    return f"canary-{secrets.token_hex(8)}"


def _scopes() -> Iterator[tuple[DocScope, str]]:
    """Every seeded scope and the user whose requests write it."""
    for tenant, users in TENANTS.items():
        for agent in AGENTS:
            yield DocScope(agent, None, tenant), users[-1]
            for user in users:
                yield DocScope(agent, user, tenant), user


def _where(scope: DocScope) -> Where:
    return (scope.tenant_id, scope.agent_name or "", scope.user_id or "")


def _seed() -> dict[str, Where]:
    """Each scope's documents, each edited once (both texts stay in the history) and one deleted
    (its text only in the history); returns every canary and the scope it belongs to."""
    canaries: dict[str, Where] = {}
    for scope, actor in _scopes():
        for path in (*PATHS, DELETED):
            first, second = _canary(), _canary()
            ops.write_doc(scope, path, f"# notes\n{first}\n", expected_version=0, author="agent", actor=actor)
            ops.edit_doc(scope, path, first, second, expected_version=1, author="agent", actor=actor)
            canaries[first] = canaries[second] = _where(scope)
        ops.delete_doc(scope, DELETED, expected_version=2, author="agent", actor=actor)
    return canaries


def _reached(tenant: str, user: str | None, *, per_user: bool) -> set[Where]:
    return {(tenant, agent or "", (user or "") if per_user else "") for agent in AGENTS}


def _everything_read(tenant: str, user: str | None) -> str:
    """Every agent-document read path's output for the identity, as one text."""
    seen: list[object] = []
    for agent in (*AGENTS, "stranger"):
        scope = ops.doc_scope(agent, user, tenant)
        seen += [
            ops.list_docs(scope, actor=user),
            ops.list_docs(scope, "/memories/projects/", actor=user),
            ops.load_main_doc(scope, actor=user),
            ops.doc_history(scope, limit=100),
        ]
        for path in (*PATHS, DELETED):
            try:
                seen.append(ops.read_doc(scope, path, actor=user))
            except AgentDocNotFoundError as exc:
                seen.append(str(exc))
            seen.append(ops.doc_history(scope, path, limit=100))
        if user is None:
            continue  # the tools serve a request's user ("default" when none is bound)
        named: dict[str, Any] = {"agent_name": agent, "user_id": user, "tenant_id": tenant}
        seen += [tools.ls(**named), tools.ls("/memories/projects/", **named)]
        seen += [tools.read_file(path, **named) for path in (*PATHS, DELETED)]
    return repr(seen)


def _assert_each_reads_its_own(canaries: dict[str, Where], *, per_user: bool) -> set[str]:
    """Asserts every reader sees exactly its own canaries; returns those anyone saw."""
    anyone: set[str] = set()
    for tenant, user in READERS:
        seen = _everything_read(tenant, user)
        reached = _reached(tenant, user, per_user=per_user)
        own = {text for text, where in canaries.items() if where in reached}
        assert {text for text in canaries if text in seen} == own, (tenant, user, per_user)
        anyone |= own
    return anyone


def _rows(url: str) -> dict[str, set[tuple[Any, ...]]]:
    """Both tables as the owner sees them: every row's key, actor and text."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return {
                table.name: {
                    (r.tenant_id, r.agent_name, r.user_id, r.path, r.version, r.actor, r.content)
                    for r in conn.execute(select(table))
                }
                for table in (agent_documents_table, agent_document_versions_table)
            }
    finally:
        engine.dispose()


@pytest.mark.parametrize("per_user", [False, True], ids=["agent-wide", "per-user"])
def test_every_identity_reads_exactly_the_documents_of_its_scope(arena: Arena, per_user: bool) -> None:
    _use(arena.writer, arena, per_user=per_user)
    canaries = _seed()
    _use(arena.reader, arena, per_user=per_user)
    seen = _assert_each_reads_its_own(canaries, per_user=per_user)
    # Every seeded scope has a reader: with per-user documents off, no one reaches those.
    assert seen == {text for text, where in canaries.items() if per_user or not where[2]}


@pytest.mark.parametrize("per_user", [False, True], ids=["agent-wide", "per-user"])
def test_what_an_identity_writes_lands_in_its_own_scope(arena: Arena, per_user: bool) -> None:
    _use(arena.writer, arena, per_user=per_user)
    canaries = _seed()
    _use(arena.reader, arena, per_user=per_user)
    for tenant, user in READERS:
        if user is None:
            continue
        for agent in AGENTS:
            where = (tenant, agent or "", user if per_user else "")
            named: dict[str, Any] = {"agent_name": agent, "user_id": user, "tenant_id": tenant}
            created, edited = _canary(), _canary()
            reply = tools.write_file(f"/memories/by/{user}.md", created, **named)
            assert reply.startswith("Wrote "), reply
            reply = tools.edit_file(PATHS[0], "# notes\n", f"# notes\n{edited}\n", **named)
            # A user with no document of its own (carol, initech's alice) has nothing to edit.
            assert reply.startswith("Edited ") or reply == f"Error: no document at {PATHS[0]}", reply
            canaries[created] = where
            if reply.startswith("Edited "):
                canaries[edited] = where
    rows = _rows(arena.writer)
    for text, where in canaries.items():
        holders = {row[:3] for table in rows.values() for row in table if text in (row[6] or "")}
        assert holders == {where}, text
    _assert_each_reads_its_own(canaries, per_user=per_user)


def test_erasing_a_user_takes_its_documents_and_its_name_and_nothing_else(arena: Arena) -> None:
    _use(arena.writer, arena, per_user=True)
    canaries = _seed()
    before = _rows(arena.writer)
    _use(arena.reader, arena, per_user=True)
    counts = erase_user("alice", tenant_id="acme")
    # Her own documents of two agents, three each, with two versions each and one for the delete.
    assert counts["memory_agent_documents"] == 6 and counts["memory_agent_document_versions"] == 14

    def erased(row: tuple[Any, ...]) -> bool:
        return bool(row[0] == "acme" and row[2] == "alice")

    expected = {
        name: {
            (*row[:5], None if row[0] == "acme" and row[5] == "alice" else row[5], row[6])
            for row in table
            if not erased(row)
        }
        for name, table in before.items()
    }
    after = _rows(arena.writer)
    assert after == expected
    # globex's alice is another person: her documents and her name there stay.
    assert any(row[0] == "globex" and row[5] == "alice" for row in after["memory_agent_documents"])
    left = {
        text: where for text, where in canaries.items() if not (where[0] == "acme" and where[2] == "alice")
    }
    assert len(left) == len(canaries) - 2 * 2 * 3
    _assert_each_reads_its_own(left, per_user=True)
    assert not any(text in _everything_read("acme", "alice") for text in canaries if text not in left)
