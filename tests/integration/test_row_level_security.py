"""PostgreSQL's row-level security holds with memstore's WHERE clauses removed (issue 31, item 4).

One database per module, migrated to head by memstore's own migrate, and one application role
made by ``grant_app_role`` (what ``memstore db grant-app-role`` runs). The superuser seeds two
tenants' rows straight into every memory table: private, shared-to-a-user, shared-to-a-role and
public facts with their grants, sections, history, embeddings, erasures, queue rows and claims,
sessions, agent documents and their versions (two agents' own per tenant, each user's own),
the LangGraph store's items and their history, one user id present in both tenants, a grant in
one tenant naming a user of the other. Then, as the application role, every table is read with a
bare ``SELECT *``: with no identity nothing comes back, and with one set, exactly the rows the
rules in ``schema/rls.py`` allow (an oracle written from the rules, plus spot checks by name).
Writes across tenants and owners are refused or touch nothing, and the identity ends with its
transaction, as a transaction-mode pooler needs.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, create_engine, insert, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from memstore.config import MemoryConfig
from memstore.errors import ConfigError
from memstore.ops.doctor import diagnose
from memstore.scope import Identity
from memstore.storage.sql import identity as identity_module
from memstore.storage.sql.engine import dispose_engines, get_engine
from memstore.storage.sql.maintenance import erase
from memstore.storage.sql.maintenance.erase import erasure_digest
from memstore.storage.sql.schema import migrate, rls, roles
from memstore.storage.sql.schema.models import (
    Base,
    agent_document_versions_table,
    agent_documents_table,
    claims_table,
    embeddings_table,
    erasures_table,
    facts_table,
    grants_table,
    history_table,
    queue_table,
    relations_table,
    scopes_table,
    sections_table,
    session_turns_table,
    sessions_table,
    snapshots_table,
    store_item_history_table,
    store_items_table,
    tags_table,
)
from tests.integration.conftest import Cli
from tests.support.app_role import app_role_url
from tests.support.postgres import fresh_database

pytestmark = pytest.mark.postgres

AGENT = "agent"
NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
TABLES = sorted(Base.metadata.tables)

ScopeKey = tuple[str, str | None, str | None]


@dataclass(frozen=True)
class Fact:
    key: str
    tenant: str
    owner: str | None
    visibility: str = "private"
    users: tuple[str, ...] = ()
    roles: tuple[str, ...] = ()

    @property
    def scope(self) -> ScopeKey:
        return (self.tenant, self.owner, AGENT if self.owner is not None else None)


SCOPES: tuple[ScopeKey, ...] = (
    *(("acme", user, AGENT) for user in ("alice", "bob", "carol", "dave", "erin")),
    ("acme", None, None),  # the tenant's global memory: a call naming no user
    *(("globex", user, AGENT) for user in ("alice", "bob", "zed")),
)
FACTS: tuple[Fact, ...] = (
    Fact("a_private", "acme", "alice"),
    Fact("a_to_bob", "acme", "alice", "shared", users=("bob",)),
    Fact("a_to_support", "acme", "alice", "shared", roles=("support",)),
    Fact("a_shared_to_nobody", "acme", "alice", "shared"),
    Fact("a_public", "acme", "alice", "public"),
    Fact("b_private", "acme", "bob"),
    Fact("b_public", "acme", "bob", "public"),
    Fact("e_private", "acme", "erin"),
    Fact("g_private", "acme", None),
    # The same user id in another tenant is another person; its grants name that tenant's users.
    Fact("x_private", "globex", "alice"),
    Fact("x_to_bob", "globex", "alice", "shared", users=("bob",)),
    Fact("x_to_support", "globex", "alice", "shared", roles=("support",)),
    Fact("x_public", "globex", "alice", "public"),
    Fact("z_private", "globex", "zed"),
)
IDENTITIES = (
    Identity.of("alice", tenant_id="acme"),
    Identity.of("bob", tenant_id="acme"),
    Identity.of("carol", tenant_id="acme", roles=["support"]),
    Identity.of("dave", tenant_id="acme", roles=["sales"]),
    Identity.of("erin", tenant_id="acme", roles=["admin"]),
    Identity.of(None, tenant_id="acme"),
    Identity.of("alice", tenant_id="globex"),
    Identity.of("bob", tenant_id="globex", roles=["admin", "support"]),
    Identity.of("zed", tenant_id="globex"),
    Identity.of("alice", tenant_id="initech", roles=["admin", "support"]),
)


DocKey = tuple[str, str, str]
"""An agent document by ``(tenant, agent, user)``: user ``''`` for the agent's own, shared in the tenant."""
DOCS: tuple[DocKey, ...] = (
    *((tenant, agent, "") for tenant in ("acme", "globex") for agent in (AGENT, "other")),
    *((s[0], AGENT, s[1]) for s in SCOPES if s[1] is not None),  # each user's own (agent_doc_per_user)
)


def _label(identity: Identity) -> str:
    return f"{identity.tenant_id}/{identity.user_id or '-'}/{identity.roles_setting or '-'}"


# --- the rules of rls.py, restated -------------------------------------------------------------


def _own(identity: Identity, scope: ScopeKey) -> bool:
    return scope[0] == identity.tenant_id and (scope[1] or "") == (identity.user_id or "")


def _admin(identity: Identity) -> bool:
    return "admin" in identity.roles


def _reads(identity: Identity, fact: Fact) -> bool:
    if fact.tenant != identity.tenant_id:
        return False
    if _own(identity, fact.scope) or fact.visibility == "public":
        return True
    granted = (identity.user_id or "") in fact.users or bool(set(fact.roles) & identity.roles)
    return fact.visibility == "shared" and (_admin(identity) or granted)


def _grants() -> list[tuple[str, str, str]]:
    return [(f.key, "user", u) for f in FACTS for u in f.users] + [
        (f.key, "role", r) for f in FACTS for r in f.roles
    ]


def expected(identity: Identity) -> dict[str, set[Any]]:
    """Every table's rows ``identity`` may read, by natural key (as ``Seeded.visible`` names them)."""
    facts = {f.key for f in FACTS if _reads(identity, f)}
    by_key = {f.key: f for f in FACTS}
    own_scopes = {s for s in SCOPES if _own(identity, s)}
    users = {s[1] or "" for s in own_scopes}
    return {
        # Scope rows (no memory in them) are the tenant's: a shared fact is joined to its agent.
        "memory_scopes": {s for s in SCOPES if s[0] == identity.tenant_id},
        "memory_sections": own_scopes,
        # A scope's derived document holds every fact of it, private ones too: its owner's alone.
        "memory_scope_snapshots": own_scopes,
        "memory_facts": facts,
        "memory_fact_grants": {
            g
            for g in _grants()
            if by_key[g[0]].tenant == identity.tenant_id
            and (
                _own(identity, by_key[g[0]].scope)
                or _admin(identity)
                or (g[1] == "user" and g[2] == (identity.user_id or ""))
                or (g[1] == "role" and g[2] in identity.roles)
            )
        },
        # A fact's past is its owner's alone (its earlier text may predate its sharing).
        "memory_history": {(s, "section", "workContext") for s in own_scopes}
        | {(f.scope, "fact", f.key) for f in FACTS if _own(identity, f.scope)},
        "memory_fact_embeddings": facts,
        # Tags go where their fact goes; relations (between a scope's facts) stay with its owner.
        "memory_fact_tags": facts,
        "memory_fact_relations": {f.key for f in FACTS if _own(identity, f.scope)},
        "memory_erasures": {t for t in ("acme", "globex") if t == identity.tenant_id},
        "memory_queue": {(identity.tenant_id, u) for u in users},
        "memory_queue_claims": {(identity.tenant_id, u) for u in users},
        "memory_sessions": {(identity.tenant_id, u) for u in users},
        "memory_session_turns": {(identity.tenant_id, u) for u in users},
        # The agent's own documents are the tenant's; a user's documents, with their versions, theirs.
        "memory_agent_documents": _docs(identity),
        "memory_agent_document_versions": _docs(identity),
        # The store's items and their history are their user's alone.
        "memory_store_items": {(identity.tenant_id, u) for u in users if u},
        "memory_store_item_history": {(identity.tenant_id, u) for u in users if u},
    }


def _docs(identity: Identity) -> set[DocKey]:
    return {d for d in DOCS if d[0] == identity.tenant_id and d[2] in ("", identity.user_id or "")}


# --- the database --------------------------------------------------------------------------------


@dataclass
class Seeded:
    admin: Engine
    app: Engine
    role: str
    scope_ids: dict[int, ScopeKey] = field(default_factory=dict)
    fact_ids: dict[int, str] = field(default_factory=dict)
    canaries: dict[str, str] = field(default_factory=dict)

    def scope_id(self, scope: ScopeKey) -> int:
        return next(i for i, key in self.scope_ids.items() if key == scope)

    def fact_id(self, key: str) -> int:
        return next(i for i, name in self.fact_ids.items() if name == key)

    def visible(self, conn: Connection) -> dict[str, set[Any]]:
        """``SELECT *`` on every memory table, no predicate, each row named by its natural key."""
        rows = {table: [r._mapping for r in conn.execute(text(f"SELECT * FROM {table}"))] for table in TABLES}
        named: dict[str, set[Any]] = {
            "memory_scopes": {(r["tenant_id"], r["user_id"], r["agent_name"]) for r in rows["memory_scopes"]},
            "memory_sections": {self.scope_ids[r["scope_id"]] for r in rows["memory_sections"]},
            "memory_scope_snapshots": {self.scope_ids[r["scope_id"]] for r in rows["memory_scope_snapshots"]},
            "memory_facts": {self.fact_ids[r["id"]] for r in rows["memory_facts"]},
            "memory_fact_grants": {
                (self.fact_ids[r["fact_row_id"]], r["grantee_kind"], r["grantee"])
                for r in rows["memory_fact_grants"]
            },
            "memory_history": {
                (self.scope_ids[r["scope_id"]], r["entity"], r["entity_id"]) for r in rows["memory_history"]
            },
            "memory_fact_embeddings": {
                self.fact_ids[r["fact_row_id"]] for r in rows["memory_fact_embeddings"]
            },
            "memory_fact_tags": {self.fact_ids[r["fact_row_id"]] for r in rows["memory_fact_tags"]},
            "memory_fact_relations": {r["fact_id"] for r in rows["memory_fact_relations"]},
            "memory_erasures": {r["tenant_id"] for r in rows["memory_erasures"]},
            "memory_queue": {(r["tenant_id"], r["user_id"]) for r in rows["memory_queue"]},
            "memory_queue_claims": {(r["tenant_id"], r["user_id"]) for r in rows["memory_queue_claims"]},
            "memory_sessions": {(r["tenant_id"], r["user_id"]) for r in rows["memory_sessions"]},
            "memory_session_turns": {(r["tenant_id"], r["user_id"]) for r in rows["memory_session_turns"]},
            **{
                table: {(r["tenant_id"], r["agent_name"], r["user_id"]) for r in rows[table]}
                for table in ("memory_agent_documents", "memory_agent_document_versions")
            },
            **{
                table: {(r["tenant_id"], r["user_id"]) for r in rows[table]}
                for table in ("memory_store_items", "memory_store_item_history")
            },
        }
        assert set(named) == set(TABLES), "a new memory table needs a line here and in expected()"
        return named


def _seed(admin: Engine, seeded: Seeded) -> None:
    """Every row as the superuser, straight into the tables: no memstore code decides what lands."""
    with admin.begin() as conn:
        for scope in SCOPES:
            scope_id = conn.execute(
                insert(scopes_table)
                .values(tenant_id=scope[0], user_id=scope[1], agent_name=scope[2], revision=1)
                .returning(scopes_table.c.id)
            ).scalar_one()
            seeded.scope_ids[scope_id] = scope
            conn.execute(
                insert(sections_table).values(
                    scope_id=scope_id, section="workContext", summary=f"summary {scope}", revision=1, extra={}
                )
            )
            conn.execute(insert(history_table).values(_history(scope_id, "section", "workContext")))
            user = scope[1] or ""
            conn.execute(insert(queue_table).values(_queued(scope[0], user, scope[2] or "")))
            session = {
                "tenant_id": scope[0],
                "user_id": user,
                "agent_name": scope[2] or "",
                "session_id": "s1",
            }
            conn.execute(
                insert(sessions_table).values(
                    **session,
                    epoch="e",
                    next_seq=1,
                    turn_count=1,
                    token_count=3,
                    created_at=NOW,
                    updated_at=NOW,
                    expires_at=NOW + timedelta(days=1),
                )
            )
            conn.execute(
                insert(session_turns_table).values(
                    **session,
                    seq=1,
                    role="user",
                    content=f"session turn of {scope}",
                    tokens=3,
                    created_at=NOW,
                )
            )
            conn.execute(
                insert(claims_table).values(
                    tenant_id=scope[0],
                    user_id=user,
                    agent_name=scope[2] or "",
                    lease_owner="worker",
                    lease_token="t" * 32,
                    lease_expires_at=NOW,
                    claimed_at=NOW,
                )
            )
            if user:
                _seed_store_item(conn, scope[0], user)
        for position, fact in enumerate(FACTS):
            scope_id = seeded.scope_id(fact.scope)
            canary = f"canary-{fact.key}-{uuid.uuid4().hex}"
            seeded.canaries[fact.key] = canary
            row_id = conn.execute(
                insert(facts_table)
                .values(
                    scope_id=scope_id,
                    tenant_id=fact.tenant,
                    visibility=fact.visibility,
                    fact_id=fact.key,
                    position=position,
                    content=canary,
                    content_key=canary,
                    category="context",
                    confidence=0.9,
                    extra={},
                    added_revision=1,
                    updated_revision=1,
                )
                .returning(facts_table.c.id)
            ).scalar_one()
            seeded.fact_ids[row_id] = fact.key
            for kind, names in (("user", fact.users), ("role", fact.roles)):
                for name in names:
                    conn.execute(
                        insert(grants_table).values(
                            fact_row_id=row_id,
                            grantee_kind=kind,
                            grantee=name,
                            scope_id=scope_id,
                            tenant_id=fact.tenant,
                        )
                    )
            conn.execute(
                insert(embeddings_table).values(
                    fact_row_id=row_id,
                    scope_id=scope_id,
                    model="m",
                    dimension=2,
                    content_key=canary,
                    vector=[0.5, 0.5],
                    embedded_at=NOW,
                )
            )
            conn.execute(
                insert(tags_table).values(
                    fact_row_id=row_id, tag=f"tag-{fact.key}", scope_id=scope_id, tenant_id=fact.tenant
                )
            )
            conn.execute(
                insert(relations_table).values(
                    scope_id=scope_id,
                    fact_id=fact.key,
                    kind="related_to",
                    target_fact_id=fact.key,
                    tenant_id=fact.tenant,
                )
            )
            conn.execute(
                insert(history_table).values(_history(scope_id, "fact", fact.key, after={"content": canary}))
            )
        for scope_id, scope in seeded.scope_ids.items():  # each scope's document, its canaries in it
            contents = [seeded.canaries[f.key] for f in FACTS if f.scope == scope]
            document = json.dumps({"facts": [{"id": str(i), "content": c} for i, c in enumerate(contents)]})
            row = {"scope_id": scope_id, "revision": 1, "document": document, "layout": "[[],[]]"}
            conn.execute(insert(snapshots_table).values(row))
        for doc in DOCS:
            _seed_document(conn, doc)
        for tenant in ("acme", "globex"):
            conn.execute(
                insert(erasures_table).values(
                    user_digest=erasure_digest(tenant, "gone"), tenant_id=tenant, erased_at=NOW
                )
            )


def _seed_document(conn: Connection, doc: DocKey) -> None:
    key = {"tenant_id": doc[0], "agent_name": doc[1], "user_id": doc[2], "path": "/memories/agent.md"}
    content = f"agent document of {doc}"
    conn.execute(
        insert(agent_documents_table).values(
            **key,
            content=content,
            chars=len(content),
            version=1,
            author="agent",
            actor=doc[2] or None,
            created_at=NOW,
            updated_at=NOW,
        )
    )
    conn.execute(
        insert(agent_document_versions_table).values(
            **key,
            version=1,
            action="write",
            author="agent",
            actor=doc[2] or None,
            content=content,
            created_at=NOW,
        )
    )


def _seed_store_item(conn: Connection, tenant: str, user: str) -> None:
    key = {
        "tenant_id": tenant,
        "user_id": user,
        "agent_name": AGENT,
        "namespace": f"memories.{user}",
        "key": "k",
    }
    value = f'{{"text": "store item of {tenant}/{user}"}}'
    conn.execute(
        insert(store_items_table).values(**key, value=value, version=1, created_at=NOW, updated_at=NOW)
    )
    conn.execute(
        insert(store_item_history_table).values(**key, version=1, op="put", value=value, changed_at=NOW)
    )


def _history(
    scope_id: int, entity: str, entity_id: str, after: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "scope_id": scope_id,
        "revision": 1,
        "changed_at": NOW,
        "entity": entity,
        "entity_id": entity_id,
        "action": "insert",
        "origin": "seed",
        "after": after,
    }


def _queued(tenant: str, user: str, agent: str) -> dict[str, Any]:
    return {
        "tenant_id": tenant,
        "thread_id": f"thread-{tenant}-{user}",
        "user_id": user,
        "agent_name": agent,
        "messages": [{"role": "user", "content": f"queued turn of {tenant}/{user}"}],
        "message_chars": 20,
        "correction_detected": False,
        "reinforcement_detected": False,
        "state": "pending",
        "generation": 1,
        "captured_at": NOW,
        "pending_since": NOW,
        "due_at": NOW,
        "latest_due_at": NOW + timedelta(minutes=1),
        "enqueued_by": "test",
        "created_at": NOW,
        "updated_at": NOW,
    }


@pytest.fixture(scope="module")
def seeded(pg_server_url: str) -> Iterator[Seeded]:
    """A migrated database, its application role (with a password, for servers that ask) and the rows."""
    role, password = f"memstore_app_{uuid.uuid4().hex[:12]}", uuid.uuid4().hex
    server = create_engine(
        make_url(pg_server_url).set(drivername="postgresql+psycopg"), isolation_level="AUTOCOMMIT"
    )
    try:
        with fresh_database(pg_server_url) as url:
            migrate.upgrade(url)
            dispose_engines()
            admin = create_engine(url)
            app = create_engine(
                make_url(url).set(username=role, password=password), pool_size=1, max_overflow=0
            )
            try:
                roles.grant_app_role(admin, role, create=True, password=password)
                seeded = Seeded(admin, app, role)
                _seed(admin, seeded)
                yield seeded
            finally:
                app.dispose()
                admin.dispose()
                dispose_engines()
    finally:
        with server.connect() as conn:
            conn.execute(text(f'DROP ROLE IF EXISTS "{role}"'))
        server.dispose()


def _as(conn: Connection, identity: Identity) -> None:
    """What memstore and a DBA both run first: the three settings, transaction-local."""
    conn.execute(
        text(
            "SELECT set_config('memstore.tenant_id', :t, true), set_config('memstore.user_id', :u, true), "
            "set_config('memstore.roles', :r, true)"
        ),
        {"t": identity.tenant_id, "u": identity.user_id or "", "r": identity.roles_setting},
    )


# --- the catalog ---------------------------------------------------------------------------------


def test_every_memory_table_forces_row_level_security_with_its_policies(seeded: Seeded) -> None:
    """A table added to the models without policies fails here, before it can leak."""
    assert set(rls.POLICIES) == set(TABLES)
    with seeded.admin.connect() as conn:
        flags = {
            name: (enabled, forced)
            for name, enabled, forced in conn.execute(
                text(
                    "SELECT relname, relrowsecurity, relforcerowsecurity FROM pg_class "
                    "WHERE relkind = 'r' AND relnamespace = 'public'::regnamespace AND relname = ANY(:t)"
                ),
                {"t": TABLES},
            )
        }
        policies: dict[str, set[str]] = {}
        for table, name in conn.execute(
            text("SELECT tablename, policyname FROM pg_policies WHERE schemaname = 'public'")
        ):
            policies.setdefault(table, set()).add(name)
        owners = set(
            conn.execute(
                text("SELECT tableowner FROM pg_tables WHERE tablename = ANY(:t)"), {"t": TABLES}
            ).scalars()
        )
        bypass = conn.execute(
            text("SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = :r"), {"r": seeded.role}
        ).scalar_one()
        serial = {
            conn.execute(text("SELECT pg_get_serial_sequence(:t, 'id')"), {"t": table}).scalar_one()
            for table in TABLES
            if "id" in Base.metadata.tables[table].c
        }
    assert flags == {table: (True, True) for table in TABLES}
    for table in TABLES:
        assert policies.get(table) == {name for name, *_ in rls.POLICIES[table]}, table
    assert seeded.role not in owners and bypass is False
    assert {name.removeprefix("public.") for name in serial if name} == set(roles.sequences())


def test_the_app_role_is_bound_and_may_not_change_the_schema(seeded: Seeded) -> None:
    assert identity_module.policies_apply(seeded.app)
    for statement in (
        "ALTER TABLE memory_facts DISABLE ROW LEVEL SECURITY",
        "DROP POLICY memstore_read ON memory_facts",
        "ALTER TABLE memory_facts NO FORCE ROW LEVEL SECURITY",
        "SELECT set_config('row_security', 'off', false)",
    ):
        with seeded.app.connect() as conn:
            if statement.startswith("SELECT"):
                # Turning row security off makes a query that the policies filter fail, not leak.
                conn.execute(text(statement))
                with pytest.raises(DBAPIError, match="row-level security"):
                    conn.execute(text("SELECT * FROM memory_facts"))
            else:
                with pytest.raises(DBAPIError, match=r"must be owner|permission denied"):
                    conn.execute(text(statement))
            conn.rollback()


# --- reads with the WHERE clauses removed ------------------------------------------------------


def test_with_no_identity_set_every_table_is_empty(seeded: Seeded) -> None:
    with seeded.app.connect() as conn:
        assert all(not rows for rows in seeded.visible(conn).values())
        conn.rollback()
        # Settings a previous transaction on this connection set and committed are gone too.
        with conn.begin():
            _as(conn, IDENTITIES[0])
            assert seeded.visible(conn)["memory_facts"]
        assert all(not rows for rows in seeded.visible(conn).values())


@pytest.mark.parametrize("identity", IDENTITIES, ids=_label)
def test_an_identity_reads_exactly_what_the_rules_allow(seeded: Seeded, identity: Identity) -> None:
    with seeded.app.connect() as conn, conn.begin():
        _as(conn, identity)
        assert seeded.visible(conn) == expected(identity)


def test_the_rules_by_name(seeded: Seeded) -> None:
    """The oracle's answers, spelled out for the cases that matter most."""

    def facts(identity: Identity) -> set[str]:
        with seeded.app.connect() as conn, conn.begin():
            _as(conn, identity)
            return {seeded.fact_ids[i] for i in conn.execute(text("SELECT id FROM memory_facts")).scalars()}

    acme_alice = {"a_private", "a_to_bob", "a_to_support", "a_shared_to_nobody", "a_public", "b_public"}
    assert facts(Identity.of("alice", tenant_id="acme")) == acme_alice
    assert facts(Identity.of("bob", tenant_id="acme")) == {"a_to_bob", "a_public", "b_private", "b_public"}
    assert facts(Identity.of("carol", tenant_id="acme", roles=["support"])) == {
        "a_to_support",
        "a_public",
        "b_public",
    }
    assert facts(Identity.of("dave", tenant_id="acme", roles=["sales"])) == {"a_public", "b_public"}
    # admin: every shared and public fact of its tenant, no one else's private one.
    admin = facts(Identity.of("erin", tenant_id="acme", roles=["admin"]))
    assert admin == {"a_to_bob", "a_to_support", "a_shared_to_nobody", "a_public", "b_public", "e_private"}
    # The same name in another tenant reads nothing of acme's, not even with every role.
    assert facts(Identity.of("bob", tenant_id="globex", roles=["admin", "support"])) == {
        "x_to_bob",
        "x_to_support",
        "x_public",
    }
    assert facts(Identity.of("alice", tenant_id="initech", roles=["admin"])) == set()
    # The default tenant holds nothing here: the default identity reads nothing either.
    assert facts(Identity.of("alice")) == set()


def test_memstore_sets_the_identity_per_transaction_and_it_ends_with_it(seeded: Seeded) -> None:
    """identity.transaction (what the storage runs) on a one-connection pool, as a pooler hands it on."""
    alice = Identity.of("alice", tenant_id="acme")
    with identity_module.transaction(seeded.app, alice) as conn:
        assert seeded.visible(conn) == expected(alice)
        backend = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
    for end in ("commit", "rollback"):
        with seeded.app.connect() as conn:
            trans = conn.begin()
            _as(conn, alice)
            getattr(trans, end)()
            assert conn.execute(text("SELECT pg_backend_pid()")).scalar_one() == backend  # the same session
            settings = conn.execute(
                text(
                    "SELECT current_setting('memstore.tenant_id', true), "
                    "current_setting('memstore.user_id', true), current_setting('memstore.roles', true)"
                )
            ).one()
            assert all(not value for value in settings)
            assert all(not rows for rows in seeded.visible(conn).values())


# --- writes ----------------------------------------------------------------------------------------


def _refused(seeded: Seeded, identity: Identity, statement: str, **params: Any) -> None:
    with seeded.app.connect() as conn:
        conn.begin()
        _as(conn, identity)
        # A policy's check (42501 "violates row-level security policy") or, for a key column the
        # role may not update at all, its column grants (42501 "permission denied").
        with pytest.raises(
            DBAPIError, match=r"violates row-level security policy|permission denied"
        ) as refused:
            conn.execute(text(statement), params)
        assert getattr(refused.value.orig, "sqlstate", None) == "42501"
        conn.rollback()


def _changed(seeded: Seeded, identity: Identity, statement: str, **params: Any) -> int:
    """Rows ``statement`` touched as ``identity``; rolled back, so the seed stays as it is."""
    with seeded.app.connect() as conn:
        conn.begin()
        _as(conn, identity)
        count = conn.execute(text(statement), params).rowcount
        conn.rollback()
    return int(count)


FACT_INSERT = (
    "INSERT INTO memory_facts (scope_id, tenant_id, visibility, fact_id, position, content, content_key, "
    "category, confidence, extra, added_revision, updated_revision) "
    "VALUES (:scope, :tenant, 'private', :fact, 99, 'forged', 'forged', 'context', 0.5, '{}', 1, 1)"
)


DOC_INSERT = (
    "INSERT INTO memory_agent_documents (tenant_id, agent_name, user_id, path, content, chars, version, "
    "author, created_at, updated_at) VALUES (:t, 'agent', :u, '/memories/forged.md', 'forged', 6, 1, "
    "'agent', now(), now())"
)
DOC_VERSION_INSERT = (
    "INSERT INTO memory_agent_document_versions (tenant_id, agent_name, user_id, path, version, action, "
    "author, content, created_at) VALUES (:t, 'agent', :u, '/memories/agent.md', 2, 'write', 'agent', "
    "'forged', now())"
)


ITEM_INSERT = (
    "INSERT INTO memory_store_items (tenant_id, user_id, agent_name, namespace, key, value, version, "
    "created_at, updated_at) VALUES (:t, :u, '', 'forged', 'k', '{}', 1, now(), now())"
)
ITEM_HISTORY_INSERT = (
    "INSERT INTO memory_store_item_history (tenant_id, user_id, agent_name, namespace, key, version, op, "
    "value, changed_at) VALUES (:t, :u, '', 'forged', 'k', 1, 'put', '{}', now())"
)


def test_inserts_for_another_tenant_or_user_are_refused(seeded: Seeded) -> None:
    alice = Identity.of("alice", tenant_id="acme")
    own, bobs = seeded.scope_id(("acme", "alice", AGENT)), seeded.scope_id(("acme", "bob", AGENT))
    globex_alice = seeded.scope_id(("globex", "alice", AGENT))
    # A fact: into her own scope but labelled globex, into bob's scope, into globex's alice.
    _refused(seeded, alice, FACT_INSERT, scope=own, tenant="globex", fact="f1")
    _refused(seeded, alice, FACT_INSERT, scope=bobs, tenant="acme", fact="f2")
    _refused(seeded, alice, FACT_INSERT, scope=globex_alice, tenant="globex", fact="f3")
    # A scope for another tenant or user.
    for tenant, user in (("globex", "alice"), ("acme", "mallory")):
        _refused(
            seeded,
            alice,
            "INSERT INTO memory_scopes (tenant_id, user_id, agent_name) VALUES (:t, :u, 'other')",
            t=tenant,
            u=user,
        )
    # A queued conversation and a claim forged for another tenant or user.
    for tenant, user in (("globex", "alice"), ("acme", "bob")):
        _refused(
            seeded,
            alice,
            "INSERT INTO memory_queue (tenant_id, thread_id, user_id, agent_name, messages, message_chars, "
            "correction_detected, reinforcement_detected, state, generation, captured_at, pending_since, "
            "due_at, latest_due_at, enqueued_by, created_at, updated_at) VALUES (:t, 'forged', :u, 'agent', "
            "'[]', 0, false, false, 'pending', 1, now(), now(), now(), now(), 'x', now(), now())",
            t=tenant,
            u=user,
        )
        _refused(
            seeded,
            alice,
            "INSERT INTO memory_queue_claims (tenant_id, user_id, agent_name, lease_owner, lease_token, "
            "lease_expires_at, claimed_at) VALUES (:t, :u, 'other', 'w', 'x', now(), now())",
            t=tenant,
            u=user,
        )
        _refused(
            seeded,
            alice,
            "INSERT INTO memory_sessions (tenant_id, user_id, agent_name, session_id, epoch, next_seq, "
            "turn_count, token_count, created_at, updated_at, expires_at) VALUES (:t, :u, 'agent', 'forged', "
            "'e', 0, 0, 0, now(), now(), now())",
            t=tenant,
            u=user,
        )
    # A grant on someone else's fact (dave is no admin), or labelled with another tenant.
    grant = (
        "INSERT INTO memory_fact_grants (fact_row_id, grantee_kind, grantee, scope_id, tenant_id) "
        "VALUES (:fact, 'user', 'dave', :scope, :tenant)"
    )
    dave = Identity.of("dave", tenant_id="acme", roles=["sales", "editor"])
    _refused(seeded, dave, grant, fact=seeded.fact_id("a_public"), scope=own, tenant="acme")
    _refused(seeded, alice, grant, fact=seeded.fact_id("a_private"), scope=own, tenant="globex")
    _refused(
        seeded,
        Identity.of("erin", tenant_id="acme", roles=["admin"]),
        grant,
        fact=seeded.fact_id("x_public"),
        scope=globex_alice,
        tenant="globex",
    )
    # History, embeddings, sections in bob's scope; an erasure record of another tenant.
    _refused(
        seeded,
        alice,
        "INSERT INTO memory_history (scope_id, revision, entity, entity_id, action, origin) "
        "VALUES (:scope, 9, 'fact', 'forged', 'insert', 'x')",
        scope=bobs,
    )
    _refused(
        seeded,
        alice,
        "INSERT INTO memory_fact_embeddings (fact_row_id, scope_id, model, dimension, content_key, vector, "
        "embedded_at) VALUES (:fact, :scope, 'm2', 2, 'k', '{1,1}', now())",
        fact=seeded.fact_id("b_public"),
        scope=bobs,
    )
    _refused(
        seeded,
        alice,
        "INSERT INTO memory_sections (scope_id, section, summary, revision, extra) "
        "VALUES (:scope, 'topOfMind', 'forged', 1, '{}')",
        scope=bobs,
    )
    _refused(
        seeded,
        alice,
        "INSERT INTO memory_erasures (user_digest, tenant_id, erased_at) VALUES ('forged', 'globex', now())",
    )
    # An agent document, or a version of one, for another user of her tenant, or in another tenant
    # (the agent's own there too); her own and her agent's own are hers to write, as the store does.
    for tenant, user in (("acme", "bob"), ("globex", ""), ("globex", "alice")):
        _refused(seeded, alice, DOC_INSERT, t=tenant, u=user)
        _refused(seeded, alice, DOC_VERSION_INSERT, t=tenant, u=user)
    for user in ("alice", ""):
        assert _changed(seeded, alice, DOC_INSERT, t="acme", u=user) == 1
        assert _changed(seeded, alice, DOC_VERSION_INSERT, t="acme", u=user) == 1
    # A store item, or a history row of one, for another user of her tenant or in another tenant.
    for tenant, user in (("acme", "bob"), ("globex", "alice")):
        _refused(seeded, alice, ITEM_INSERT, t=tenant, u=user)
        _refused(seeded, alice, ITEM_HISTORY_INSERT, t=tenant, u=user)
    assert _changed(seeded, alice, ITEM_INSERT, t="acme", u="alice") == 1
    assert _changed(seeded, alice, ITEM_HISTORY_INSERT, t="acme", u="alice") == 1


def test_updates_and_deletes_of_rows_out_of_reach_touch_nothing(seeded: Seeded) -> None:
    zed = Identity.of("zed", tenant_id="globex", roles=["admin"])
    dave = Identity.of("dave", tenant_id="acme", roles=["editor"])
    erin = Identity.of("erin", tenant_id="acme", roles=["admin"])
    acme = ", ".join(str(i) for i, scope in seeded.scope_ids.items() if scope[0] == "acme")
    # Another tenant's rows, even for its admin: every table, named by tenant or by scope id.
    for table in TABLES:
        where = (
            "tenant_id = 'acme'" if "tenant_id" in Base.metadata.tables[table].c else f"scope_id IN ({acme})"
        )
        assert _changed(seeded, zed, f"DELETE FROM {table} WHERE {where}") == 0, table
    assert _changed(seeded, zed, "UPDATE memory_facts SET content = 'x' WHERE tenant_id = 'acme'") == 0
    # With no WHERE at all, zed (globex's admin) reaches its own and globex's shared and public facts only.
    assert _changed(seeded, zed, "UPDATE memory_facts SET confidence = 0.1") == 4
    # In the same tenant: a user without admin edits and deletes none of alice's facts, public ones included.
    assert _changed(seeded, dave, "UPDATE memory_facts SET content = 'x' WHERE fact_id LIKE 'a_%'") == 0
    assert _changed(seeded, dave, "DELETE FROM memory_facts WHERE fact_id LIKE 'a_%'") == 0
    assert _changed(seeded, dave, "DELETE FROM memory_queue WHERE user_id = 'alice'") == 0
    # admin: alice's shared and public facts yes, her private one no.
    assert _changed(seeded, erin, "UPDATE memory_facts SET content = 'x' WHERE fact_id = 'a_private'") == 0
    assert _changed(seeded, erin, "DELETE FROM memory_facts WHERE fact_id LIKE 'a_%'") == 4
    # An owner may not move its own row into another tenant or another user's hands.
    alice = Identity.of("alice", tenant_id="acme")
    _refused(seeded, alice, "UPDATE memory_facts SET tenant_id = 'globex' WHERE fact_id = 'a_private'")
    _refused(seeded, alice, "UPDATE memory_scopes SET user_id = 'mallory' WHERE user_id = 'alice'")
    _refused(seeded, alice, "UPDATE memory_queue SET tenant_id = 'globex'")
    _refused(seeded, erin, "UPDATE memory_facts SET tenant_id = 'globex' WHERE fact_id = 'a_public'")
    # Agent documents: another user's are out of reach, admin or not; the agent's own are the
    # tenant's (its agent edits them for every user), here acme's two agents' and dave's own.
    doc, versions = "memory_agent_documents", "memory_agent_document_versions"
    assert _changed(seeded, erin, f"UPDATE {doc} SET content = 'x' WHERE user_id = 'alice'") == 0
    assert _changed(seeded, dave, f"DELETE FROM {doc} WHERE user_id <> ''") == 1
    assert _changed(seeded, dave, f"DELETE FROM {versions} WHERE user_id = 'alice'") == 0
    assert _changed(seeded, dave, f"UPDATE {doc} SET content = 'x'") == 3
    assert _changed(seeded, dave, f"DELETE FROM {versions}") == 3
    # No key column is the application's to change (a user cannot take the agent's own document,
    # or hand its own to another), and versions are never updated: their text is the audit trail.
    _refused(seeded, alice, f"UPDATE {doc} SET user_id = 'bob' WHERE user_id = 'alice'")
    _refused(seeded, alice, f"UPDATE {doc} SET user_id = 'alice' WHERE user_id = ''")
    _refused(seeded, alice, f"UPDATE {doc} SET tenant_id = 'globex'")
    _refused(seeded, alice, f"UPDATE {doc} SET agent_name = 'other' WHERE agent_name = 'agent'")
    _refused(seeded, alice, f"UPDATE {versions} SET content = 'forged'")
    # The store's items: another user's are out of reach, admin or not; no key column may change
    # and the history is never updated.
    items, item_history = "memory_store_items", "memory_store_item_history"
    assert _changed(seeded, erin, f"UPDATE {items} SET value = '{{}}' WHERE user_id = 'alice'") == 0
    assert _changed(seeded, erin, f"DELETE FROM {item_history} WHERE user_id <> 'erin'") == 0
    assert _changed(seeded, erin, f"UPDATE {items} SET value = '{{}}'") == 1
    _refused(seeded, alice, f"UPDATE {items} SET user_id = 'bob'")
    _refused(seeded, alice, f"UPDATE {items} SET tenant_id = 'globex'")
    _refused(seeded, alice, f"UPDATE {item_history} SET value = 'forged'")


# --- the role, the command and the operator's connection ----------------------------------------


def _server(pg_server_url: str) -> Engine:
    return create_engine(
        make_url(pg_server_url).set(drivername="postgresql+psycopg"), isolation_level="AUTOCOMMIT"
    )


def test_grant_app_role_creates_a_bound_role_without_the_password_in_argv_or_output(
    postgres_url: str, pg_server_url: str, tmp_path: Path
) -> None:
    role, password = f"memstore_app_{uuid.uuid4().hex[:12]}", f"pw-{uuid.uuid4().hex}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTORE_")}
    cli = Cli({**env, "MEMSTORE_DATABASE_URL": postgres_url, "APP_PW": password}, postgres_url)
    server = _server(pg_server_url)
    try:
        printed = cli("db", "grant-app-role", role, "--create", "--password-env", "APP_PW", "--print")
        assert printed.returncode == 0, printed.stderr
        assert (
            printed.stdout.splitlines()[0]
            == f'CREATE ROLE "{role}" LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEROLE NOCREATEDB;'
        )
        assert all(statement + ";" in printed.stdout for statement in roles.grant_statements(role))
        with server.connect() as conn:  # --print ran nothing
            assert (
                conn.execute(
                    text("SELECT count(*) FROM pg_roles WHERE rolname = :r"), {"r": role}
                ).scalar_one()
                == 0
            )
        created = cli("db", "grant-app-role", role, "--create", "--password-env", "APP_PW")
        assert created.returncode == 0, created.stderr
        assert f'ALTER ROLE "{role}" PASSWORD ***;' in created.stdout
        assert password not in created.stdout + created.stderr
        with server.connect() as conn:
            stored = conn.execute(
                text("SELECT rolpassword FROM pg_authid WHERE rolname = :r"), {"r": role}
            ).scalar_one()
        assert stored.startswith(("SCRAM-SHA-256$", "md5")) and password not in stored
        again = cli("db", "grant-app-role", role)  # idempotent: after a db upgrade that adds a table
        assert again.returncode == 0, again.stderr
        assert "already exists" in cli("db", "grant-app-role", role, "--create").stderr
        superuser = cli("db", "grant-app-role", str(make_url(pg_server_url).username or "postgres"))
        assert superuser.returncode == 1 and "superuser or has BYPASSRLS" in superuser.stderr
        app = create_engine(make_url(postgres_url).set(username=role, password=password))
        try:
            assert identity_module.policies_apply(app)
        finally:
            app.dispose()
    finally:
        dispose_engines()
        _drop_role(server, postgres_url, role)
    sqlite = Cli({**env, "MEMSTORE_DATA_DIR": str(tmp_path)}, "")
    refused = sqlite("db", "grant-app-role", role)
    assert refused.returncode == 2 and "SQLite has no roles or row-level security" in refused.stderr


def _drop_role(server: Engine, url: str, role: str) -> None:
    """Its grants live in the database (dropped later by its fixture), the role in the cluster."""
    with server.connect() as conn:
        exists = conn.execute(
            text("SELECT count(*) FROM pg_roles WHERE rolname = :r"), {"r": role}
        ).scalar_one()
    if exists:
        database = create_engine(url, isolation_level="AUTOCOMMIT")
        with database.connect() as conn:
            conn.execute(text(f'DROP OWNED BY "{role}"'))
        database.dispose()
        with server.connect() as conn:
            conn.execute(text(f'DROP ROLE "{role}"'))
    server.dispose()


@pytest.fixture
def app_url(postgres_url: str) -> Iterator[str]:
    """A fresh migrated database's URL as a new application role (dropped afterwards)."""
    with app_role_url(postgres_url) as url:
        yield url


def _scope_with_fact(conn: Connection, tenant: str, user: str, visibility: str = "private") -> int:
    scope_id = conn.execute(
        insert(scopes_table)
        .values(tenant_id=tenant, user_id=user, agent_name=AGENT)
        .returning(scopes_table.c.id)
    ).scalar_one()
    row_id = conn.execute(
        insert(facts_table)
        .values(
            scope_id=scope_id,
            tenant_id=tenant,
            visibility=visibility,
            fact_id=f"{tenant}-{user}",
            position=0,
            content=f"fact of {tenant}/{user}",
            content_key=f"{tenant}/{user}",
            category="context",
            confidence=0.9,
            extra={},
            added_revision=1,
            updated_revision=1,
        )
        .returning(facts_table.c.id)
    ).scalar_one()
    conn.execute(insert(history_table).values(_history(scope_id, "fact", f"{tenant}-{user}")))
    conn.execute(insert(queue_table).values(_queued(tenant, user, AGENT)))
    return int(row_id)


def test_erase_and_vacuum_cross_tenants_on_the_operator_connection_only(
    app_url: str, postgres_url: str, isolated_config: MemoryConfig
) -> None:
    """Erasing alice in acme leaves globex's alice; on the bound app role alone, both refuse."""
    admin = create_engine(postgres_url)
    with admin.begin() as conn:
        _scope_with_fact(conn, "acme", "alice")
        _scope_with_fact(conn, "globex", "alice")
        bobs = _scope_with_fact(conn, "acme", "bob", "shared")
        bob_scope = conn.execute(
            text("SELECT scope_id FROM memory_facts WHERE id = :i"), {"i": bobs}
        ).scalar_one()
        conn.execute(
            insert(grants_table).values(
                fact_row_id=bobs, grantee_kind="user", grantee="alice", scope_id=bob_scope, tenant_id="acme"
            )
        )
    app = get_engine(app_url)
    isolated_config.database_url = app_url
    with pytest.raises(ConfigError, match="operator_database_url"):
        erase.erase_user(app, "alice", NOW, tenant_id="acme")
    with pytest.raises(ConfigError, match="operator_database_url"):
        erase.vacuum_counts(app, NOW)
    isolated_config.operator_database_url = postgres_url
    counts = erase.erase_user(app, "alice", NOW, tenant_id="acme")
    assert counts["memory_scopes"] == counts["memory_facts"] == counts["memory_queue"] == 1
    assert counts["memory_fact_grants"] == 1  # bob's grant naming her went too
    with admin.connect() as conn:
        left = {tuple(row) for row in conn.execute(text("SELECT tenant_id, user_id FROM memory_scopes"))}
        assert left == {("globex", "alice"), ("acme", "bob")}
        assert {
            tuple(row) for row in conn.execute(text("SELECT tenant_id, user_id FROM memory_queue"))
        } == left
        assert conn.execute(text("SELECT count(*) FROM memory_fact_grants")).scalar_one() == 0
        erasures = [
            tuple(row) for row in conn.execute(text("SELECT user_digest, tenant_id FROM memory_erasures"))
        ]
        assert erasures == [(erase.erasure_digest("acme", "alice"), "acme")]
        assert (
            erase.erased_at(conn, "alice", "acme") == NOW and erase.erased_at(conn, "alice", "globex") is None
        )
    assert erase.erasure_digest("default", "alice") == hashlib.sha256(b"alice").hexdigest()
    assert erase.erasure_digest("acme", "alice") == hashlib.sha256(b"acme\0alice").hexdigest()
    assert erase.vacuum_counts(app, NOW + timedelta(days=1))["memory_erasures"] == 1
    admin.dispose()


def test_doctor_says_whether_the_policies_bind_each_connection(
    app_url: str, postgres_url: str, isolated_config: MemoryConfig
) -> None:
    def rls(**settings: str) -> tuple[str, str]:
        found = {f.part: f for f in diagnose(isolated_config.model_copy(update=settings))}
        return found["rls"].verdict, found["rls"].detail

    verdict, detail = rls(database_url=app_url)
    assert verdict == "fail" and "operator_database_url is not set" in detail
    assert "cannot claim across tenants" in detail and "MEMSTORE_OPERATOR_DATABASE_URL" in detail
    verdict, detail = rls(database_url=app_url, operator_database_url=postgres_url)
    assert verdict == "ok" and "is bound by row-level security" in detail and "bypasses it" in detail
    verdict, detail = rls(database_url=app_url, operator_database_url=app_url)
    assert verdict == "fail" and "BYPASSRLS" in detail
    verdict, detail = rls(database_url=postgres_url)
    assert verdict == "ok" and "bypasses row-level security" in detail
    admin = create_engine(postgres_url)
    with admin.begin() as conn:
        _scope_with_fact(conn, "acme", "alice")
        _scope_with_fact(conn, "globex", "alice")
    admin.dispose()
    verdict, detail = rls(database_url=postgres_url)
    assert verdict == "warn" and detail.startswith("2 tenants, and the application's role")


def test_the_hostile_reviews_holes_stay_closed(seeded: Seeded) -> None:
    """Each of these worked before the column grants, the grants' composite key, the vectors'
    fact check and the read-only erasures: now each is refused."""
    bob = Identity.of("bob", tenant_id="acme")
    erin = Identity.of("erin", tenant_id="acme", roles=["admin"])
    alices = seeded.scope_id(("acme", "alice", AGENT))
    bobs = seeded.scope_id(("acme", "bob", AGENT))
    nobodys = seeded.fact_id("a_shared_to_nobody")
    # An admin (or anyone) cannot take another user's scope, or move a fact between scopes.
    _refused(seeded, erin, "UPDATE memory_scopes SET user_id = 'erin' WHERE id = :s", s=alices)
    _refused(seeded, erin, "UPDATE memory_facts SET scope_id = :s WHERE id = :f", s=alices, f=nobodys)
    # Nobody grants themselves another owner's shared fact under a scope of their own.
    grant = (
        "INSERT INTO memory_fact_grants (fact_row_id, grantee_kind, grantee, scope_id, tenant_id) "
        "VALUES (:f, 'user', 'bob', :s, 'acme')"
    )
    with seeded.app.connect() as conn:
        conn.begin()
        _as(conn, bob)
        with pytest.raises(DBAPIError, match=r"foreign key|row-level security"):
            conn.execute(text(grant), {"f": nobodys, "s": bobs})
        conn.rollback()
    # Nor plants a vector on another owner's fact.
    _refused(
        seeded,
        bob,
        "INSERT INTO memory_fact_embeddings (fact_row_id, scope_id, model, dimension, content_key, vector, "
        "embedded_at) VALUES (:f, :s, 'm', 1, 'k', ARRAY[1.0]::real[], now())",
        f=seeded.fact_id("a_public"),
        s=bobs,
    )
    # Erasures are written by an erase (the operator's connection) only; the audit trail's text
    # cannot be rewritten.
    _refused(
        seeded,
        bob,
        "INSERT INTO memory_erasures (user_digest, tenant_id, erased_at) VALUES ('x', 'acme', now())",
    )
    _refused(seeded, bob, "UPDATE memory_history SET origin = 'forged'")
