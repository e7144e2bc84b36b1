"""The tenant's ``admin`` edits and deletes other users' shared and public facts, never their
private ones, and nobody else edits another user's facts (issue 31's matrix). SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from memstore.config import MemoryConfig
from memstore.errors import AccessDeniedError, FactNotFoundError, TenantQuotaError
from memstore.ops.facts import create_memory_fact, delete_memory_fact, get_memory_data, update_memory_fact
from memstore.storage.loader import get_memory_storage, reset_memory_storage
from memstore.storage.sql import SqlMemoryStorage

ACME = "acme"


def _ids_by_content(user: str, tenant: str = ACME) -> dict[str, str]:
    memory = get_memory_data(user_id=user, tenant_id=tenant)
    return {fact["content"]: fact["id"] for fact in memory["facts"]}


@pytest.fixture
def alice_facts(sql_storage: SqlMemoryStorage) -> dict[str, str]:
    """Alice (an editor in acme) holds one private, one shared and one public fact."""
    create_memory_fact("alice private note", user_id="alice", tenant_id=ACME)
    create_memory_fact(
        "alice shared note",
        user_id="alice",
        tenant_id=ACME,
        roles=["editor"],
        visibility="shared",
        allowed_users=["bob"],
    )
    create_memory_fact(
        "alice public note", user_id="alice", tenant_id=ACME, roles=["editor"], visibility="public"
    )
    return _ids_by_content("alice")


def test_admin_edits_and_deletes_shared_and_public_facts_of_another_user(alice_facts: dict[str, str]) -> None:
    shared, public = alice_facts["alice shared note"], alice_facts["alice public note"]
    returned = update_memory_fact(
        shared,
        content="edited by the admin",
        user_id="erin",
        tenant_id=ACME,
        roles=["admin"],
        owner_id="alice",
    )
    # What the admin gets back is what it may read: never the owner's private facts.
    assert {fact["content"] for fact in returned["facts"]} == {"edited by the admin", "alice public note"}
    after_delete = delete_memory_fact(
        public, user_id="erin", tenant_id=ACME, roles=["admin"], owner_id="alice"
    )
    assert [fact["content"] for fact in after_delete["facts"]] == ["edited by the admin"]
    assert set(_ids_by_content("alice")) == {"alice private note", "edited by the admin"}
    # The edit kept the fact's visibility and its grant.
    [edited] = [f for f in get_memory_data(user_id="alice", tenant_id=ACME)["facts"] if f["id"] == shared]
    assert (edited["visibility"], edited["allowedUsers"]) == ("shared", ["bob"])


def test_admin_never_reaches_a_private_fact_and_may_not_make_one(alice_facts: dict[str, str]) -> None:
    private, shared = alice_facts["alice private note"], alice_facts["alice shared note"]
    admin = {"user_id": "erin", "tenant_id": ACME, "roles": ["admin"], "owner_id": "alice"}
    with pytest.raises(FactNotFoundError):
        update_memory_fact(private, content="seen", **admin)  # type: ignore[arg-type]
    with pytest.raises(FactNotFoundError):
        delete_memory_fact(private, **admin)  # type: ignore[arg-type]
    with pytest.raises(AccessDeniedError, match="owner may make a fact private"):
        update_memory_fact(shared, visibility="private", **admin)  # type: ignore[arg-type]
    assert set(_ids_by_content("alice")) == set(alice_facts)


def test_only_the_owner_and_admin_edit_another_users_fact(alice_facts: dict[str, str]) -> None:
    shared = alice_facts["alice shared note"]
    for roles in ([], ["editor"], ["finance"]):
        with pytest.raises(AccessDeniedError, match="owner or the tenant's admin"):
            update_memory_fact(
                shared, content="x", user_id="bob", tenant_id=ACME, roles=roles, owner_id="alice"
            )
        with pytest.raises(AccessDeniedError):
            delete_memory_fact(shared, user_id="bob", tenant_id=ACME, roles=roles, owner_id="alice")
    # Another tenant's admin finds nothing: alice of globex is another person with no such fact.
    with pytest.raises(FactNotFoundError):
        delete_memory_fact(shared, user_id="zed", tenant_id="globex", roles=["admin"], owner_id="alice")
    assert set(_ids_by_content("alice")) == set(alice_facts)
    # The owner edits its own shared fact without any role.
    update_memory_fact(shared, content="alice edited", user_id="alice", tenant_id=ACME)
    assert "alice edited" in _ids_by_content("alice")


def test_every_writer_needs_editor_to_share(sql_storage: SqlMemoryStorage) -> None:
    """The rule holds in the storage itself, for writers that skip the fact helpers (the DeerFlow
    adapters, a direct save): sharing a fact, or changing whom it is shared with, needs a role."""
    plain = sql_storage.for_identity(ACME)
    public = {"id": "fact_00000001", "content": "mallory says hi", "visibility": "public"}
    with pytest.raises(AccessDeniedError, match="editor or admin"):
        plain.save({"facts": [public]}, user_id="mallory")
    assert plain.reload(user_id="mallory")["facts"] == []
    editor = sql_storage.for_identity(ACME, ["editor"])
    shared = {"id": "fact_00000002", "content": "team note", "visibility": "shared", "allowedUsers": ["bob"]}
    assert editor.save({"facts": [shared]}, user_id="mallory")
    # Without the role: keeping the fact as shared is fine, widening its grants is not, making it
    # private is.
    stored = plain.load(user_id="mallory")
    stored["facts"][0]["content"] = "team note, edited"
    assert plain.save(stored, user_id="mallory")
    widened = plain.load(user_id="mallory")
    widened["facts"][0]["allowedUsers"] = ["bob", "carol"]
    with pytest.raises(AccessDeniedError):
        plain.save(widened, user_id="mallory")
    private = plain.load(user_id="mallory")
    private["facts"][0] = {
        key: value for key, value in private["facts"][0].items() if key not in ("visibility", "allowedUsers")
    }
    assert plain.save(private, user_id="mallory")
    assert "visibility" not in plain.reload(user_id="mallory")["facts"][0]


def test_a_tenant_at_its_fact_cap_is_refused_while_another_tenant_still_saves(
    sql_storage: SqlMemoryStorage, isolated_config: MemoryConfig
) -> None:
    isolated_config.tenant_max_facts = 3
    reset_memory_storage()
    storage = get_memory_storage()
    acme = storage.for_identity(ACME)
    assert acme.save({"facts": [{"content": f"acme fact {i}"} for i in range(2)]}, user_id="alice")
    assert acme.save({"facts": [{"content": "bob fact"}]}, user_id="bob")
    with pytest.raises(TenantQuotaError, match="tenant acme holds 3 live facts and tenant_max_facts is 3"):
        acme.save({"facts": [{"content": "one too many"}]}, user_id="carol")
    assert acme.reload(user_id="carol")["facts"] == []
    # Over HTTP and in the tools it is a refusal (403), like any AccessDeniedError.
    assert issubclass(TenantQuotaError, AccessDeniedError)
    # Another tenant is not held back; and replacing a fact (one out, one in) still fits.
    assert storage.for_identity("globex").save({"facts": [{"content": "globex fact"}]}, user_id="alice")
    bob = acme.load(user_id="bob")
    bob["facts"] = [{"content": "bob's new fact"}]
    assert acme.save(bob, user_id="bob")
