"""DeerFlow's user ids in both adapters: one DeerFlow user is one memstore scope, found by either form.

DeerFlow normalises an identity before its storage sees it (``alice@example.com`` arrives as
``alice-example-com-ff8d9819fc0e12bf``); the adapters store that id as it is, so memstore's CLI
finds the scope by DeerFlow's id or by the identity, and a gateway that maps the raw identity
with ``make_safe_user_id`` writes the same scope. The CLI runs in a subprocess, as an operator runs it.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memstore.integrations.deerflow import DeerMemStore, SeedStore
from memstore.integrations.deerflow.users import DeerFlowUserError, deerflow_user_id, memstore_user_id
from memstore.scope import DEFAULT_USER_ID, USER_ID_PATTERN, make_safe_user_id
from memstore.storage.sql import SqlMemoryStorage
from tests.integration.conftest import Cli

ALICE = "alice@example.com"
ALICE_IN_DEERFLOW = "alice-example-com-ff8d9819fc0e12bf"  # what DeerFlow's normaliser makes of ALICE


def _deerflow_normalised(raw: str) -> str:
    """DeerFlow's published rule, restated independently of memstore's code for the test."""
    safe = "".join(c if re.fullmatch(r"[A-Za-z0-9_-]", c) else "-" for c in raw)
    return raw if safe == raw else f"{safe}-{hashlib.sha256(raw.encode()).hexdigest()[:16]}"


def _fact(content: str) -> dict[str, Any]:
    return {
        "id": f"fact_{uuid.uuid4().hex[:8]}",
        "content": content,
        "category": "knowledge",
        "confidence": 0.9,
        "createdAt": "2026-01-01T00:00:00Z",
        "source": "thread-1",
    }


def test_deerflows_normaliser_is_the_one_the_adapters_undo() -> None:
    assert _deerflow_normalised(ALICE) == ALICE_IN_DEERFLOW == deerflow_user_id(ALICE)
    assert deerflow_user_id(ALICE_IN_DEERFLOW) == ALICE_IN_DEERFLOW  # idempotent, as DeerMem applies it twice


def test_one_deerflow_user_is_one_scope_found_by_either_form(cli: Cli) -> None:
    deermem = DeerMemStore(None, database_url=cli.url)
    deermem.apply_changes(
        {"upserts": [_fact("Via DeerMem")]}, user_id=ALICE_IN_DEERFLOW, agent_name="__default__"
    )
    seed = SeedStore(database_url=cli.url)
    document = seed.load(user_id=ALICE_IN_DEERFLOW)
    document["facts"].append(_fact("Via the seed adapter"))
    assert seed.save(document, user_id=ALICE_IN_DEERFLOW)
    # A gateway that sees the raw identity maps it with make_safe_user_id: the same scope.
    gateway = SqlMemoryStorage(cli.url)
    mine = gateway.load(user_id=make_safe_user_id(ALICE))
    mine["facts"].append(_fact("Via a memstore gateway"))
    assert gateway.save(mine, user_id=make_safe_user_id(ALICE))
    both = {"Via DeerMem", "Via the seed adapter", "Via a memstore gateway"}
    for form in (ALICE, ALICE_IN_DEERFLOW):
        shown = cli.json("show", "--user", form)
        assert {fact["content"] for fact in shown["facts"]} == both, form
    # DeerMem handed the raw identity (its files normalise it again) reaches the same user.
    assert {f["content"] for f in deermem.load("__default__", user_id=ALICE)["facts"]} == both


@pytest.mark.parametrize(
    "deerflow_id",
    [
        "bob",
        "550e8400-e29b-41d4-a716-446655440000",
        ALICE_IN_DEERFLOW,
        _deerflow_normalised("ou_7d8a6e6df7621556ce0d21922b676706@feishu"),
        "x" * 128,
    ],
)
def test_every_id_memstore_can_hold_is_stored_as_deerflow_gave_it(deerflow_id: str) -> None:
    assert memstore_user_id(deerflow_id) == deerflow_id


def test_deerflows_fallback_user_is_memstores_fallback_scope() -> None:
    assert memstore_user_id("default") == DEFAULT_USER_ID
    assert make_safe_user_id("default") != DEFAULT_USER_ID  # outside callers still cannot claim it


def test_an_empty_id_is_refused_as_deerflow_refuses_it() -> None:
    with pytest.raises(DeerFlowUserError) as raised:
        memstore_user_id("")
    assert isinstance(raised.value, ValueError)


def test_a_long_id_cannot_share_a_scope_with_the_short_id_it_is_shortened_to(cli: Cli) -> None:
    """memstore cuts a long id to make_safe_user_id's shape; a DeerFlow id of that very shape (anyone
    can pick one: DeerFlow keeps safe ids) is encoded too, so it never lands on the long id's scope."""
    long_id = _deerflow_normalised("a" * 150 + "@example.com")
    shortened = make_safe_user_id(long_id)
    assert memstore_user_id(long_id) == shortened
    assert memstore_user_id(shortened) not in {shortened, memstore_user_id(long_id)}
    storage = DeerMemStore(None, database_url=cli.url)
    storage.apply_changes({"upserts": [_fact("Long")]}, user_id=long_id, agent_name="__default__")
    storage.apply_changes({"upserts": [_fact("Squatter")]}, user_id=shortened, agent_name="__default__")
    assert [f["content"] for f in storage.load("__default__", user_id=long_id)["facts"]] == ["Long"]
    # The CLI finds the long id by DeerFlow's form: it maps it the way the adapters store it.
    assert [f["content"] for f in cli.json("show", "--user", long_id)["facts"]] == ["Long"]


deerflow_ids = st.one_of(
    st.text(alphabet="ab-_0123456789", min_size=1, max_size=140),
    st.text(min_size=1, max_size=160).map(_deerflow_normalised),
    st.sampled_from(["a" * 100, "b" * 90]).flatmap(
        lambda prefix: st.text(alphabet="0123456789abcdef", min_size=16, max_size=16).map(
            lambda digest: f"{prefix}-{digest}"
        )
    ),
)


@given(deerflow_ids, deerflow_ids)
def test_the_mapping_is_injective_on_deerflow_ids(first: str, second: str) -> None:
    if first != second:
        assert memstore_user_id(first) != memstore_user_id(second)
    assert USER_ID_PATTERN.fullmatch(str(memstore_user_id(first)))
