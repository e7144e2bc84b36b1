"""The console's JSON routes driven over HTTP (no browser): hostile input is a 4xx with the security
headers and never a 500, a tenant's admin stays in the tenant, an edit of a fact that changed since
the page was read is refused, the audit trail names the operator, the lifecycle refuses a dry run
the facts outgrew, and the agent documents' scopes are paged. On SQLite and on PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from memstore.agent_doc import MAIN_DOC_PATH, DocScope
from memstore.cli.serve_app import create_app, header_roles, header_tenant, header_user
from memstore.config import MemoryConfig
from memstore.console.app import create_console_app
from memstore.console.inputs import MAX_OFFSET
from memstore.console.security import CONTENT_SECURITY_POLICY, CSRF_COOKIE, CSRF_HEADER
from memstore.ops.agent_docs import reset_agent_doc_stores, write_doc
from memstore.ops.facts import create_memory_fact_with_created_fact, update_memory_fact
from memstore.ops.queries import memory_history
from memstore.storage.loader import get_memory_storage, reset_memory_storage
from memstore.storage.records import FactFilter
from tests.browser.seed import age_fact

OPS = {"X-User": "ops", "X-Tenant": "default", "X-Roles": "admin"}
ACME_ADMIN = {"X-User": "boss", "X-Tenant": "acme", "X-Roles": "admin"}
HUGE = str(10**20)


@pytest.fixture
def client(sql_url: str, isolated_config: MemoryConfig) -> Iterator[TestClient]:
    """``memstore serve --console``'s app on a fresh database, with the proxy's three headers."""
    isolated_config.database_url = sql_url
    isolated_config.expire_below = 0.3
    reset_memory_storage()
    reset_agent_doc_stores()
    app = create_app(
        header_user("X-User"),
        allowed_hosts=["testserver"],
        max_body_bytes=1 << 20,
        tenant=header_tenant("X-Tenant"),
        roles=header_roles("X-Roles"),
        console=True,
    )
    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client
    reset_agent_doc_stores()
    reset_memory_storage()


def _fact(content: str, user: str, **fields: object) -> str:
    _, fact = create_memory_fact_with_created_fact(content, "context", user_id=user, **fields)  # type: ignore[arg-type]
    return str(fact["id"])


def _mutation_headers(client: TestClient, identity: dict[str, str]) -> dict[str, str]:
    """``identity`` plus the CSRF token of a shell the caller loaded."""
    assert client.get("/console/", headers=identity).status_code == 200
    token = client.cookies.get(CSRF_COOKIE)
    assert token
    return {**identity, CSRF_HEADER: token, "Content-Type": "application/json"}


def _contents(user: str, tenant: str = "default") -> dict[str, str]:
    stored = get_memory_storage().for_identity(tenant).reload(user_id=user)
    return {fact["id"]: fact["content"] for fact in stored["facts"]}


def test_hostile_input_is_a_4xx_with_the_headers_never_a_500(client: TestClient) -> None:
    fact = _fact("Alice likes tea", "alice")
    headers = _mutation_headers(client, OPS)
    reads = [
        f"users?offset={HUGE}",
        f"users?offset={MAX_OFFSET + 1}",
        "users?offset=-1",
        "users?q=a%00b",
        "users?limit=100000",
        f"users/alice/facts?offset={HUGE}",
        "users/alice/facts?category=a%00b",
        "users/alice/facts?text=a%00b",
        "users/alice/facts/x%00y/history",
        "users/alice/facts?agent=a%00b",
        f"search?q=tea&offset={HUGE}",
        "search?q=tea&category=a%00",
        f"users/alice/sessions?offset={HUGE}",
        f"queue?offset={HUGE}",
        f"queue/purge-preview?ids={HUGE}",
        "queue/purge-preview?ids=0",
        f"agent-docs?offset={HUGE}",
    ]
    for path in reads:
        answer = client.get(f"/console/api/{path}", headers=OPS)
        assert 400 <= answer.status_code < 500, (path, answer.status_code, answer.text)
        assert answer.headers["content-security-policy"] == CONTENT_SECURITY_POLICY, path
    writes = [
        ("POST", "queue/purge", f'{{"ids": [{HUGE}]}}'),
        ("POST", "queue/retry", '{"ids": [0]}'),
        ("PATCH", f"users/alice/facts/{fact}", '{"content": "lone \\ud800 surrogate"}'),
        ("PATCH", f"users/alice/facts/{fact}", '{"\\ud800": 1}'),
    ]
    for method, path, body in writes:
        answer = client.request(method, f"/console/api/{path}", headers=headers, content=body)
        assert 400 <= answer.status_code < 500, (path, answer.status_code, answer.text)
        assert answer.headers["content-security-policy"] == CONTENT_SECURITY_POLICY, path
    assert _contents("alice") == {fact: "Alice likes tea"}


def test_a_read_made_by_another_sites_page_is_refused(client: TestClient) -> None:
    for site, status in (("cross-site", 403), ("same-site", 403), ("same-origin", 200), ("none", 200)):
        answer = client.get("/console/api/lifecycle?tenant=*", headers={**OPS, "Sec-Fetch-Site": site})
        assert answer.status_code == status, site
    assert client.get("/console/", headers={**OPS, "Sec-Fetch-Site": "cross-site"}).status_code == 200


def test_an_unexpected_error_still_carries_the_headers() -> None:
    app = create_console_app(lambda: "ops", roles=lambda: frozenset({"admin"}))

    def broken() -> None:
        raise RuntimeError("a bug")

    app.add_api_route("/api/broken", broken)
    answer = TestClient(app, raise_server_exceptions=False).get("/api/broken")
    assert answer.status_code == 500
    assert answer.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert answer.headers["cache-control"] == "no-store"


def test_an_admin_of_another_tenant_never_reaches_the_default_tenant(client: TestClient) -> None:
    alice = _fact("Alice likes tea", "alice")
    headers = _mutation_headers(client, ACME_ADMIN)
    for path in (
        "users?tenant=default",
        "users/alice/memory?tenant=default",
        "users/alice/facts?tenant=default",
        f"users/alice/facts/{alice}/history?tenant=default",
        "users/alice/context?tenant=default",
        "users/alice/sessions?tenant=default",
        "search?q=tea&tenant=default",
        "agent-docs?tenant=default",
        "lifecycle?tenant=default",
        "lifecycle?tenant=*",
        "queue",
    ):
        assert client.get(f"/console/api/{path}", headers=ACME_ADMIN).status_code == 403, path
    assert client.get("/console/api/tenants", headers=ACME_ADMIN).json()["tenants"] == []
    edit = f"/console/api/users/alice/facts/{alice}"
    other_tenant = client.patch(f"{edit}?tenant=default", headers=headers, content='{"content": "x"}')
    assert other_tenant.status_code == 403
    assert client.delete(f"{edit}?tenant=default", headers=headers).status_code == 403
    # The same ids in the admin's own tenant name nothing there.
    assert client.patch(edit, headers=headers, content='{"content": "x"}').status_code == 404
    assert client.delete(edit, headers=headers).status_code == 404
    assert client.get(f"{edit}/history", headers=ACME_ADMIN).json()["versions"] == []
    assert _contents("alice") == {alice: "Alice likes tea"}
    twice = [("X-User", "boss"), ("X-User", "ops"), ("X-Tenant", "acme"), ("X-Roles", "admin")]
    assert client.get("/console/api/me", headers=twice).status_code == 400


def test_an_edit_of_a_fact_changed_meanwhile_is_refused_and_the_operator_is_audited(
    client: TestClient,
) -> None:
    fact = _fact("Carol prefers window seats", "carol")
    headers = _mutation_headers(client, OPS)
    [listed] = client.get("/console/api/users/carol/facts", headers=OPS).json()["facts"]
    update_memory_fact(fact, "Carol prefers aisle seats", user_id="carol")  # another writer, meanwhile
    path = f"/console/api/users/carol/facts/{fact}"
    stale = client.patch(path, headers=headers, json={"importance": 0.9, "version": listed["version"]})
    assert stale.status_code == 409, stale.text
    assert client.delete(f"{path}?version={listed['version']}", headers=headers).status_code == 409
    assert _contents("carol") == {fact: "Carol prefers aisle seats"}

    [fresh] = client.get("/console/api/users/carol/facts", headers=OPS).json()["facts"]
    saved = client.patch(path, headers=headers, json={"importance": 0.9, "version": fresh["version"]})
    assert saved.status_code == 200, saved.text
    last = memory_history(FactFilter(user_id="carol"), fact_id=fact, limit=10)[-1]
    assert (last.action, last.origin) == ("update", "console:ops")
    versions = client.get(f"{path}/history", headers=OPS).json()["versions"]
    assert versions[-1]["who"] == {"kind": "operator", "label": "operator ops in the console"}


def test_the_lifecycle_refuses_a_dry_run_the_facts_outgrew(client: TestClient, sql_url: str) -> None:
    _fact("Erin speaks Portuguese", "erin", confidence=0.95)
    first = _fact("Erin once mentioned a rainy day", "erin", confidence=0.1)
    age_fact(sql_url, "erin", first)
    headers = _mutation_headers(client, OPS)
    dry = client.get("/console/api/lifecycle?user=erin", headers=OPS).json()
    assert dry["expiring_count"] == 1
    second = _fact("Erin once mentioned a sunny day", "erin", confidence=0.1)
    age_fact(sql_url, "erin", second)  # an import of old facts, say, after the operator looked
    run = {"user": "erin", "below": dry["threshold"], "evaluated_at": dry["evaluated_at"], "expiring": 1}
    refused = client.post("/console/api/lifecycle/apply", headers=headers, json=run)
    assert refused.status_code == 409, refused.text
    assert set(_contents("erin")) >= {first, second}
    applied = client.post("/console/api/lifecycle/apply", headers=headers, json={**run, "expiring": 2})
    assert applied.status_code == 200, applied.text
    assert applied.json()["removed"] == 2
    assert set(_contents("erin")).isdisjoint({first, second})


def test_the_agent_document_scopes_are_paged_on_the_server(client: TestClient) -> None:
    for agent, user in (("coder", None), ("coder", "u1"), ("writer", "u1")):
        scope = DocScope(agent, user)
        write_doc(scope, MAIN_DOC_PATH, f"# {agent}\n", expected_version=None, author="operator")
    first = client.get("/console/api/agent-docs?limit=2", headers=OPS).json()
    assert (len(first["scopes"]), first["total"], first["next_offset"]) == (2, 3, 2)
    rest = client.get("/console/api/agent-docs?limit=2&offset=2", headers=OPS).json()
    assert (len(rest["scopes"]), rest["next_offset"]) == (1, None)
    listed = {(scope["agent_name"], scope["user_id"]) for scope in first["scopes"] + rest["scopes"]}
    assert listed == {("coder", None), ("coder", "u1"), ("writer", "u1")}
    mine = client.get("/console/api/agent-docs?user=u1", headers=OPS).json()
    assert {scope["agent_name"] for scope in mine["scopes"]} == {"coder", "writer"}
