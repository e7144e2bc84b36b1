"""An import embeds what it stored (issue 39): the Python API and ``POST /import`` on SQLite and
PostgreSQL, with the tests' OpenAI-compatible embeddings server (tests/support/openai_server.py).

The ``memstore import`` command is tested in ``test_import_embeds_cli.py``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from memstore.config import MemoryConfig
from memstore.errors import ConfigError
from memstore.integrations.fastapi import create_memory_router
from memstore.ops.embeddings import EMBED_BATCH, embed_facts, embedding_report
from memstore.ops.transfer import ImportEmbedding, import_entries
from memstore.queries import FactFilter, search_facts
from memstore.storage.file import FileMemoryStorage
from memstore.storage.file.layout import discover_tree
from memstore.storage.sql import SqlMemoryStorage
from tests.support.embedding_vectors import term_vector
from tests.support.openai_server import OpenAIStubServer
from tests.support.semantic import STORED, doc, fact, vector_rows


def write_tree(root: Path, scopes: dict[str, list[str]]) -> None:
    """``users/<user>/memory.json`` for each user, facts ``fact_<user index><fact index>``."""
    for number, (user, contents) in enumerate(scopes.items()):
        facts = [fact(f"fact_{number:04d}{index:04d}", text) for index, text in enumerate(contents)]
        path = root / "users" / user / "memory.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc(*facts), ensure_ascii=False), encoding="utf-8")


TREE = {
    "alice": ["Alice drinks green tea every morning", "Alice maintains the deer-flow deployment"],
    "bob": ["Bob is training for a marathon in April", "鲍勃喜欢在周末骑行"],
}


def imported(root: Path, storage: Any, **options: Any) -> Any:
    entries, misplaced = discover_tree(root)
    assert misplaced == []
    return import_entries(storage, entries, **options)


def test_an_import_embeds_the_imported_scopes_and_only_them(
    semantic: SqlMemoryStorage, tmp_path: Path
) -> None:
    # A fact stored before, in a scope the tree does not name, is not the import's business.
    assert semantic.save(doc(fact("fact_0000c001", "Carol keeps bees")), user_id="carol")
    write_tree(tmp_path / "tree", TREE)
    batches: list[int] = []

    report = imported(tmp_path / "tree", semantic, on_embedded=batches.append)

    assert report.embedding == ImportEmbedding(STORED, 4)
    assert sum(batches) == 4 and batches  # progress, by batch
    assert set(vector_rows(semantic)) == {"fact_00000000", "fact_00000001", "fact_00010000", "fact_00010001"}
    assert embedding_report().missing == 1  # Carol's fact
    page = search_facts("green tea", FactFilter(user_id="alice"), mode="semantic", limit=1)
    assert [found.fact_id for found in page.facts] == ["fact_00000000"]


def test_no_embed_leaves_the_facts_for_memstore_embed(semantic: SqlMemoryStorage, tmp_path: Path) -> None:
    write_tree(tmp_path / "tree", TREE)
    report = imported(tmp_path / "tree", semantic, embed=False)
    assert report.embedding is None
    assert vector_rows(semantic) == {}
    assert embedding_report().missing == 4
    dry = imported(tmp_path / "tree", semantic, dry_run=True)
    assert dry.embedding is None and vector_rows(semantic) == {}  # a dry run embeds nothing either
    assert embed_facts() == 4


def test_with_embedding_provider_none_nothing_is_embedded_and_nothing_fails(
    sql_storage: SqlMemoryStorage, isolated_config: MemoryConfig, tmp_path: Path
) -> None:
    assert isolated_config.embedding_provider == "none"
    write_tree(tmp_path / "tree", TREE)
    report = imported(tmp_path / "tree", sql_storage)
    assert report.embedding == ImportEmbedding(None) and len(report.imported) == 2
    assert vector_rows(sql_storage) == {}


def test_a_failing_endpoint_leaves_the_import_committed_and_an_import_again_finishes_it(
    semantic: SqlMemoryStorage, openai_server: OpenAIStubServer, tmp_path: Path
) -> None:
    write_tree(tmp_path / "tree", TREE)
    openai_server.fail_embeddings(503)

    report = imported(tmp_path / "tree", semantic)

    assert len(report.imported) == 2
    assert report.embedding is not None and report.embedding.embedded == 0
    assert "embeddings endpoint failed" in (report.embedding.error or "")
    assert [f["content"] for f in semantic.load(user_id="bob")["facts"]] == TREE["bob"]  # whole
    assert vector_rows(semantic) == {}

    openai_server.fail_embeddings(None)
    again = imported(tmp_path / "tree", semantic)  # unchanged documents, still embedded
    assert len(again.unchanged) == 2 and again.embedding == ImportEmbedding(STORED, 4)
    assert len(vector_rows(semantic)) == 4


def test_vectors_written_before_a_failure_stay_and_are_counted(
    semantic: SqlMemoryStorage,
    isolated_config: MemoryConfig,
    openai_server: OpenAIStubServer,
    tmp_path: Path,
) -> None:
    isolated_config.embedding_batch_size = EMBED_BATCH  # one request a round
    # 270 facts, under the default cap of 100 a scope: one full round and 14 facts.
    write_tree(
        tmp_path / "tree", {f"user{u}": [f"note {n} of user {u}" for n in range(90)] for u in range(3)}
    )
    answer = openai_server.embeddings

    def first_round_only(body: dict[str, Any]) -> Any:
        if openai_server.embedding_requests:
            openai_server.fail_embeddings(503)
        return answer(body)

    openai_server.embeddings = first_round_only  # type: ignore[method-assign]
    report = imported(tmp_path / "tree", semantic)

    assert report.embedding is not None and report.embedding.error is not None
    assert report.embedding.embedded == EMBED_BATCH == len(vector_rows(semantic))
    assert embedding_report().missing == 270 - EMBED_BATCH


def test_small_scopes_are_embedded_in_full_batches_with_requests_in_flight_together(
    semantic: SqlMemoryStorage,
    isolated_config: MemoryConfig,
    openai_server: OpenAIStubServer,
    tmp_path: Path,
) -> None:
    isolated_config.embedding_batch_size = 20
    write_tree(tmp_path / "tree", {f"user{n:02d}": [f"user {n} likes topic {n}"] for n in range(50)})

    report = imported(tmp_path / "tree", semantic)

    assert report.embedding == ImportEmbedding(STORED, 50)
    # 50 one-fact scopes make one round, sent as 20 + 20 + 10 texts, not 50 requests of one.
    assert sorted(len(body["input"]) for body in openai_server.embedding_requests) == [10, 20, 20]
    for user in (0, 7, 49):  # each vector went to its own fact: the batches came back in order
        content, fact_id = f"user {user} likes topic {user}", f"fact_{user:04d}0000"
        found = semantic.vectors.fact_vectors((f"user{user:02d}", None), STORED, [(fact_id, content)])
        assert np.allclose(found[fact_id], term_vector(content), atol=1e-6)
    page = search_facts("topic 31", FactFilter(user_id="user31"), mode="semantic", limit=1)
    assert [f.content for f in page.facts] == ["user 31 likes topic 31"]


def test_a_provider_without_vectors_fails_the_import_before_it_writes(
    isolated_config: MemoryConfig, openai_server: OpenAIStubServer, tmp_path: Path
) -> None:
    isolated_config.embedding_model = "test-embed"
    isolated_config.embedding_base_url = openai_server.base_url
    isolated_config.embedding_provider = "openai"
    storage = FileMemoryStorage(tmp_path / "store")
    write_tree(tmp_path / "tree", TREE)
    with pytest.raises(ConfigError, match="keeps none"):
        imported(tmp_path / "tree", storage)
    assert storage.load(user_id="alice")["facts"] == []
    assert len(imported(tmp_path / "tree", storage, embed=False).imported) == 2


def test_http_import_embeds_after_answering_unless_told_not_to(
    semantic: SqlMemoryStorage, openai_server: OpenAIStubServer, caplog: pytest.LogCaptureFixture
) -> None:
    app = FastAPI()
    app.include_router(create_memory_router(lambda: "alice"))
    body = doc(fact("fact_00000001", "Alice drinks green tea"), fact("fact_00000002", "Alice runs"))
    with TestClient(app) as client:
        skipped = client.post("/api/memory/import", params={"embed": "false"}, json=body)
        assert skipped.status_code == 200, skipped.text
        assert vector_rows(semantic) == {}

        openai_server.fail_embeddings(503)
        with caplog.at_level(logging.WARNING, logger="memstore.integrations.fastapi"):
            failed = client.post("/api/memory/import", json=body)
        assert failed.status_code == 200  # the memory is stored; the vectors wait
        assert "embedding its facts failed" in caplog.text and vector_rows(semantic) == {}

        openai_server.fail_embeddings(None)
        stored = client.post("/api/memory/import", json=body)
        assert stored.status_code == 200
        assert set(vector_rows(semantic)) == {"fact_00000001", "fact_00000002"}


def test_an_import_into_a_tenant_embeds_that_tenants_scopes_only(
    semantic: SqlMemoryStorage, tmp_path: Path
) -> None:
    # The same user id in the default tenant holds an unembedded fact the import must not touch.
    assert semantic.save(doc(fact("fact_0000d001", "Default-tenant Alice keeps bees")), user_id="alice")
    acme = semantic.for_identity("acme")
    write_tree(tmp_path / "tree", {"alice": TREE["alice"]})

    report = imported(tmp_path / "tree", acme)

    assert report.embedding == ImportEmbedding(STORED, 2)
    assert set(vector_rows(semantic)) == {"fact_00000000", "fact_00000001"}
    assert embedding_report().missing == 1
    found = acme.vectors.fact_vectors(("alice", None), STORED, [("fact_00000000", TREE["alice"][0])])
    assert set(found) == {"fact_00000000"}  # stored in acme, where the facts are
