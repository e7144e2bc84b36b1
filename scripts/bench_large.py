"""Large scopes (issue 39): one scope of 1,000, 5,000 and 10,000 facts, the sizes side by side.

Every operation is one scenario whose variants are the sizes (and, with PostgreSQL, the backends),
interleaved in one loop, so the verdicts are growth ratios within one run (10,000 facts against
1,000: linear growth is 10×), never absolute times. What is timed:

- ``large_cold_load``: ``reload()``, the provider cache bypassed (a new process's first read);
- ``large_inject`` / ``large_inject_local`` / ``large_inject_local_uncached``: one turn's
  ``memory_context(query=...)``: what ``MemoryMiddleware._render`` does (warm load, ranking,
  render within 2,000 tokens, access recorded), without the pool hop; embeddings off (confidence
  order), with the ``local`` model (the query embedded, the scope's vectors read from the
  per-process cache, four rankings fused), and the same with that cache emptied before each turn
  (a gateway serving more large scopes than its 20,000 cached vectors hold reads them all, every
  turn). Vectors are random unit vectors under the local model's name: ranking costs the same;
- ``large_save_add1``: a merge-safe ``save()`` of the loaded document plus one fact (under the
  cap; an untimed save takes it out again);
- ``large_save_evict``: the same save in a scope at ``max_facts``: the new fact evicts one;
- ``large_update_prompt``: ``build_update_prompt`` for a short conversation: since issue 39 it
  shows at most ``update_prompt_max_facts`` facts; ``prompt_chars`` against
  ``whole_memory_chars`` (every fact shown, as before) says what the subset saves;
- ``large_update_apply``: ``apply_updates`` of a reply adding three facts and removing one shown
  fact, in a scope at its cap (so two more are evicted): the worker's own work besides the LLM
  call and the save.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench_core import Result, Sampler, interleave, timed
from bench_data import document, fact
from bench_relevance import write_vectors
from sqlalchemy import text

from memstore.config import MemoryConfig, get_memory_config
from memstore.embedding import get_embedder
from memstore.gateway.compose import compose_memory_block
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import get_engine
from memstore.update.apply import apply_updates
from memstore.update.parser import MemoryUpdate
from memstore.update.prompt import build_update_prompt, shown_fact_ids

SIZES = (1000, 5000, 10_000)
SCENARIO_PREFIX = "large_"
LOCAL_MODEL = "local:multilingual-e5-small-q4"
"""``memstore.embedding.local.MODEL_ID``, spelt out so the harness imports without the extra."""
QUERY = "which database did I say we use for the Rust service, and how do I like answers written"
CONVERSATION = [
    {"role": "user", "content": QUERY},
    {"role": "assistant", "content": "PostgreSQL, and you prefer concise answers with the query plan."},
    {"role": "user", "content": "Right. We moved the notes from Markdown to the wiki last week."},
]
MAX_CAP = 20_000


@dataclass(frozen=True)
class Backend:
    name: str
    url: str
    durability: str


@dataclass
class _Scope:
    """One size on one backend: one scope, through a provider capped well above it (reads, the
    save that adds) and one capped at its size (the save that evicts, which runs last)."""

    backend: Backend
    size: int
    read: SqlMemoryStorage
    evict: SqlMemoryStorage

    @property
    def variant(self) -> str:
        return f"{self.backend.name}_{self.size}"

    @property
    def user(self) -> str:
        return f"large-{self.size}"


def _build(backend: Backend, size: int) -> _Scope:
    read = SqlMemoryStorage(backend.url, max_facts=MAX_CAP)
    evict = SqlMemoryStorage(backend.url, max_facts=size)
    scope = _Scope(backend, size, read, evict)
    assert read.save(document(size), user_id=scope.user)
    where = f"AND scope_id IN (SELECT id FROM memory_scopes WHERE user_id = '{scope.user}')"
    engine = get_engine(backend.url)
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            assert conn.execute(text(_PG_VECTORS.format(where=where)), {"m": LOCAL_MODEL}).rowcount == size
            # As autovacuum would soon: a pooled connection's cached plans from when the tables were
            # nearly empty made the next bulk insert 4-6× slower (docs/performance.md).
            conn.execute(text("ANALYZE"))
    else:
        assert write_vectors(engine, where, model=LOCAL_MODEL) == size
    return scope


_PG_VECTORS = """
INSERT INTO memory_fact_embeddings (fact_row_id, scope_id, model, dimension, content_key, vector, embedded_at)
SELECT id, scope_id, :m, 384, content_key,
       ARRAY(SELECT sin(id * 7.3 + g)::real FROM generate_series(1, 384) AS g), now()
FROM memory_facts WHERE deleted_revision IS NULL {where}
"""
"""PostgreSQL: a pseudo-random vector per fact, made in the server (ranking costs the same whatever
the values; passing 10,000 vectors as float lists took 8 s)."""


def _turn(scope: _Scope, config: MemoryConfig, *, uncached: bool = False) -> Sampler:
    """One turn's memory read as ``MemoryMiddleware._render`` does it, through ``gateway.compose``
    (``uncached``: the vector cache emptied first, untimed)."""
    storage, user = scope.read, scope.user

    def run() -> None:
        composed = compose_memory_block(storage, None, user, QUERY, config)
        assert (composed.scores is not None) == (config.embedding_provider != "none")
        assert composed.block and composed.fact_ids
        storage.record_access(None, user_id=user, fact_ids=composed.fact_ids)

    if not uncached:
        return timed(run)

    def sample() -> float:
        _forget_vectors(storage)
        start = time.perf_counter()
        run()
        return (time.perf_counter() - start) * 1000

    return sample


def _forget_vectors(storage: SqlMemoryStorage) -> None:
    """Empty the provider's per-process vector cache (``SqlVectorStore``; the bench's business only)."""
    store: Any = storage.vectors
    with store._lock:
        store._cache.clear()
        store._cached = 0


def _save_add(scope: _Scope) -> Sampler:
    serial = itertools.count(50_000_000)
    storage, user = scope.read, scope.user

    def sample() -> float:
        memory = storage.load(user_id=user)
        added = fact(next(serial))
        memory["facts"].append(added)
        start = time.perf_counter()
        assert storage.save(memory, user_id=user)
        elapsed = (time.perf_counter() - start) * 1000
        memory = storage.load(user_id=user)
        memory["facts"] = [item for item in memory["facts"] if item["id"] != added["id"]]
        assert storage.save(memory, user_id=user)
        return elapsed

    return sample


def _save_evict(scope: _Scope) -> Sampler:
    """Add one confident fact to a scope at its cap: one of the others is evicted (checked)."""
    serial = itertools.count(60_000_000)
    storage, user = scope.evict, scope.user

    def sample() -> float:
        memory = storage.load(user_id=user)
        assert len(memory["facts"]) == scope.size
        memory["facts"].append({**fact(next(serial)), "confidence": 0.99})
        start = time.perf_counter()
        assert storage.save(memory, user_id=user)
        elapsed = (time.perf_counter() - start) * 1000
        assert len(storage.load(user_id=user)["facts"]) == scope.size
        return elapsed

    return sample


def _update(memory: dict[str, Any]) -> MemoryUpdate:
    """A reply adding three facts and removing the newest shown one."""
    shown = shown_fact_ids(memory, CONVERSATION, get_memory_config()) or {memory["facts"][-1]["id"]}
    new = [
        {"content": f"The user moved their notes to the wiki ({i})", "category": "context", "confidence": 0.9}
        for i in range(3)
    ]
    return {
        "user": {},
        "history": {},
        "newFacts": new,  # type: ignore[typeddict-item]
        "factsToRemove": [max(shown)],
        "staleFactsToRemove": [],
        "factsToConsolidate": [],
    }


def _prompt_chars(memory: dict[str, Any], config: MemoryConfig) -> int:
    prompt = build_update_prompt(memory, CONVERSATION, config=config)
    assert prompt is not None
    return len(prompt[1]["content"])


def large_scope(backends: list[Backend], iterations: int, warmup: int) -> list[Result]:
    """Every operation at every size, each scenario's variants interleaved."""
    started = time.perf_counter()
    scopes = [_build(backend, size) for backend in backends for size in SIZES]
    print(f"  large scope: {len(scopes)} scopes built in {time.perf_counter() - started:.1f} s", flush=True)
    base = get_memory_config()
    off = base.model_copy(update={"embedding_provider": "none"})
    local = base.model_copy(update={"embedding_provider": "local"})
    embedder = get_embedder(local)
    assert embedder is not None and embedder.model == LOCAL_MODEL
    embedder.embed_query(QUERY)  # the engine's first call is slow: keep it out of the deadline
    durability = {scope.variant: scope.backend.durability for scope in scopes}
    storage_scenarios: dict[str, Callable[[_Scope], Sampler]] = {
        "large_cold_load": lambda s: timed(functools.partial(s.read.reload, user_id=s.user)),
        "large_inject": lambda s: _turn(s, off),
        "large_inject_local": lambda s: _turn(s, local),
        "large_inject_local_uncached": lambda s: _turn(s, local, uncached=True),
        "large_save_add1": _save_add,
        "large_save_evict": _save_evict,
    }
    results: list[Result] = []
    for scenario, sampler in storage_scenarios.items():
        variants = {scope.variant: sampler(scope) for scope in scopes}
        samples = interleave(variants, iterations, warmup)
        results += [Result(scenario, name, durability[name], values) for name, values in samples.items()]
    memories = {size: scopes[index].read.load(user_id=scopes[index].user) for index, size in enumerate(SIZES)}
    whole = {size: base.model_copy(update={"update_prompt_max_facts": size}) for size in SIZES}
    prompts = {f"facts_{size}": functools.partial(_prompt_chars, memories[size], base) for size in SIZES}
    extra = {
        f"facts_{size}": {
            "prompt_chars": float(_prompt_chars(memories[size], base)),
            "whole_memory_chars": float(_prompt_chars(memories[size], whole[size])),
        }
        for size in SIZES
    }
    computed = "n/a (pure computation)"
    samples = interleave({name: timed(run) for name, run in prompts.items()}, iterations, warmup)
    results += [Result("large_update_prompt", n, computed, v, extra[n]) for n, v in samples.items()]
    # At the cap, a full scope's steady state: the reply's new facts evict as many others.
    applies = {
        f"facts_{size}": timed(
            functools.partial(
                apply_updates,
                memories[size],
                _update(memories[size]),
                thread_id="bench",
                config=base.model_copy(update={"max_facts": size}),
                shown=shown_fact_ids(memories[size], CONVERSATION, base),
            )
        )
        for size in SIZES
    }
    samples = interleave(applies, iterations, warmup)
    results += [Result("large_update_apply", n, computed, v) for n, v in samples.items()]
    for scope in scopes:  # before the database goes: the recorded accesses, and the pools
        scope.read.close()
        scope.evict.close()
    print(f"  large scope: done in {time.perf_counter() - started:.1f} s", flush=True)
    return results
