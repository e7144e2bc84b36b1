"""Retrieval over long conversations (issue 39): hybrid search fuses candidates drawn from both
retrievers, the vector search's nearest facts and the full-text index's best matches, each pool
``hybrid_pool`` deep; the injected block dates each fact."""

from __future__ import annotations

from memstore.config import MemoryConfig
from memstore.gateway.middleware import MemoryMiddleware
from memstore.ops.embeddings import embed_facts
from memstore.queries import FactFilter, search_facts
from memstore.storage.sql import SqlMemoryStorage
from tests.support.semantic import doc, fact

QUESTION = "what is it that you do with the things on the weekend in kyoto"
# The test server's vectors are bags of words, function words included: these share the question's
# function words, so they fill the vector pool, yet hold none of the words the index searches for.
NEIGHBOURS = [fact(f"fact_000000{i:02d}", f"what is it that you do with the {i} on the") for i in range(20)]
# Shares one word with the question, and a rare one: only the full-text index can find it.
TARGET = fact("fact_000000ff", "My sister moved to Kyoto last spring and teaches English there")


def test_a_fact_only_the_index_finds_is_fused_into_the_page(
    semantic: SqlMemoryStorage, isolated_config: MemoryConfig
) -> None:
    isolated_config.hybrid_pool = 10
    semantic.save(doc(*NEIGHBOURS, TARGET), user_id="ann")
    embed_facts()
    where = FactFilter(user_id="ann")
    nearest = search_facts(QUESTION, where, mode="semantic", limit=10)
    assert "fact_000000ff" not in [f.fact_id for f in nearest.facts]  # out of the vector pool
    page = search_facts(QUESTION, where, mode="hybrid", limit=5)
    assert "fact_000000ff" in [f.fact_id for f in page.facts]
    assert page.total == 11  # the ten nearest, and the index's one match
    assert page.search_mode.startswith("hybrid:") and page.search_mode.endswith("+fulltext")


def test_with_every_word_required_the_index_adds_nothing(
    semantic: SqlMemoryStorage, isolated_config: MemoryConfig
) -> None:
    isolated_config.hybrid_pool = 10
    semantic.save(doc(*NEIGHBOURS, TARGET), user_id="ann")
    embed_facts()
    page = search_facts(QUESTION, FactFilter(user_id="ann"), mode="hybrid", match="all", limit=5)
    assert "fact_000000ff" not in [f.fact_id for f in page.facts]
    assert page.total == 10


def test_the_pool_depth_is_the_setting(semantic: SqlMemoryStorage, isolated_config: MemoryConfig) -> None:
    semantic.save(doc(*NEIGHBOURS, TARGET), user_id="ann")
    embed_facts()
    totals = []
    for pool in (10, 15):
        isolated_config.hybrid_pool = pool
        totals.append(search_facts(QUESTION, FactFilter(user_id="ann"), mode="hybrid", limit=5).total)
    assert totals == [11, 16]


# --- the day each injected fact was stated ----------------------------------------------------------


def test_the_injected_block_dates_each_fact_unless_turned_off(
    sql_storage: SqlMemoryStorage, isolated_config: MemoryConfig
) -> None:
    stated = {**fact("fact_00000001", "Adopted a dog called Biscuit"), "createdAt": "2026-05-08T09:30:00Z"}
    sql_storage.save(doc(stated), user_id="ann")
    block = MemoryMiddleware().memory_context(user_id="ann", query="when did I get my dog?")
    assert "- [context | 0.80 | 2026-05-08] Adopted a dog called Biscuit" in block.splitlines()
    isolated_config.injection_fact_dates = False
    block = MemoryMiddleware().memory_context(user_id="ann", query="when did I get my dog?")
    assert "- [context | 0.80] Adopted a dog called Biscuit" in block.splitlines()
