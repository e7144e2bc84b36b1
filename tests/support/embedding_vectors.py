"""Deterministic embeddings for the local test server: a bag of hashed terms.

Each text becomes counts of its lower-cased words (and CJK character bigrams) hashed into
``DIMENSION`` buckets, L2-normalised. Texts sharing terms are close, texts sharing none are
orthogonal (barring a bucket collision), so a test can predict every ranking by reading the words.
The hash is SHA-1, not ``hash()``, so vectors are the same in every process.
"""

from __future__ import annotations

import hashlib
import math

from memstore.storage.search_text import text_terms

DIMENSION = 256


def term_vector(text: str, dimension: int = DIMENSION) -> list[float]:
    counts = [0.0] * dimension
    for term in text_terms(text):
        digest = hashlib.sha1(term.encode("utf-8")).digest()
        counts[int.from_bytes(digest[:4], "little") % dimension] += 1.0
    norm = math.sqrt(sum(value * value for value in counts))
    return [value / norm for value in counts] if norm else counts
