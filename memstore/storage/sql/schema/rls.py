"""PostgreSQL row-level security on every memory table, created by Alembic revisions 0008 to 0013.

Each policy reads the identity memstore sets at the start of every transaction with
``set_config(name, value, true)`` (``storage/sql/identity.py``): ``memstore.tenant_id``,
``memstore.user_id`` (``''`` for a call that names no user) and ``memstore.roles`` (comma
separated). Transaction-local settings are what a transaction-mode pooler passes through intact.
A transaction that set nothing reads ``NULL`` (or ``''`` once the session has set it before);
no tenant id is ``''``, so it sees no row. ``FORCE`` puts the tables' owner under the policies
too: only a superuser or a ``BYPASSRLS`` role (the operator connection) reads across tenants.

The rules (docs/operations.md, "Tenants and row-level security"):

- a scope row (ids, agent name, revision: no memory): read by everyone in its tenant, so a
  shared fact can be joined to its agent; written by its owner (``admin`` may bump its revision,
  to edit a shared fact in it);
- a scope's sections, its derived snapshot (revision 0013), queue rows and claims: the owner only;
- a fact: its owner; ``public`` ones everyone in the tenant; ``shared`` ones the granted users and
  roles, and ``admin``. Writes: the owner, and ``admin`` on shared and public facts;
- grants: the owner of the fact, the grantee, ``admin``;
- tags: whoever may read the fact; written by its owner (revision 0009);
- relations: the owner of the scope (revision 0009);
- history: the owner's scope, plus the rows of facts the identity may read;
- embeddings: those of facts the identity may read; written by the owner;
- erasures: the tenant's;
- sessions and their turns: the owner only (revision 0010);
- an agent's documents: everyone in the tenant reads and writes the agent's own (``user_id``
  ``''``: the agent edits them for whichever user it serves), a user's documents their user only;
  their versions likewise, never updated (an erase, on the operator connection, forgets a user's
  name in them) (revision 0011);
- the LangGraph store's items and their history: the owner only; the history is never updated
  (revision 0012).

SQLite has no row-level security: memstore's own statements carry the same predicates there, and
the leak tests run every read path on both dialects.
"""

from __future__ import annotations

TENANT = "current_setting('memstore.tenant_id', true)"
USER = "current_setting('memstore.user_id', true)"
ROLES = "string_to_array(current_setting('memstore.roles', true), ',')"
IS_ADMIN = f"'admin' = ANY({ROLES})"
OWN_SCOPES = (
    f"(SELECT s.id FROM memory_scopes s WHERE s.tenant_id = {TENANT} AND coalesce(s.user_id, '') = {USER})"
)
_GRANTED = (
    "EXISTS (SELECT 1 FROM memory_fact_grants g WHERE g.fact_row_id = memory_facts.id "
    "AND g.scope_id = memory_facts.scope_id AND "
    f"((g.grantee_kind = 'user' AND g.grantee = {USER}) "
    f"OR (g.grantee_kind = 'role' AND g.grantee = ANY({ROLES}))))"
)
_FACT_READABLE = (
    f"tenant_id = {TENANT} AND (scope_id IN {OWN_SCOPES} OR (deleted_revision IS NULL AND "
    f"(visibility = 'public' OR (visibility = 'shared' AND ({IS_ADMIN} OR {_GRANTED})))))"
)
# A tag's or vector's fact, by id and scope: on the partitioned layout (``db partition``) fact ids
# are unique per scope only, so an id alone could name another user's fact.
_FACT_ROW_READABLE = "(fact_row_id, scope_id) IN (SELECT f.id, f.scope_id FROM memory_facts f)"
_FACT_OWNED = f"tenant_id = {TENANT} AND scope_id IN {OWN_SCOPES}"
_FACT_ADMINISTERED = f"tenant_id = {TENANT} AND visibility <> 'private' AND {IS_ADMIN}"
_SCOPE_OWNED = f"tenant_id = {TENANT} AND coalesce(user_id, '') = {USER}"
_AGENT_DOC = f"tenant_id = {TENANT} AND (user_id = '' OR user_id = {USER})"
_USER_OWNED = f"tenant_id = {TENANT} AND user_id = {USER}"

POLICIES: dict[str, tuple[tuple[str, str, str | None, str | None], ...]] = {
    # table: (policy name, command, USING, WITH CHECK)
    "memory_scopes": (
        ("memstore_owner", "ALL", _SCOPE_OWNED, _SCOPE_OWNED),
        # The scope rows (ids, agent names, revisions: no memory) of the tenant, so a shared fact
        # can be joined to its agent; sections and facts keep their own, narrower policies.
        ("memstore_tenant_read", "SELECT", f"tenant_id = {TENANT}", None),
        # Its WITH CHECK names admin too: PostgreSQL ORs the checks of every UPDATE policy, so a
        # bare tenant check here would let any owner hand its scope to another user.
        (
            "memstore_admin_bump",
            "UPDATE",
            f"tenant_id = {TENANT} AND {IS_ADMIN}",
            f"tenant_id = {TENANT} AND {IS_ADMIN}",
        ),
    ),
    "memory_sections": (("memstore_owner", "ALL", f"scope_id IN {OWN_SCOPES}", f"scope_id IN {OWN_SCOPES}"),),
    # A scope's derived document (revision 0013): its owner's, like the sections it repeats.
    "memory_scope_snapshots": (
        ("memstore_owner", "ALL", f"scope_id IN {OWN_SCOPES}", f"scope_id IN {OWN_SCOPES}"),
    ),
    "memory_facts": (
        ("memstore_read", "SELECT", _FACT_READABLE, None),
        ("memstore_owner_insert", "INSERT", None, _FACT_OWNED),
        ("memstore_owner_update", "UPDATE", _FACT_OWNED, _FACT_OWNED),
        ("memstore_owner_delete", "DELETE", _FACT_OWNED, None),
        ("memstore_admin_update", "UPDATE", _FACT_ADMINISTERED, _FACT_ADMINISTERED),
        ("memstore_admin_delete", "DELETE", _FACT_ADMINISTERED, None),
    ),
    "memory_fact_grants": (
        (
            "memstore_read",
            "SELECT",
            f"tenant_id = {TENANT} AND (scope_id IN {OWN_SCOPES} OR {IS_ADMIN} "
            f"OR (grantee_kind = 'user' AND grantee = {USER}) "
            f"OR (grantee_kind = 'role' AND grantee = ANY({ROLES})))",
            None,
        ),
        (
            "memstore_write",
            "ALL",
            f"tenant_id = {TENANT} AND (scope_id IN {OWN_SCOPES} OR {IS_ADMIN})",
            f"tenant_id = {TENANT} AND (scope_id IN {OWN_SCOPES} OR {IS_ADMIN})",
        ),
    ),
    # A fact's tags: read where the fact is (the subquery runs under memory_facts' own policies).
    "memory_fact_tags": (
        ("memstore_read", "SELECT", _FACT_ROW_READABLE, None),
        (
            "memstore_owner_write",
            "ALL",
            f"tenant_id = {TENANT} AND scope_id IN {OWN_SCOPES}",
            f"tenant_id = {TENANT} AND scope_id IN {OWN_SCOPES}",
        ),
    ),
    # Relations link facts of one scope: its owner's alone, like the history they explain.
    "memory_fact_relations": (
        (
            "memstore_owner",
            "ALL",
            f"tenant_id = {TENANT} AND scope_id IN {OWN_SCOPES}",
            f"tenant_id = {TENANT} AND scope_id IN {OWN_SCOPES}",
        ),
    ),
    # A fact's past versions are its owner's alone: an earlier text may predate its sharing.
    "memory_history": (
        ("memstore_owner_read", "SELECT", f"scope_id IN {OWN_SCOPES}", None),
        ("memstore_owner_insert", "INSERT", None, f"scope_id IN {OWN_SCOPES}"),
        ("memstore_owner_update", "UPDATE", f"scope_id IN {OWN_SCOPES}", f"scope_id IN {OWN_SCOPES}"),
    ),
    "memory_fact_embeddings": (
        ("memstore_read", "SELECT", _FACT_ROW_READABLE, None),
        (
            "memstore_owner_write",
            "ALL",
            f"scope_id IN {OWN_SCOPES}",
            # The vector's fact must be in the same, own scope: no vector planted on another's fact.
            f"scope_id IN {OWN_SCOPES} AND {_FACT_ROW_READABLE}",
        ),
    ),
    # Read by the save's erasure fence; written only by an erase, on the operator connection.
    "memory_erasures": (("memstore_tenant_read", "SELECT", f"tenant_id = {TENANT}", None),),
    "memory_queue": (
        (
            "memstore_owner",
            "ALL",
            f"tenant_id = {TENANT} AND user_id = {USER}",
            f"tenant_id = {TENANT} AND user_id = {USER}",
        ),
    ),
    # A session and its turns are their user's alone (revision 0010).
    "memory_sessions": (
        (
            "memstore_owner",
            "ALL",
            f"tenant_id = {TENANT} AND user_id = {USER}",
            f"tenant_id = {TENANT} AND user_id = {USER}",
        ),
    ),
    "memory_session_turns": (
        (
            "memstore_owner",
            "ALL",
            f"tenant_id = {TENANT} AND user_id = {USER}",
            f"tenant_id = {TENANT} AND user_id = {USER}",
        ),
    ),
    # An agent's documents (revision 0011): its own shared in the tenant, a user's their own.
    "memory_agent_documents": (("memstore_agent_doc", "ALL", _AGENT_DOC, _AGENT_DOC),),
    # Versions: read, added and pruned (no update) where their document is.
    "memory_agent_document_versions": (
        ("memstore_read", "SELECT", _AGENT_DOC, None),
        ("memstore_insert", "INSERT", None, _AGENT_DOC),
        ("memstore_prune", "DELETE", _AGENT_DOC, None),
    ),
    # The LangGraph store's items are their user's alone (revision 0012); their history is read,
    # added and pruned by that user, never updated.
    "memory_store_items": (("memstore_owner", "ALL", _USER_OWNED, _USER_OWNED),),
    "memory_store_item_history": (
        ("memstore_read", "SELECT", _USER_OWNED, None),
        ("memstore_insert", "INSERT", None, _USER_OWNED),
        ("memstore_prune", "DELETE", _USER_OWNED, None),
    ),
    "memory_queue_claims": (
        (
            "memstore_owner",
            "ALL",
            f"tenant_id = {TENANT} AND user_id = {USER}",
            f"tenant_id = {TENANT} AND user_id = {USER}",
        ),
    ),
}
"""Every memory table and its policies; a table missing here fails ``test_row_level_security``."""


def create_statements(tables: tuple[str, ...] | None = None) -> list[str]:
    """``ENABLE`` + ``FORCE`` row-level security and ``CREATE POLICY`` for each table."""
    statements: list[str] = []
    for table, policies in POLICIES.items():
        if tables is not None and table not in tables:
            continue
        statements.append(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        statements.append(f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY")
        for name, command, using, check in policies:
            clauses = f" USING ({using})" if using else ""
            clauses += f" WITH CHECK ({check})" if check else ""
            statements.append(f"CREATE POLICY {name} ON {table} FOR {command}{clauses}")
    return statements


def drop_statements(tables: tuple[str, ...] | None = None) -> list[str]:
    """The reverse of ``create_statements``."""
    statements: list[str] = []
    for table, policies in POLICIES.items():
        if tables is not None and table not in tables:
            continue
        statements.extend(f"DROP POLICY {name} ON {table}" for name, *_ in policies)
        statements.append(f"ALTER TABLE {table} NO FORCE ROW LEVEL SECURITY")
        statements.append(f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY")
    return statements
