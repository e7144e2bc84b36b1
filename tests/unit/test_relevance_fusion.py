"""How the semantic and full-text signals combine (``relevance_fusion``): scores scaled and weighted
(``convex``, the default) or ranks (``rrf``)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from memstore.config import MemoryConfig
from memstore.inject.relevance import RelevanceWeights, query_relevance, relevance_scores

NAN = math.nan


def weights(**settings: object) -> RelevanceWeights:
    return RelevanceWeights.of(MemoryConfig(**settings))  # type: ignore[arg-type]


def test_convex_scales_each_signal_to_its_candidates_and_weights_them() -> None:
    semantic = np.array([0.9, 0.5, 0.7, NAN])
    lexical = np.array([NAN, 4.0, 2.0, 1.0])
    # semantic weight 1.0 and full-text 0.5 share 2/3 and 1/3 of the score.
    expected = [2 / 3 * 1.0, 2 / 3 * 0.0 + 1 / 3 * 1.0, 2 / 3 * 0.5 + 1 / 3 * (1 / 3), 1 / 3 * 0.0]
    assert query_relevance(semantic, lexical, weights()).tolist() == pytest.approx(expected)


def test_convex_keeps_a_clear_semantic_hit_above_a_word_match() -> None:
    # The answer is far closer in meaning; a distractor shares the question's words. Rank fusion
    # hands them the same reward for rank 1 and lets the distractor's two ranks win.
    semantic = np.array([0.92, 0.80, 0.79, 0.78])
    lexical = np.array([NAN, 6.0, NAN, NAN])
    assert int(np.argmax(query_relevance(semantic, lexical, weights()))) == 0
    assert int(np.argmax(query_relevance(semantic, lexical, weights(relevance_fusion="rrf")))) == 1


def test_equal_values_and_missing_signals_add_what_they_should() -> None:
    both_equal = query_relevance(np.array([0.5, 0.5]), np.array([NAN, NAN]), weights())
    assert both_equal.tolist() == pytest.approx([2 / 3, 2 / 3])  # one value: all at the top
    nothing = query_relevance(np.array([NAN, NAN]), np.array([NAN, NAN]), weights())
    assert nothing.tolist() == [0.0, 0.0]
    off = query_relevance(np.array([0.9, 0.1]), np.array([1.0, 9.0]), weights(relevance_fulltext_weight=0.0))
    assert off.tolist() == pytest.approx([1.0, 0.0])


def test_rrf_adds_weight_over_k_plus_rank() -> None:
    fused = query_relevance(
        np.array([0.9, 0.5, NAN]), np.array([NAN, 3.0, 1.0]), weights(relevance_fusion="rrf")
    )
    assert fused.tolist() == pytest.approx([1 / 61, 1 / 62 + 0.5 / 61, 0.5 / 62])


def test_confidence_and_recency_are_tie_breakers_under_convex() -> None:
    relevance = np.array([0.9, 0.9])
    scores = relevance_scores(
        relevance, np.array([NAN, NAN]), np.array([0.5, 0.9]), np.array([1.0, 2.0]), weights()
    )
    assert scores[1] > scores[0]  # the tie goes to the more confident, newer fact
    assert abs(scores[1] - scores[0]) < 0.01  # by a rank's worth, not a relevance's
