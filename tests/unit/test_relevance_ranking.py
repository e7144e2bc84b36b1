"""``inject.relevance``: terms, BM25, rank fusion, and how ``render_memory`` takes the scores."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from memstore.inject.relevance import (
    RelevanceWeights,
    bm25_scores,
    fuse_rankings,
    fused_scores,
    ranked_order,
)
from memstore.inject.render import render_memory
from memstore.storage.search_text import text_terms

WEIGHTS = RelevanceWeights(k=60, semantic=1.0, fulltext=1.0, confidence=0.1, recency=0.05)


def _fact(fact_id: str, content: str, confidence: float = 0.8, category: str = "context") -> dict[str, Any]:
    return {"id": fact_id, "content": content, "category": category, "confidence": confidence}


def test_words_are_lower_cased_and_cjk_runs_become_bigrams() -> None:
    assert text_terms("User LIKES Green-Tea") == ("user", "likes", "green", "tea")
    assert text_terms("用户喜欢喝绿茶") == ("用户", "户喜", "喜欢", "欢喝", "喝绿", "绿茶")
    assert text_terms("我 用 PyTorch训练") == ("我", "用", "pytorch", "训练")
    assert text_terms("") == ()


def test_bm25_ignores_function_words_and_terms_in_most_texts() -> None:
    texts = ["User drinks green tea", "User writes Rust", "User lives in Berlin", "User hikes"]
    assert bm25_scores("the user and the tea", texts)[0] > 0
    assert bm25_scores("the user and the tea", texts)[1:] == [0.0, 0.0, 0.0]  # "user" is everywhere
    assert bm25_scores("what is it", texts) == [0.0] * 4
    chinese = ["用户喜欢喝绿茶", "用户在北京工作", "用户养了一只猫"]
    scores = bm25_scores("推荐一种绿茶", chinese)
    assert scores[0] > 0 and scores[1:] == [0.0, 0.0]


def test_rank_fusion_adds_weight_over_k_plus_rank() -> None:
    fused = fuse_rankings([(1.0, ["a", "b"]), (0.5, ["b"]), (0.0, ["c"])], 60)
    assert fused == pytest.approx({"a": 1 / 61, "b": 1 / 62 + 0.5 / 61})
    assert ranked_order([0.2, None, 0.9, 0.2]) == [2, 0, 3]


def test_the_fused_order_follows_the_query_vector_and_words() -> None:
    facts = [
        _fact("a", "User writes Rust at work", 0.95),
        _fact("b", "User drinks green tea every morning", 0.7),
        _fact("c", "User lives in Berlin", 0.9),
    ]
    axis = np.eye(3, dtype=np.float32)
    vectors = {"a": axis[0], "b": axis[1], "c": axis[2]}
    scores = fused_scores(facts, "any tea suggestions?", axis[1], vectors, WEIGHTS)
    assert ranked_order(scores)[0] == 1
    scores = fused_scores(facts, "weekend in the city", axis[2], vectors, WEIGHTS)
    assert ranked_order(scores)[0] == 2
    # A fact without a vector still ranks, on words, confidence and recency.
    partial = fused_scores(facts, "green tea", axis[0], {"a": axis[0]}, WEIGHTS)
    assert all(score > 0 for score in partial)


def test_render_puts_guaranteed_categories_first_whatever_the_scores() -> None:
    memory = {
        "facts": [
            _fact("a", "User writes Rust", 0.95),
            _fact("b", "User is not vegetarian", 0.6, "correction"),
            _fact("c", "User drinks tea", 0.7),
        ]
    }
    text, shown = render_memory(memory, 500, scores=[0.01, 0.0, 0.9])
    assert shown == ["b", "c", "a"]
    assert text.index("not vegetarian") < text.index("drinks tea") < text.index("writes Rust")
    assert render_memory(memory, 500)[1] == ["b", "a", "c"]  # no scores: confidence order
    with pytest.raises(ValueError, match="2 relevance scores for 3 facts"):
        render_memory(memory, 500, scores=[0.1, 0.2])


def test_a_vector_of_another_length_is_not_compared() -> None:
    facts = [_fact("a", "User writes Rust"), _fact("b", "User drinks tea")]
    vectors = {"a": np.ones(4, dtype=np.float32) / 2, "b": np.ones(8, dtype=np.float32) / np.sqrt(8)}
    scores = fused_scores(facts, "tea", np.ones(8, dtype=np.float32) / np.sqrt(8), vectors, WEIGHTS)
    assert ranked_order(scores)[0] == 1
