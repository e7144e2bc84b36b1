"""Agent documents on a PostgreSQL server that goes down and comes back (a private cluster,
tests/support/pg_cluster.py): every read and write fails fast with ``StorageUnavailableError``
(the agent's tools with the generic storage message, nothing of the database in it), nothing is
half-written, and the same process reads and writes again once the server is back.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from memstore.agent_doc import MAIN_DOC_PATH, DocScope
from memstore.config import MemoryConfig, set_memory_config
from memstore.errors import STORAGE_UNAVAILABLE_MESSAGE, StorageUnavailableError
from memstore.gateway import agent_doc_tools as tools
from memstore.gateway.agent_doc_prompt import load_agent_memory
from memstore.ops import agent_docs as ops
from tests.support.pg_cluster import PgCluster

pytestmark = pytest.mark.postgres

SCOPE = DocScope("coder", None, "acme")
NAMED: dict[str, Any] = {"agent_name": "coder", "user_id": "alice", "tenant_id": "acme"}
BOUND = 5.0
"""A refused connection is immediate; this leaves room for a slow machine, not for a hang."""
PASSWORD = "s3cret-pw"


def _configure(url: str) -> str:
    # The private cluster trusts every login: the password is there only to be kept out of errors.
    url = make_url(url).set(password=PASSWORD).render_as_string(hide_password=False)
    set_memory_config(MemoryConfig(database_url=url))
    ops.reset_agent_doc_stores()
    return url


def _calls() -> dict[str, Callable[[], object]]:
    return {
        "list": lambda: ops.list_docs(SCOPE),
        "read": lambda: ops.read_doc(SCOPE, MAIN_DOC_PATH),
        "load": lambda: ops.load_main_doc(SCOPE),
        "history": lambda: ops.doc_history(SCOPE),
        "write": lambda: ops.write_doc(SCOPE, "/memories/new.md", "new", expected_version=0, author="agent"),
        "edit": lambda: ops.edit_doc(SCOPE, MAIN_DOC_PATH, "one", "two", expected_version=1, author="agent"),
        "delete": lambda: ops.delete_doc(SCOPE, MAIN_DOC_PATH, expected_version=1, author="agent"),
    }


def _tool_calls() -> dict[str, Callable[[], str]]:
    return {
        "ls": lambda: tools.ls(**NAMED),
        "read_file": lambda: tools.read_file(MAIN_DOC_PATH, **NAMED),
        "write_file": lambda: tools.write_file("/memories/tool.md", "tool", **NAMED),
        "edit_file": lambda: tools.edit_file(MAIN_DOC_PATH, "one", "two", 1, **NAMED),
        "delete_file": lambda: tools.delete_file(MAIN_DOC_PATH, 1, **NAMED),
    }


def _timed(call: Callable[[], object]) -> tuple[object, float]:
    started = time.monotonic()
    try:
        result: object = call()
    except StorageUnavailableError as exc:
        result = exc
    return result, time.monotonic() - started


def test_a_stopped_server_fails_every_call_fast_and_a_restart_brings_them_back(
    cluster: PgCluster, outage_url: str
) -> None:
    _configure(outage_url)
    ops.write_doc(SCOPE, MAIN_DOC_PATH, "version one", expected_version=0, author="operator")
    assert "version 1" in tools.read_file(MAIN_DOC_PATH, **NAMED)  # the pools hold connections now

    cluster.stop()
    for name, call in _calls().items():
        result, took = _timed(call)
        assert isinstance(result, StorageUnavailableError), (name, result)
        assert took < BOUND, (name, took)
        assert PASSWORD not in str(result) and "version one" not in str(result)
    for name, tool in _tool_calls().items():
        reply, took = _timed(tool)
        assert reply == f"Error: {STORAGE_UNAVAILABLE_MESSAGE}", (name, reply)
        assert took < BOUND, (name, took)

    cluster.start()
    # Nothing was half-written, and the same process's pools reconnect.
    assert [(v.version, v.content) for v in ops.doc_history(SCOPE)] == [(1, "version one")]
    assert tools.edit_file(MAIN_DOC_PATH, "one", "two", 1, **NAMED).startswith("Edited ")
    assert ops.read_doc(SCOPE, MAIN_DOC_PATH).content == "version two"


def test_a_store_opened_while_the_server_is_down_fails_fast_and_opens_later(
    cluster: PgCluster, outage_url: str
) -> None:
    _configure(outage_url)
    cluster.stop()
    result, took = _timed(lambda: ops.load_main_doc(SCOPE))
    assert isinstance(result, StorageUnavailableError) and took < BOUND, (result, took)
    assert tools.ls(**NAMED) == f"Error: {STORAGE_UNAVAILABLE_MESSAGE}"
    cluster.start()
    assert ops.load_main_doc(SCOPE) is None  # the failed open was not kept
    assert tools.write_file(MAIN_DOC_PATH, "first", **NAMED).startswith("Wrote ")


def test_a_frozen_server_costs_the_tools_and_the_prompt_their_deadline_not_the_run(
    cluster: PgCluster, outage_url: str
) -> None:
    url = _configure(outage_url)
    set_memory_config(
        MemoryConfig(
            database_url=url,
            write_lock_timeout_seconds=1,
            write_statement_timeout_seconds=1,
            memory_context_timeout_seconds=1,
        )
    )
    ops.write_doc(SCOPE, MAIN_DOC_PATH, "version one", expected_version=0, author="operator")
    assert "version 1" in tools.read_file(MAIN_DOC_PATH, **NAMED)  # a pooled connection, as in a gateway

    cluster.freeze()
    try:
        reply, took = _timed(lambda: tools.read_file(MAIN_DOC_PATH, **NAMED))
        assert reply == f"Error: {STORAGE_UNAVAILABLE_MESSAGE}" and took < 2 + 1.5, (reply, took)
        state: dict[str, Any] = {}
        memory, took = _timed(lambda: load_agent_memory(state, **NAMED))
        assert memory == {"content": "", "version": 0, "path": MAIN_DOC_PATH} and took < 1 + 1.5, took
        assert state == {}  # not kept: the next run loads again
        # A write is not confirmed, and the model is told it may have landed: look before retrying.
        reply, took = _timed(lambda: tools.edit_file(MAIN_DOC_PATH, "one", "two", 1, **NAMED))
        assert reply == tools.UNCONFIRMED_WRITE_ERROR and took < 2 + 1.5, (reply, took)
    finally:
        cluster.thaw()
    loaded: dict[str, Any] = {}
    assert load_agent_memory(loaded, **NAMED)["content"] in ("version one", "version two")
