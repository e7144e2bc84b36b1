"""Vectors as stored: float32, little-endian bytes, L2-normalised rows.

numpy is imported by the functions: the SQL storage imports this module to store and search
vectors, and a process that never does (``memstore show``, a database without embeddings) should
not pay numpy's import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

_FLOAT32 = "<f4"


def to_blob(vector: np.ndarray) -> bytes:
    import numpy as np

    return np.asarray(vector, dtype=_FLOAT32).tobytes()


def normalized(matrix: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length, as float32, so a dot product is the cosine (zero rows stay zero)."""
    import numpy as np

    rows = np.asarray(matrix, dtype=np.float32)
    norms = np.linalg.norm(rows, axis=-1, keepdims=True)
    unit: np.ndarray = np.divide(rows, norms, out=np.zeros_like(rows), where=norms > 0)
    return unit
