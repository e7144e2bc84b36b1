"""Tenancy's cost on PostgreSQL: row-level security on against off, and the shared-fact merge.

"off" is memstore connected as the database's superuser: the policies never bind it, so memstore
sends no identity statement and only its own predicates scope the reads. "on" is memstore
connected as an application role made by ``memstore db grant-app-role``: every transaction first
sets the identity (one extra statement) and PostgreSQL evaluates the policies on every row. Both
run interleaved, in one run, on the same database and the same 100-fact scope.

``memory_context`` merged: the tenant holds 50 public facts and 50 shared with the reader, from
other owners; the figure is the reader's document load plus the merge query (``visible_facts``)
against the document load alone, both warm, as the middleware runs them.
"""

from __future__ import annotations

import functools
import secrets
import uuid
from typing import Any

from bench_core import Result, Sampler, interleave, timed
from bench_data import document
from bench_scenarios import _results, _save_sampler
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import dispose_engines
from memstore.storage.sql.schema.roles import grant_app_role

TENANT = "bench-tenant"
FACTS = 100
SHARED = 50


def _app_role(owner_url: str) -> tuple[str, str]:
    """A role bound by the policies, and its URL on the same database."""
    role = f"memstore_bench_{uuid.uuid4().hex[:10]}"
    password = secrets.token_hex(12)
    engine = create_engine(owner_url)
    try:
        grant_app_role(engine, role, create=True, password=password)
    finally:
        engine.dispose()
    return role, make_url(owner_url).set(username=role, password=password).render_as_string(
        hide_password=False
    )


def _drop_role(owner_url: str, role: str) -> None:
    dispose_engines()
    engine = create_engine(owner_url)
    try:
        with engine.begin() as conn:
            conn.execute(text(f'DROP OWNED BY "{role}"'))
            conn.execute(text(f'DROP ROLE "{role}"'))
    finally:
        engine.dispose()


def _shared_document(owner: int) -> dict[str, Any]:
    facts = document(SHARED)["facts"]
    for index, fact in enumerate(facts):
        fact["id"] = f"shared_{owner}_{index:05d}"
        fact["content"] = f"owner {owner} {fact['content']}"
        if index % 2:
            fact["visibility"] = "public"
        else:
            fact.update(visibility="shared", allowedUsers=["bench-reader"])
    return {"facts": facts}


def tenancy(pg_url: str, durability: str, iterations: int, warmup: int) -> list[Result]:
    role, app_url = _app_role(pg_url)
    try:
        off = SqlMemoryStorage(pg_url).for_identity(TENANT)
        on = SqlMemoryStorage(app_url).for_identity(TENANT, ["editor"])
        user = "bench-rls"
        assert off.save(document(FACTS), user_id=user)
        assert on.reload(user_id=user) == off.reload(user_id=user), "the app role reads another document"
        results = _results(
            "tenancy_load_cold_100",
            interleave(
                {
                    "rls_off": timed(functools.partial(off.reload, user_id=user)),
                    "rls_on": timed(functools.partial(on.reload, user_id=user)),
                },
                iterations,
                warmup,
            ),
            {"rls_off": durability, "rls_on": durability},
        )
        savers: dict[str, Sampler] = {
            name: _save_sampler(
                functools.partial(store.load, user_id=user), functools.partial(store.save, user_id=user)
            )
            for name, store in (("rls_off", off), ("rls_on", on))
        }
        results += _results(
            "tenancy_save_add1_100",
            interleave(savers, max(iterations // 10, 3), warmup),
            {"rls_off": durability, "rls_on": durability},
        )
        reader = "bench-reader"
        assert on.save(document(FACTS), user_id=reader)
        for owner in range(2):
            assert on.save(_shared_document(owner), user_id=f"bench-owner-{owner}")
        assert len(on.visible_facts(user_id=reader)) == 2 * SHARED

        def own_only() -> object:
            return on.load(user_id=reader)

        def merged() -> object:
            return on.load(user_id=reader), on.visible_facts(user_id=reader)

        results += _results(
            "tenancy_context_merge",
            interleave({"own_only": timed(own_only), "merged_100_shared": timed(merged)}, iterations, warmup),
            {"own_only": durability, "merged_100_shared": durability},
        )
        return results
    finally:
        _drop_role(pg_url, role)
