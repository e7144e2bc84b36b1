"""How long a failed conversation waits before its next try, on either queue."""

from __future__ import annotations

import random

from memstore.config import MemoryConfig


def retry_delay(attempts: int, config: MemoryConfig) -> float:
    """Backoff before attempt ``attempts + 1``: the base doubled per failure, capped."""
    exponent = min(max(attempts - 1, 0), 60)
    return float(min(config.update_retry_max_seconds, config.update_retry_base_seconds * 2**exponent))


def jittered_delay(attempts: int, config: MemoryConfig, retry_after: float | None = None) -> float:
    """``retry_delay`` drawn from its upper half, so replicas that failed together retry apart,
    and never sooner than the endpoint's ``Retry-After``."""
    return max(retry_delay(attempts, config) * random.uniform(0.5, 1.0), retry_after or 0.0)
