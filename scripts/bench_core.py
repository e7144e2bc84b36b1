"""Timing primitives shared by the benchmark modules: interleaved sampling and robust statistics."""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# A sampler runs one operation and returns its duration in milliseconds. Samplers time
# themselves so untimed setup (a load before a save, a restore after it) stays out of the figure.
Sampler = Callable[[], float]

SQLITE_NORMAL = "crash-safe, not power-loss-safe (WAL, synchronous=NORMAL: no fsync per commit)"
SQLITE_FULL = "power-loss-safe (WAL, synchronous=FULL: fsync per commit)"
FILE_FSYNC = "power-loss-safe (fsync of the file and its directory per save)"


@dataclass
class Result:
    scenario: str
    variant: str
    durability: str
    samples_ms: list[float]
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def median(self) -> float:
        return statistics.median(self.samples_ms)

    @property
    def p95(self) -> float:
        """Nearest-rank p95: an observed sample, never an interpolation between two."""
        ordered = sorted(self.samples_ms)
        return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]

    def as_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "variant": self.variant,
            "durability": self.durability,
            "n": len(self.samples_ms),
            "median_ms": round(self.median, 4),
            "p95_ms": round(self.p95, 4),
            **{key: round(value, 3) for key, value in self.extra.items()},
        }


def timed(operation: Callable[[], object]) -> Sampler:
    def sample() -> float:
        start = time.perf_counter()
        operation()
        return (time.perf_counter() - start) * 1000

    return sample


def interleave(variants: dict[str, Sampler], iterations: int, warmup: int) -> dict[str, list[float]]:
    """Run the variants round-robin, rotating who goes first, so machine drift hits all of them alike."""
    names = list(variants)
    for _ in range(warmup):
        for name in names:
            variants[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    gc.collect()
    for index in range(iterations):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name].append(variants[name]())
    return samples
