"""Relevance on real databases: stored vectors, similarity dedup, query-aware injection, search modes.

Embeddings come from the local OpenAI-compatible test server over HTTP (real ``openai`` client):
its vectors are bags of hashed words (``tests/support/openai_server.py``), so texts sharing words
are close and texts sharing none are orthogonal, which is enough to make every ranking below
decidable by hand.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, event, text

from memstore.cli import main
from memstore.config import MemoryConfig, get_memory_config
from memstore.embedding import get_embedder
from memstore.errors import QueryError, SimilarFactError
from memstore.gateway.middleware import MemoryMiddleware
from memstore.gateway.tools import memory_search
from memstore.inject.tokens import count_tokens
from memstore.integrations.fastapi import create_memory_router
from memstore.ops.embeddings import embed_facts, embedding_report
from memstore.ops.facts import create_memory_fact, search_memory_facts
from memstore.queries import FactFilter, erase_user, search_facts
from memstore.scope import DEFAULT_IDENTITY
from memstore.storage.loader import get_memory_storage, reset_memory_storage
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import get_engine, load_sqlite_vec
from memstore.storage.sql.search import embeddings
from memstore.storage.sql.search.semantic import nearest_facts, vector_backend
from memstore.update.similarity import fold_similar
from memstore.update.updater import MemoryUpdater
from tests.support.openai_server import OpenAIStubServer
from tests.support.remember_llm import remember_reply
from tests.support.semantic import MODEL, STORED, backend, doc, fact, json_value, vector_rows

ROOT = Path(__file__).resolve().parents[2]
# --- storage: vectors belong to a fact's current content, under one model ---------------------------


def test_vectors_are_stored_per_fact_and_ignored_once_the_content_changes(semantic: SqlMemoryStorage) -> None:
    storage = semantic
    assert storage.save(doc(fact("fact_00000001", "User drinks green tea")), user_id="alice")
    assert embed_facts() == 1
    scope = ("alice", None)
    found = storage.vectors.fact_vectors(scope, STORED, [("fact_00000001", "User drinks green tea")])
    assert set(found) == {"fact_00000001"}
    assert found["fact_00000001"].dtype == np.float32
    assert abs(float(np.linalg.norm(found["fact_00000001"])) - 1.0) < 1e-5

    edited = storage.load(user_id="alice")
    edited["facts"][0]["content"] = "User drinks black coffee"
    assert storage.save(edited, user_id="alice")
    assert storage.vectors.fact_vectors(scope, STORED, [("fact_00000001", "User drinks black coffee")]) == {}
    assert embedding_report().missing == 1
    assert embed_facts() == 1
    assert embedding_report().missing == 0


def test_a_vector_is_not_stored_for_a_fact_edited_while_it_was_embedded(semantic: SqlMemoryStorage) -> None:
    storage = semantic
    assert storage.save(doc(fact("fact_00000001", "User drinks green tea")), user_id="alice")
    stale = ("fact_00000001", "User drank something else", np.ones(8, dtype=np.float32) / np.sqrt(8))
    assert storage.vectors.store_vectors(("alice", None), STORED, [stale]) == 0
    assert vector_rows(storage) == {}


def test_deleting_a_scope_deletes_its_vectors(semantic: SqlMemoryStorage) -> None:
    storage = semantic
    assert storage.save(doc(fact("fact_00000001", "User drinks green tea")), user_id="alice")
    embed_facts()
    assert vector_rows(storage) == {"fact_00000001": STORED}
    named = [("fact_00000001", "User drinks green tea")]
    cached = storage.vectors.fact_vectors(("alice", None), STORED, named)["fact_00000001"]
    erase_user("alice")
    assert vector_rows(storage) == {}
    # Nothing of the erased user stays in the process either: a new alice's fact, same id and text,
    # ranks by its own vector, not the cached one.
    assert storage.save(doc(fact("fact_00000001", "User drinks green tea")), user_id="alice")
    fresh = np.roll(cached, 1)
    with get_engine(storage.url).begin() as conn:
        embeddings.store_vectors(
            conn, "default", ("alice", None), STORED, [(*named[0], fresh)], datetime.now(UTC)
        )
    assert np.allclose(storage.vectors.fact_vectors(("alice", None), STORED, named)["fact_00000001"], fresh)


# --- similarity dedup at insert ---------------------------------------------------------------------


def test_manual_create_refuses_a_paraphrase_and_keeps_a_different_fact(semantic: SqlMemoryStorage) -> None:
    create_memory_fact("User likes green tea", "preference", 0.8, user_id="alice")
    with pytest.raises(SimilarFactError) as refused:
        create_memory_fact("User likes green tea a lot", "preference", 0.9, user_id="alice")
    assert refused.value.similarity >= 0.8
    memory = create_memory_fact("User works at Acme", "context", 0.9, user_id="alice")
    assert sorted(fact["content"] for fact in memory["facts"]) == [
        "User likes green tea",
        "User works at Acme",
    ]
    assert set(vector_rows(semantic)) == {fact["id"] for fact in memory["facts"]}


def test_the_updater_folds_a_paraphrase_into_the_live_fact_and_audits_it(semantic: SqlMemoryStorage) -> None:
    storage = semantic
    storage.save(doc(fact("fact_00000001", "User likes green tea", 0.75, "preference")), user_id="alice")
    current = storage.load(user_id="alice")
    proposed = storage.load(user_id="alice")
    proposed["facts"].append(fact("fact_00000002", "User likes green tea a lot", 0.95, "preference"))
    proposed["facts"].append(fact("fact_00000003", "User works at Acme", 0.9, "context"))
    config = get_memory_config()
    embedder = get_embedder(config)
    assert embedder is not None
    folds = fold_similar(
        current, proposed, embedder=embedder, store=storage.vectors, scope=("alice", None), config=config
    )
    kept = {fact["id"]: fact for fact in folds.memory["facts"]}
    assert set(kept) == {"fact_00000001", "fact_00000003"}
    assert kept["fact_00000001"]["confidence"] == 0.95  # the higher confidence is kept
    assert set(folds.folded) == {"fact_00000001"}
    [detail] = folds.folded["fact_00000001"]
    assert detail["reason"] == "similar"
    assert detail["content"] == "User likes green tea a lot"

    assert storage.save(folds.memory, user_id="alice", origin="t-9", folded=folds.folded)
    storage.vectors.store_vectors(("alice", None), STORED, folds.vectors)
    stored = {fact["id"]: fact for fact in storage.load(user_id="alice")["facts"]}
    assert set(stored) == {"fact_00000001", "fact_00000003"}
    assert stored["fact_00000001"]["confidence"] == 0.95
    with get_engine(storage.url).connect() as conn:
        audit = conn.execute(
            text(
                "SELECT action, origin, detail FROM memory_history"
                " WHERE entity_id = 'fact_00000001' ORDER BY id"
            )
        ).all()
        confirmed = conn.execute(
            text("SELECT last_confirmed_at FROM memory_facts WHERE fact_id = 'fact_00000001'")
        ).scalar_one()
    details = [json_value(row[2]) for row in audit if row[2] is not None]
    assert any(detail["reason"] == "similar" and detail["similarity"] >= 0.8 for detail in details)
    assert confirmed is not None
    assert set(vector_rows(storage)) == {"fact_00000001", "fact_00000003"}


def test_a_queued_update_folds_a_paraphrase_and_embeds_what_it_keeps(
    semantic: SqlMemoryStorage, isolated_config: MemoryConfig, openai_server: OpenAIStubServer
) -> None:
    isolated_config.llm_base_url = openai_server.base_url
    isolated_config.model_name = "test-chat"
    isolated_config.extractor = "llm"
    openai_server.default_reply = remember_reply
    semantic.save(doc(fact("fact_00000001", "User likes green tea", 0.75, "context")), user_id="alice")
    messages = [
        {"role": "user", "content": "Remember: User likes green tea a lot. Remember: User works at Acme."},
        {"role": "assistant", "content": "Noted."},
    ]
    assert MemoryUpdater().update_memory(messages, thread_id="t-1", user_id="alice")
    facts = {fact["content"]: fact for fact in semantic.load(user_id="alice")["facts"]}
    assert set(facts) == {"User likes green tea", "User works at Acme"}
    assert facts["User likes green tea"]["confidence"] == 0.9
    assert set(vector_rows(semantic)) == {fact["id"] for fact in facts.values()}
    with get_engine(semantic.url).connect() as conn:
        details = (
            conn.execute(
                text(
                    "SELECT detail FROM memory_history"
                    " WHERE entity_id = 'fact_00000001' AND detail IS NOT NULL"
                )
            )
            .scalars()
            .all()
        )
    assert [json_value(detail)["content"] for detail in details] == ["User likes green tea a lot"]


def test_without_embeddings_a_paraphrase_is_a_new_fact(sql_url: str, isolated_config: MemoryConfig) -> None:
    isolated_config.database_url = sql_url
    reset_memory_storage()
    create_memory_fact("User likes green tea", "preference", 0.8, user_id="alice")
    memory = create_memory_fact("User likes green tea a lot", "preference", 0.9, user_id="alice")
    assert len(memory["facts"]) == 2


# --- query-aware injection --------------------------------------------------------------------------


FACTS = (
    fact("fact_000000a1", "User codes in Rust at work", 0.95),
    fact("fact_000000a2", "User lives in Berlin", 0.9),
    fact("fact_000000a3", "User drinks green tea every morning", 0.8),
    fact("fact_000000a4", "User is not vegetarian anymore", 0.7, "correction"),
)


def _facts_order(block: str) -> list[str]:
    lines = [line for line in block.splitlines() if line.startswith("- [")]
    return [line.split("] ", 1)[1] for line in lines]


def test_the_injection_order_follows_the_query_and_corrections_stay_first(semantic: SqlMemoryStorage) -> None:
    semantic.save(doc(*FACTS), user_id="alice")
    embed_facts()
    middleware = MemoryMiddleware()
    plain = _facts_order(middleware.memory_context(user_id="alice"))
    about_tea = _facts_order(
        middleware.memory_context(user_id="alice", query="which green tea should I drink?")
    )
    about_berlin = _facts_order(middleware.memory_context(user_id="alice", query="weekend plans in Berlin"))
    assert plain[0].startswith("User is not vegetarian")  # guaranteed category first
    assert plain[1:] == [
        "User codes in Rust at work",
        "User lives in Berlin",
        "User drinks green tea every morning",
    ]
    assert about_tea[0].startswith("User is not vegetarian")
    assert about_tea[1] == "User drinks green tea every morning"
    assert about_berlin[0].startswith("User is not vegetarian")
    assert about_berlin[1] == "User lives in Berlin"


def test_query_aware_injection_stays_within_the_budget(
    semantic: SqlMemoryStorage, isolated_config: MemoryConfig
) -> None:
    many = [
        fact(f"fact_{i:08x}", f"User remembers item number {i} about topic {i % 7}", 0.5 + i / 1000)
        for i in range(300)
    ]
    semantic.save(doc(*many), user_id="alice")
    embed_facts()
    isolated_config.max_injection_tokens = 200
    block = MemoryMiddleware().memory_context(user_id="alice", query="topic 3")
    body = block.removeprefix("<memory>\n").removesuffix("\n</memory>\n")
    assert 0 < count_tokens(body, use_tiktoken=True) <= 200
    shown = _facts_order(block)
    assert shown and all("topic 3" in line for line in shown[:3])


def test_a_query_without_embeddings_keeps_the_confidence_order(
    sql_url: str, isolated_config: MemoryConfig
) -> None:
    isolated_config.database_url = sql_url
    reset_memory_storage()
    get_memory_storage().save(doc(*FACTS), user_id="alice")
    middleware = MemoryMiddleware()
    assert middleware.memory_context(user_id="alice", query="green tea") == middleware.memory_context(
        user_id="alice"
    )


# --- search modes -----------------------------------------------------------------------------------


def test_semantic_search_never_returns_another_users_fact(semantic: SqlMemoryStorage) -> None:
    semantic.save(doc(fact("fact_00000001", "User drinks green tea")), user_id="alice")
    semantic.save(doc(fact("fact_00000002", "User drinks green tea")), user_id="bob")
    semantic.save(doc(fact("fact_00000003", "User drinks green tea")), user_id="alice", agent_name="coder")
    embed_facts()
    for mode in ("semantic", "hybrid"):
        page = search_facts("green tea", FactFilter(user_id="alice", agent_name=None), mode=mode)
        assert [(f.user_id, f.agent_name, f.fact_id) for f in page.facts] == [
            ("alice", None, "fact_00000001")
        ]
        mine = search_memory_facts("green tea", user_id="bob", mode=mode)
        assert [fact["id"] for fact in mine] == ["fact_00000002"]
    everyone = search_facts("green tea", mode="semantic")
    assert {f.user_id for f in everyone.facts} == {"alice", "bob"}


def test_semantic_search_ranks_by_meaning_and_reports_its_backend(semantic: SqlMemoryStorage) -> None:
    semantic.save(doc(*FACTS), user_id="alice")
    embed_facts()
    page = search_facts("tea in the morning", FactFilter(user_id="alice"), mode="semantic", limit=2)
    assert page.facts[0].fact_id == "fact_000000a3"
    assert page.facts[0].rank is not None and page.facts[0].rank > page.facts[1].rank  # type: ignore[operator]
    assert page.search_mode == f"semantic:{backend(semantic)}"
    assert page.total == 4
    hybrid = search_facts("tea in the morning", FactFilter(user_id="alice"), mode="hybrid", limit=2)
    assert hybrid.facts[0].fact_id == "fact_000000a3"
    assert hybrid.search_mode.startswith("hybrid:")


def test_semantic_search_without_embeddings_is_a_clear_error(
    sql_url: str, isolated_config: MemoryConfig
) -> None:
    isolated_config.database_url = sql_url
    reset_memory_storage()
    with pytest.raises(QueryError, match="embedding_provider"):
        search_facts("tea", mode="semantic")
    with pytest.raises(QueryError, match="unknown search mode"):
        search_facts("tea", mode="vector")  # type: ignore[arg-type]


def test_search_modes_on_the_cli_the_http_api_and_the_tools(
    semantic: SqlMemoryStorage, openai_server: OpenAIStubServer
) -> None:
    semantic.save(doc(*FACTS), user_id="alice")
    embed_facts()
    result = CliRunner().invoke(
        main, ["facts", "search", "tea in the morning", "--mode", "semantic", "--json"]
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["facts"][0]["fact_id"] == "fact_000000a3"

    app = FastAPI()
    app.include_router(create_memory_router(lambda: "alice"))
    response = TestClient(app).get(
        "/api/memory/facts", params={"q": "tea in the morning", "mode": "semantic"}
    )
    assert response.status_code == 200, response.text
    assert response.json()[0]["id"] == "fact_000000a3"
    bad = TestClient(app).get("/api/memory/facts", params={"q": "tea", "mode": "vector"})
    assert bad.status_code == 422
    openai_server.fail_embeddings(503)
    down = TestClient(app).get("/api/memory/facts", params={"q": "tea", "mode": "hybrid"})
    assert down.status_code == 503 and "embeddings endpoint" in down.json()["detail"]
    assert "embeddings endpoint" in json.loads(memory_search("tea", user_id="alice"))["error"]
    openai_server.fail_embeddings(None)

    found = json.loads(memory_search("tea in the morning", user_id="alice"))
    assert found["results"][0]["id"] == "fact_000000a3"


# --- model changes ----------------------------------------------------------------------------------


def test_a_model_change_is_detected_and_rebuild_re_embeds(
    semantic: SqlMemoryStorage, isolated_config: MemoryConfig, caplog: pytest.LogCaptureFixture
) -> None:
    semantic.save(doc(*FACTS), user_id="alice")
    assert embed_facts() == 4
    isolated_config.embedding_model = "test-embed-v2"
    reset_memory_storage()
    with caplog.at_level(logging.WARNING):
        report = embedding_report()
        search_facts("tea", mode="semantic")
    assert report.model == "openai:test-embed-v2"
    assert report.missing == 4
    assert report.other_models == {STORED: 4}
    assert "embedding model changed" in caplog.text
    assert search_facts("tea", mode="semantic").total == 0  # old vectors never compared with new ones

    result = CliRunner().invoke(main, ["embed", "--rebuild", "--json"])
    assert result.exit_code == 0, result.output
    after = json.loads(result.stdout)
    assert after["missing"] == 0
    assert after["other_models"] == {}
    assert set(vector_rows(semantic).values()) == {"openai:test-embed-v2"}


@pytest.mark.parametrize("where", [FactFilter(), FactFilter(user_id="bob"), FactFilter(category="goal")])
def test_the_sqlite_vec_backend_ranks_exactly_like_the_exact_scan(
    sqlite_url: str, isolated_config: MemoryConfig, openai_server: OpenAIStubServer, where: FactFilter
) -> None:
    """The sqlite-vec SQL, run through a driver that can load the extension (pysqlite3, dev only)."""
    dbapi = pytest.importorskip("pysqlite3.dbapi2")
    isolated_config.database_url = sqlite_url
    isolated_config.embedding_model = MODEL
    isolated_config.embedding_base_url = openai_server.base_url
    isolated_config.embedding_provider = "openai"
    reset_memory_storage()
    storage = get_memory_storage()
    assert isinstance(storage, SqlMemoryStorage)
    words = ["tea", "coffee", "berlin", "rust", "python", "hiking", "piano", "chess"]
    for user in ("alice", "bob", "carol"):
        facts = [
            fact(
                f"fact_{i:08x}",
                f"{user} {words[i % 8]} {words[(i * 3) % 8]} note {i}",
                0.7,
                ("goal", "context")[i % 2],
            )
            for i in range(40)
        ]
        storage.save(doc(*facts), user_id=user)
    embed_facts()
    vector = get_embedder(get_memory_config()).embed_query("tea and piano")  # type: ignore[union-attr]

    plain = get_engine(sqlite_url)
    with_vec = create_engine(sqlite_url, module=dbapi)
    event.listen(with_vec, "connect", lambda connection, _record: load_sqlite_vec(connection))
    try:
        with with_vec.connect() as conn:
            assert vector_backend(conn) == "sqlite-vec"
        exact = nearest_facts(
            plain.connect, where, DEFAULT_IDENTITY, vector, model=STORED, limit=15, offset=5
        )
        native = nearest_facts(
            with_vec.connect, where, DEFAULT_IDENTITY, vector, model=STORED, limit=15, offset=5
        )
    finally:
        with_vec.dispose()
    if backend(storage) == "exact":
        assert exact.search_mode == "semantic:exact"
    assert native.search_mode == "semantic:sqlite-vec"
    assert native.total == exact.total > 0
    assert [round(f.rank or 0, 5) for f in native.facts] == [round(f.rank or 0, 5) for f in exact.facts]
    assert {(f.user_id, f.fact_id) for f in native.facts} == {(f.user_id, f.fact_id) for f in exact.facts}


def test_the_evaluation_script_runs_on_the_labelled_set(
    openai_server: OpenAIStubServer, tmp_path: Path
) -> None:
    """scripts/eval_retrieval.py end to end on the test server's vectors (the docs use the local model)."""
    out = tmp_path / "eval.md"
    command = [
        sys.executable,
        "scripts/eval_retrieval.py",
        "--base-url",
        openai_server.base_url,
        "--model",
        "m",
    ]
    done = subprocess.run(
        [*command, "--markdown", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    rows = {
        (cells[1], cells[2]): float(cells[4])
        for line in out.read_text(encoding="utf-8").splitlines()
        if (cells := [cell.strip() for cell in line.split("|")])
        and len(cells) == 7
        and cells[1] in ("en", "zh")
    }
    assert set(rows) >= {(lang, mode) for lang in ("en", "zh") for mode in ("fulltext", "semantic", "hybrid")}
    for language in ("en", "zh"):
        assert rows[(language, "hybrid")] >= rows[(language, "fulltext")]
        assert rows[(language, "hybrid")] > 0


def test_embed_status_reports_and_embeds_nothing(
    semantic: SqlMemoryStorage, isolated_config: MemoryConfig
) -> None:
    semantic.save(doc(*FACTS), user_id="alice")
    status = CliRunner().invoke(main, ["embed", "--status"])
    assert status.exit_code == 0, status.output
    assert "live facts: 4" in status.output and "missing:    4" in status.output
    assert f"model:      {STORED}" in status.output
    assert vector_rows(semantic) == {}
    done = CliRunner().invoke(main, ["embed"])
    assert done.exit_code == 0 and "missing:    0" in done.output
    isolated_config.embedding_provider = "none"
    refused = CliRunner().invoke(main, ["embed"])
    assert refused.exit_code == 1 and "embedding_provider is none" in refused.output
