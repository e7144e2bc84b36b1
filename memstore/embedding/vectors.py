"""Vectors as stored: float32, little-endian bytes, L2-normalised rows."""

from __future__ import annotations

import numpy as np

_FLOAT32 = np.dtype("<f4")


def to_blob(vector: np.ndarray) -> bytes:
    return np.asarray(vector, dtype=_FLOAT32).tobytes()


def normalized(matrix: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length, as float32, so a dot product is the cosine (zero rows stay zero)."""
    rows = np.asarray(matrix, dtype=np.float32)
    norms = np.linalg.norm(rows, axis=-1, keepdims=True)
    unit: np.ndarray = np.divide(rows, norms, out=np.zeros_like(rows), where=norms > 0)
    return unit
