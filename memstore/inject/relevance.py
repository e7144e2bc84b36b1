"""Query-aware ranking of a scope's facts: how well each answers the query, then tie-breakers.

Query relevance comes from two signals (``query_relevance``):

- **semantic**: cosine similarity of the fact's vector to the query's (facts with a vector);
- **full-text**: BM25 of the query's terms in the fact's text (facts sharing at least one term);
  terms are lower-cased words, and character bigrams for Chinese, Japanese and Korean text, which
  has no spaces to split words at.

With ``relevance_fusion: convex`` (the default) each is scaled to 0..1 over the candidates that
have it and the two are weighted by ``relevance_semantic_weight`` (1.0) and
``relevance_fulltext_weight`` (0.5) over their sum; with ``rrf`` each adds ``weight / (k + rank)``
(rank 1 is best, ``relevance_rrf_k`` 60). Then rankings add ``weight / (k + rank)`` as tie-breakers:

- **confidence**: every fact, highest first (``relevance_confidence_weight``, 0.1);
- **recency**: every fact, newest ``createdAt`` first, undated facts last (0.05);
- **importance** and **decay** (the record's signals, weights 0 by default): every fact, highest
  ``importance`` first, and highest decay score first (``memstore.retention``: confidence times
  the freshness or use that keeps a fact). Most facts share the default importance, so equal
  values share the best rank of their group: a ranking where everyone ties moves nobody.

Ties keep the stored order. ``render.render_memory`` takes the scores; the guaranteed categories
still come first, from their own budget.

``standing_scores`` is the importance and decay part alone, for any candidate list (hybrid
search adds it to its own fusion); ``standing_order`` orders facts without a query.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from memstore.config import MemoryConfig
from memstore.document import coerce_confidence, parse_timestamp
from memstore.retention import Candidate, FactSignals, RetentionPolicy, candidate_of
from memstore.storage.search_text import query_terms, text_terms

if TYPE_CHECKING:
    import numpy as np

MAX_QUERY_CHARS = 2000
"""Only the start of a longer query is ranked against (a pasted document is not a question)."""

_BM25_K1 = 1.2
_BM25_B = 0.75


@dataclass(frozen=True)
class RelevanceWeights:
    k: int
    semantic: float
    fulltext: float
    confidence: float
    recency: float
    importance: float = 0.0
    decay: float = 0.0
    fusion: str = "convex"
    """How semantic and full-text relevance combine (``query_relevance``)."""
    retention: RetentionPolicy = field(default_factory=lambda: RetentionPolicy.of(MemoryConfig()))
    """The half-lives the decay ranking scores with."""

    @classmethod
    def of(cls, config: MemoryConfig) -> RelevanceWeights:
        return cls(
            config.relevance_rrf_k,
            config.relevance_semantic_weight,
            config.relevance_fulltext_weight,
            config.relevance_confidence_weight,
            config.relevance_recency_weight,
            config.relevance_importance_weight,
            config.relevance_decay_weight,
            config.relevance_fusion,
            RetentionPolicy.of(config),
        )

    @property
    def uses_standing(self) -> bool:
        """Whether importance or decay takes part in the ranking at all."""
        return self.importance > 0 or self.decay > 0


@lru_cache(maxsize=20_000)
def _term_counts(text: str) -> tuple[int, dict[str, int]]:
    """A stored text's length in terms and its term counts, cached: facts recur on every request."""
    terms = text_terms(text)
    return len(terms), dict(Counter(terms))


def bm25_scores(query: str, texts: Sequence[str]) -> list[float]:
    """BM25 of ``query``'s terms in each text, with document frequencies from ``texts`` themselves."""
    wanted = set(query_terms(query[:MAX_QUERY_CHARS]))
    if not wanted or not texts:
        return [0.0] * len(texts)
    documents = [_term_counts(text) for text in texts]
    count = len(documents)
    average = sum(length for length, _ in documents) / count or 1.0
    # Only the texts sharing a term with the query are visited term by term (one C-level set test
    # per text finds them): a scope of thousands of facts costs little more than its matches.
    matched = [i for i, (_, counts) in enumerate(documents) if not wanted.isdisjoint(counts)]
    frequency = Counter(term for i in matched for term in wanted if term in documents[i][1])
    # A term in most of the texts ("user", 用户) tells them apart from nothing: it would only hand
    # every text a rank, which fusion would read as a match.
    idf = {
        term: math.log(1 + (count - n + 0.5) / (n + 0.5))
        for term, n in frequency.items()
        if n <= max(1, count // 2)
    }
    scores = [0.0] * count
    for i in matched:
        length, counts = documents[i]
        score = 0.0
        for term, weight in idf.items():
            n = counts.get(term)
            if n:
                norm = _BM25_K1 * (1 - _BM25_B + _BM25_B * length / average)
                score += weight * n * (_BM25_K1 + 1) / (n + norm)
        scores[i] = score
    return scores


def ranked_order(values: Sequence[float | None]) -> list[int]:
    """Indices of the ranked values, highest first, ties in input order; ``None`` is unranked."""
    return sorted(
        (i for i, value in enumerate(values) if value is not None), key=lambda i: -(values[i] or 0.0)
    )


def fuse_rankings(rankings: Sequence[tuple[float, Sequence[Hashable]]], k: int) -> dict[Hashable, float]:
    """Reciprocal rank fusion: each ``(weight, keys best first)`` adds ``weight / (k + rank)``."""
    fused: dict[Hashable, float] = {}
    for weight, keys in rankings:
        if weight <= 0:
            continue
        for rank, key in enumerate(keys, start=1):
            fused[key] = fused.get(key, 0.0) + weight / (k + rank)
    return fused


def fuse_values(rankings: Sequence[tuple[float, Sequence[float]]], k: int) -> list[float]:
    """Rank fusion over values, one per candidate: each ``(weight, values)`` ranks the candidates
    highest value first and adds ``weight / (k + rank)``; equal values share the best rank of
    their group (ranks 1, 2, 2, 4), so a value everyone has changes no order."""
    count = max((len(values) for _, values in rankings), default=0)
    fused = [0.0] * count
    for weight, values in rankings:
        if weight <= 0:
            continue
        ordered = sorted(range(len(values)), key=lambda i: -values[i])
        rank = 0
        for position, index in enumerate(ordered, start=1):
            if position == 1 or values[index] != values[ordered[position - 2]]:
                rank = position
            fused[index] += weight / (k + rank)
    return fused


def standing_scores(candidates: Sequence[Candidate], weights: RelevanceWeights, now: datetime) -> list[float]:
    """What importance and decay add to each candidate's fused score (all 0 at weight 0)."""
    if not weights.uses_standing:
        return [0.0] * len(candidates)
    importance = [candidate.importance for candidate in candidates]
    decay = (
        [weights.retention.decay(candidate, now).value for candidate in candidates]
        if weights.decay > 0
        else [0.0] * len(candidates)
    )
    return fuse_values([(weights.importance, importance), (weights.decay, decay)], weights.k)


def fact_candidates(
    facts: Sequence[Mapping[Any, Any]], signals: Mapping[str, FactSignals] | None = None
) -> list[Candidate]:
    """Document facts as retention candidates (importance, confidence, dates, ``signals`` by id)."""
    return [
        candidate_of(fact if isinstance(fact, dict) else dict(fact), signals or {}, index)
        for index, fact in enumerate(facts)
    ]


def standing_order(
    facts: Sequence[Mapping[Any, Any]],
    weights: RelevanceWeights,
    signals: Mapping[str, FactSignals] | None = None,
    now: datetime | None = None,
) -> list[float] | None:
    """Scores ordering ``facts`` without a query: confidence fused with importance and decay; or
    ``None`` (plain confidence order) while both of those weights are 0."""
    if not weights.uses_standing:
        return None
    confidence = fuse_values([(weights.confidence, [fact_confidence(fact) for fact in facts])], weights.k)
    standing = standing_scores(fact_candidates(facts, signals), weights, now or datetime.now(UTC))
    return [a + b for a, b in zip(confidence, standing, strict=True)]


def _created(fact: Mapping[Any, Any]) -> float | None:
    raw = fact.get("createdAt")
    return _timestamp(raw) if isinstance(raw, str) else None


@lru_cache(maxsize=20_000)
def _timestamp(raw: str) -> float | None:
    parsed = parse_timestamp(raw)
    return parsed.timestamp() if parsed is not None else None


def fact_confidence(fact: Mapping[Any, Any]) -> float:
    """A fact's confidence as ranking reads it: 0 when unreadable (ranked last)."""
    raw = fact.get("confidence")
    if type(raw) is float and 0.0 <= raw <= 1.0:  # the common case, without the full coercion
        return raw
    return coerce_confidence(raw, 0.0)


def similarities(
    facts: Sequence[Mapping[Any, Any]], query_vector: np.ndarray, vectors: Mapping[str, np.ndarray]
) -> list[float | None]:
    """Cosine similarity of each fact to the query (vectors are normalised); ``None`` without a vector
    of the query's length (one stored before ``embedding_dimensions`` changed is not comparable)."""
    scores: list[float | None] = [None] * len(facts)
    with_vector, values = _vector_scores(facts, query_vector, vectors)
    for i, score in zip(with_vector, values.tolist(), strict=True):
        scores[i] = score
    return scores


def _vector_scores(
    facts: Sequence[Mapping[Any, Any]], query_vector: np.ndarray, vectors: Mapping[str, np.ndarray]
) -> tuple[list[int], np.ndarray]:
    """The indices of the facts with a comparable vector, and their similarities to the query."""
    import numpy as np

    shape = query_vector.shape
    rows: list[np.ndarray] = []
    with_vector: list[int] = []
    for i, fact in enumerate(facts):
        fact_id = fact.get("id")
        vector = vectors.get(fact_id) if isinstance(fact_id, str) else None
        if vector is not None and vector.shape == shape:
            with_vector.append(i)
            rows.append(vector)
    if not rows:
        return with_vector, np.zeros(0, dtype=query_vector.dtype)
    # One flat concatenate and a reshape: np.stack's per-array Python work is most of the cost of
    # a large scope's matrix (what comes out is the same C-ordered matrix).
    matrix = np.concatenate(rows).reshape(len(rows), -1)
    return with_vector, matrix @ query_vector


def _fuse_into(fused: np.ndarray, weight: float, values: np.ndarray, k: int) -> None:
    """``fuse_rankings`` for one ranking of ``values`` (NaN: unranked) into ``fused``, vectorised:
    the same ranks as ``ranked_order`` (a stable sort, ties in input order), the same sums."""
    import numpy as np

    if weight <= 0:
        return
    present = np.flatnonzero(~np.isnan(values))
    order = present[np.argsort(-values[present], kind="stable")]
    fused[order] += weight / (k + np.arange(1, len(order) + 1))


def relevance_scores(
    semantic: np.ndarray,
    lexical: np.ndarray,
    confidence: np.ndarray,
    recency: np.ndarray,
    weights: RelevanceWeights,
) -> np.ndarray:
    """One score per candidate: ``query_relevance`` plus the confidence and recency rankings, fused
    by rank (NaN: unranked; in numpy, so a scope of thousands of facts ranks in milliseconds)."""
    fused = query_relevance(semantic, lexical, weights)
    _fuse_into(fused, weights.confidence, confidence, weights.k)
    _fuse_into(fused, weights.recency, recency, weights.k)
    return fused


def query_relevance(semantic: np.ndarray, lexical: np.ndarray, weights: RelevanceWeights) -> np.ndarray:
    """How well each candidate answers the query, from its cosine similarity and its BM25 score
    (NaN: no vector, no shared word).

    ``convex``: each signal scaled to 0..1 over the candidates that have it (min-max), then the two
    weighted by ``semantic`` and ``fulltext`` over their sum; a candidate without a signal gets 0
    from it. ``rrf``: ``weight / (k + rank)`` for each ranking. On the long-conversation set rank
    fusion let a weaker full-text ranking pull good semantic hits down (hybrid recall@10 0.64 against
    0.71 for semantic alone); scores keep how far apart the candidates are
    (docs/performance.md#retrieval-over-long-conversations-issue-39).
    """
    import numpy as np

    fused = np.zeros(len(semantic))
    if weights.fusion == "rrf":
        _fuse_into(fused, weights.semantic, semantic, weights.k)
        _fuse_into(fused, weights.fulltext, lexical, weights.k)
        return fused
    total = weights.semantic + weights.fulltext
    for weight, values in ((weights.semantic, semantic), (weights.fulltext, lexical)):
        present = ~np.isnan(values)
        if weight <= 0 or not present.any():
            continue
        low, high = values[present].min(), values[present].max()
        scaled = (values[present] - low) / (high - low) if high > low else np.ones(int(present.sum()))
        fused[present] += weight / total * scaled
    return fused


def fused_scores(
    facts: Sequence[Mapping[Any, Any]],
    query: str,
    query_vector: np.ndarray,
    vectors: Mapping[str, np.ndarray],
    weights: RelevanceWeights,
    *,
    signals: Mapping[str, FactSignals] | None = None,
    now: datetime | None = None,
) -> list[float]:
    """The RRF score of each of ``facts`` (same order) for ``query``; higher is more relevant.

    ``signals`` (by fact id) feed the decay ranking; without them a fact decays from its
    ``createdAt`` alone."""
    import numpy as np

    texts = [fact.get("content") if isinstance(fact.get("content"), str) else "" for fact in facts]
    semantic = np.full(len(facts), np.nan)
    with_vector, values = _vector_scores(facts, query_vector, vectors)
    semantic[with_vector] = values
    lexical = np.array(bm25_scores(query, texts), dtype=np.float64)  # type: ignore[arg-type]
    lexical[lexical <= 0] = np.nan
    confidence = np.array([fact_confidence(fact) for fact in facts], dtype=np.float64)
    created = [_created(fact) for fact in facts]
    recency = np.array([math.nan if at is None else at for at in created], dtype=np.float64)
    fused = relevance_scores(semantic, lexical, confidence, recency, weights)
    scores: list[float] = fused.tolist()
    if weights.uses_standing:
        standing = standing_scores(fact_candidates(facts, signals), weights, now or datetime.now(UTC))
        scores = [a + b for a, b in zip(scores, standing, strict=True)]
    return scores
