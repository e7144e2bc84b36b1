"""The leak arena: canary facts across tenants, read back by every other identity through every
storage read path, on SQLite, on PostgreSQL as a superuser (memstore's own predicates) and on
PostgreSQL as an application role that row-level security binds (the predicates and the policies).

Each canary is a unique random string. An identity must see exactly the canaries the rules grant it
(its own, the tenant's public ones, shared ones granted to its user or a role, shared ones for
``admin``) and never any other, in any read: the document load, the merged shared facts, listing,
full-text and substring search, history and the scopes it can enumerate.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from memstore.scope import Identity
from memstore.storage.records import ANY_AGENT, FactFilter
from memstore.storage.sql import SqlMemoryStorage
from tests.support.app_role import app_role_url

AGENT = "helper"


@dataclass(frozen=True)
class Canary:
    tenant: str
    owner: str
    visibility: str
    users: tuple[str, ...] = ()
    roles: tuple[str, ...] = ()
    text: str = ""


def _canaries() -> list[Canary]:
    def c(tenant: str, owner: str, visibility: str, **grants: Any) -> Canary:
        return Canary(tenant, owner, visibility, text=f"canary-{secrets.token_hex(8)}", **grants)

    return [
        c("acme", "alice", "private"),
        c("acme", "alice", "shared", users=("bob",)),
        c("acme", "alice", "shared", roles=("finance",)),
        c("acme", "alice", "public"),
        c("acme", "bob", "private"),
        # Same user id in another tenant: a different person, a different memory.
        c("globex", "alice", "private"),
        c("globex", "alice", "public"),
        c("globex", "mallory", "shared", users=("alice",), roles=("finance",)),
    ]


IDENTITIES = [
    Identity("acme", "alice"),
    Identity("acme", "bob"),
    Identity("acme", "carol"),
    Identity("acme", "carol", frozenset({"sales"})),
    Identity("acme", "dave", frozenset({"finance"})),
    Identity("acme", "erin", frozenset({"admin"})),
    Identity("globex", "alice"),
    Identity("globex", "bob", frozenset({"finance"})),
    Identity("initech", "alice", frozenset({"admin", "finance"})),
]


def _may_read(identity: Identity, canary: Canary) -> bool:
    if canary.tenant != identity.tenant_id:
        return False
    if canary.owner == identity.user_id or canary.visibility == "public":
        return True
    if canary.visibility != "shared":
        return False
    return (
        "admin" in identity.roles
        or identity.user_id in canary.users
        or bool(identity.roles & set(canary.roles))
    )


@pytest.fixture(params=["sqlite", "postgresql", "postgresql-app-role"])
def arena_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A migrated database to seed (as its owner) and the URL the readers use."""
    if request.param == "sqlite":
        yield str(request.getfixturevalue("sqlite_url"))
        return
    request.applymarker(pytest.mark.postgres)
    owner_url = str(request.getfixturevalue("postgres_url"))
    if request.param == "postgresql":
        yield owner_url
        return
    with app_role_url(owner_url, "memstore_arena") as url:
        yield url


def seed(url: str, canaries: list[Canary], agent: str | None = AGENT) -> None:
    """Each owner's canaries as one save into ``agent``'s scope (sharing needs ``editor``)."""
    storage = SqlMemoryStorage(url)
    by_owner: dict[tuple[str, str], list[Canary]] = {}
    for canary in canaries:
        by_owner.setdefault((canary.tenant, canary.owner), []).append(canary)
    for (tenant, owner), owned in by_owner.items():
        facts = []
        for index, canary in enumerate(owned):
            fact: dict[str, Any] = {
                "id": f"fact_{index:08d}",
                "content": canary.text,
                "confidence": 0.9,
                # The memory record carries the canary too: a read that leaks only a tag, the raw
                # words or the structured form of a fact is a leak.
                "tags": [canary.text],
                "raw": f"the user said {canary.text}",
                "structured": {"said": canary.text},
                "importance": 0.9,
            }
            if index:
                fact["relations"] = [{"type": "related_to", "target": "fact_00000000"}]
            if canary.visibility != "private":
                fact["visibility"] = canary.visibility
            if canary.users:
                fact["allowedUsers"] = list(canary.users)
            if canary.roles:
                fact["allowedRoles"] = list(canary.roles)
            facts.append(fact)
        handle = storage.for_identity(tenant, ["editor"])
        assert handle.save({"facts": facts}, agent, user_id=owner, origin="arena")
    storage.close()


def _everything_read(storage: SqlMemoryStorage, identity: Identity) -> str:
    """Every storage read path's output for ``identity``, as one text."""
    handle = storage.for_identity(identity.tenant_id, identity.roles)
    user = identity.user_id
    seen: list[Any] = [
        handle.load(AGENT, user_id=user),
        handle.reload(AGENT, user_id=user),
        handle.visible_facts(AGENT, user_id=user),
        handle.list_scopes(user),
        handle.history(FactFilter(user_id=user, agent_name=ANY_AGENT), fact_id=None, limit=1000),
    ]
    for search in (None, "canary"):
        page = handle.query_facts(FactFilter(user_id=user), search=search, limit=1000, offset=0)
        seen.append([record.to_json() for record in page.facts])
    page = handle.query_facts(FactFilter(user_id=user, text="canary"), search=None, limit=1000, offset=0)
    seen.append([record.to_json() for record in page.facts])
    return repr(seen)


def test_no_identity_reads_a_canary_it_was_not_granted(arena_url: str) -> None:
    canaries = _canaries()
    seed(arena_url, canaries)
    storage = SqlMemoryStorage(arena_url)
    leaks: list[str] = []
    missing: list[str] = []
    for identity in IDENTITIES:
        read = _everything_read(storage, identity)
        for canary in canaries:
            if _may_read(identity, canary):
                if canary.text not in read:
                    missing.append(f"{identity} does not see {canary}")
            elif canary.text in read:
                leaks.append(f"{identity} sees {canary}")
    storage.close()
    assert leaks == []
    assert missing == []


def test_the_merge_is_exactly_what_was_granted(arena_url: str) -> None:
    """``visible_facts`` (what memory_context merges) holds exactly the other owners' granted canaries."""
    canaries = _canaries()
    seed(arena_url, canaries)
    storage = SqlMemoryStorage(arena_url)
    for identity in IDENTITIES:
        handle = storage.for_identity(identity.tenant_id, identity.roles)
        merged = {fact["content"] for fact in handle.visible_facts(AGENT, user_id=identity.user_id)}
        expected = {
            canary.text
            for canary in canaries
            if canary.owner != identity.user_id and _may_read(identity, canary)
        }
        assert merged == expected, identity
    storage.close()


def test_relations_and_record_filters_read_only_what_was_granted(arena_url: str) -> None:
    """The memory record's read paths: a fact's relations (its owner's alone), and listing by tag,
    type, importance and source kind (the same rule as any listing)."""
    canaries = _canaries()
    seed(arena_url, canaries)
    storage = SqlMemoryStorage(arena_url)
    try:
        for identity in IDENTITIES:
            handle = storage.for_identity(identity.tenant_id, identity.roles)
            user = identity.user_id
            owned = [c for c in canaries if c.tenant == identity.tenant_id and c.owner == user]
            relations = handle.fact_relations("fact_00000001", AGENT, user_id=user)
            outgoing = [(relation.kind, relation.fact_id) for relation in relations.outgoing]
            assert outgoing == ([("related_to", "fact_00000000")] if len(owned) > 1 else []), identity
            for canary in canaries:
                page = handle.query_facts(
                    FactFilter(user_id=user, tag=canary.text), search=None, limit=1000, offset=0
                )
                expected = [canary.text] if _may_read(identity, canary) else []
                assert [record.content for record in page.facts] == expected, (identity, canary)
            readable = sorted(c.text for c in canaries if _may_read(identity, c))
            for narrowed in (
                FactFilter(user_id=user, min_importance=0.9),
                FactFilter(user_id=user, memory_type="episodic"),
                FactFilter(user_id=user, source_kind="implicit_inference"),
            ):
                page = handle.query_facts(narrowed, search=None, limit=1000, offset=0)
                assert sorted(record.content for record in page.facts) == readable, (identity, narrowed)
    finally:
        storage.close()
