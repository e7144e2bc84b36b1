"""Retrieval over long multi-session conversations (issue 39): ``eval_retrieval.py --long-conversations``.

    .venv/bin/python scripts/eval_retrieval.py --long-conversations --markdown out.md
    .venv/bin/python scripts/eval_retrieval.py --long-conversations --conversations en-1 --max-questions 5

The set is ``tests/data/long_conversations.json``, written for memstore (no public data set):

    {"conversations": [{"id": "en-1", "language": "en", "user_id": "u-en-1",
        "sessions": [{"id": "s1", "date": "2025-05-10T19:05:00Z",
            "turns": [{"id": "s1t1", "role": "user" | "assistant", "time": "2025-05-10T19:05:00Z",
                       "content": "..."}]}]}],
     "questions": [{"id": "q1", "conversation": "en-1",
                    "kind": "single-hop" | "multi-hop" | "temporal" | "open-domain",
                    "question": "...", "answer": "...", "evidence": ["s3t4"],
                    "asked_at": "2026-10-20T09:00:00Z"}]}

Four conversations (two English, two Chinese) of about 400 turns in 16 dated sessions over some
17 months, with recurring topics, chit-chat, distractor sessions and facts that later turns
supersede. Questions are phrased as a user would ask them; their evidence is the user turns that
answer them (multi-hop: turns of two sessions or more). No two turns of a conversation have the
same text: the store keeps one live fact per content, so a repeated turn would collapse into one.
``tests/unit/test_long_conversations_data.py`` checks all of this.

Every turn, the assistant's included, is stored as one fact of the conversation's user through
memstore's own save (``createdAt`` = the turn's time, all at the same confidence), embedded with
the configured provider, then every question is asked, scoped to its user, of:

- full-text ``search_facts`` with ``fulltext_match`` ``all`` (before issue 39) and ``any``;
- semantic search; hybrid as before issue 39 (``all``, rank fusion, full-text weight 1.0), with
  ``any`` under rank fusion, and with the defaults (``any``, ``convex``), at ``hybrid_pool`` 50;
- hybrid (``any``) at ``hybrid_pool`` 20, 50, 100 and 200;
- an experiment kept in this script: a second hop for hybrid, which asks again with the first
  hop's top 3 added (their rarest terms, or their whole text) and fuses both hops by rank;
- the injected block, ``MemoryMiddleware.memory_context(user_id=..., query=question)`` at the
  default 2,000 tokens, with the settings before issue 39 and with the defaults, dated or not:
  which evidence turns it holds;
- plain BM25 over the conversation's turns (``inject.relevance.bm25_scores``), as a reference.

Recall@k is the share of a question's evidence turns among the first k results, averaged over the
questions. Latency is the median per question on this machine (the block's includes loading and
ranking the whole scope). Access tracking is off, so no question changes what the next one sees;
``memory_context_timeout_seconds`` is raised so a slow machine cannot turn a ranking into a fallback.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from memstore.config import MemoryConfig, set_memory_config  # noqa: E402
from memstore.gateway.middleware import MemoryMiddleware  # noqa: E402
from memstore.inject.escaping import inline_text  # noqa: E402
from memstore.inject.relevance import bm25_scores, fuse_rankings, ranked_order  # noqa: E402
from memstore.ops.embeddings import embed_facts  # noqa: E402
from memstore.queries import FactFilter, search_facts  # noqa: E402
from memstore.storage.loader import get_memory_storage, reset_memory_storage  # noqa: E402
from memstore.storage.records import FactRecord, SearchMode  # noqa: E402
from memstore.storage.search_text import query_terms  # noqa: E402

DATA = ROOT / "tests" / "data" / "long_conversations.json"
KINDS = ("single-hop", "multi-hop", "temporal", "open-domain")
LANGUAGES = ("en", "zh")
DEPTHS = (5, 10, 20)
POOLS = (20, 50, 100, 200)
DEFAULT_POOL = 50
EXPANSION_HITS = 3
EXPANSION_TERMS = 8
"""The second hop adds this many terms of the first hop's top hits: the rarest in the conversation."""

FULLTEXT_ALL = "full-text, all words (before)"
FULLTEXT_ANY = "full-text, any word (after)"
SEMANTIC = "semantic"
HYBRID_ALL = "hybrid, all words, rank fusion"
HYBRID_RRF = "hybrid, any word, rank fusion"
HYBRID_ANY = "hybrid, any word, convex (after)"
BM25 = "BM25 over the turns (reference)"
HOP_TERMS = "hybrid + second hop (top-3 terms)"
HOP_TEXT = "hybrid + second hop (top-3 text)"
BLOCK_BEFORE = "block before (rank fusion, full-text 1.0, undated)"
BLOCK = "block after (defaults: convex, dated lines)"
BLOCK_UNDATED = "block after, lines without dates"
BEFORE = {"relevance_fusion": "rrf", "relevance_fulltext_weight": 1.0}
"""The ranking settings before issue 39."""


@dataclass(frozen=True)
class Question:
    id: str
    conversation: str
    language: str
    kind: str
    text: str
    evidence: frozenset[str]
    user_id: str


@dataclass
class Conversation:
    user_id: str
    turns: list[tuple[str, str]]
    """(turn id, content) in order."""
    turn_of_fact: dict[str, str]
    document_frequency: dict[str, int]


@dataclass(frozen=True)
class Outcome:
    question: Question
    found: list[str]
    """Turn ids, best first (at most 20), or for the block every turn it shows."""
    ms: float


Ranker = Callable[[Question], list[str]]


def load_set(
    path: Path, only: set[str] | None = None, max_questions: int | None = None
) -> tuple[list[dict[str, Any]], list[Question]]:
    """The conversations (``only`` these ids) and their questions (the first ``max_questions`` of each)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    conversations = [c for c in data["conversations"] if only is None or c["id"] in only]
    by_id = {c["id"]: c for c in conversations}
    questions: list[Question] = []
    asked: dict[str, int] = defaultdict(int)
    for raw in data["questions"]:
        conversation = by_id.get(raw["conversation"])
        if conversation is None or (max_questions is not None and asked[conversation["id"]] >= max_questions):
            continue
        asked[conversation["id"]] += 1
        ids = (raw["id"], conversation["id"], conversation["language"], raw["kind"], raw["question"])
        questions.append(Question(*ids, frozenset(raw["evidence"]), conversation["user_id"]))
    return conversations, questions


def store(conversations: list[dict[str, Any]]) -> tuple[dict[str, Conversation], list[str]]:
    """Save every turn as one fact of its conversation's user; notes on what the store did not keep."""
    storage = get_memory_storage()
    stored: dict[str, Conversation] = {}
    notes: list[str] = []
    number = 0
    for conversation in conversations:
        turns = [(t["id"], t["content"], t["time"]) for s in conversation["sessions"] for t in s["turns"]]
        facts, turn_of_fact = [], {}
        for turn_id, content, stamp in turns:
            number += 1
            fact_id = f"fact_{number:08x}"
            turn_of_fact[fact_id] = turn_id
            fact = {"id": fact_id, "content": content, "category": "context", "confidence": 0.8}
            facts.append({**fact, "createdAt": stamp, "source": "eval"})
        document = {"version": "1.0", "user": {}, "history": {}, "facts": facts}
        user_id = conversation["user_id"]
        if not storage.save(document, user_id=user_id, origin="eval"):
            raise SystemExit(f"could not store {user_id}")
        kept = {fact["id"] for fact in storage.load(user_id=user_id)["facts"]}
        if len(kept) != len(turns):
            notes.append(f"{conversation['id']}: {len(turns)} turns stored as {len(kept)} facts")
        frequency: dict[str, int] = defaultdict(int)
        for _, content, _ in turns:
            for term in set(query_terms(content)):
                frequency[term] += 1
        stored[conversation["id"]] = Conversation(
            user_id, [(t, c) for t, c, _ in turns], turn_of_fact, dict(frequency)
        )
    return stored, notes


Search = Callable[[Question, str], list[FactRecord]]


def _search(config: MemoryConfig, mode: SearchMode) -> Search:
    def search(question: Question, text: str) -> list[FactRecord]:
        where = FactFilter(user_id=question.user_id)
        return list(search_facts(text, where, mode=mode, limit=20, config=config).facts)

    return search


def _turns(conversation: Conversation, records: Sequence[FactRecord]) -> list[str]:
    return [conversation.turn_of_fact[r.fact_id] for r in records if r.fact_id in conversation.turn_of_fact]


def _timed(ranker: Ranker, questions: list[Question]) -> list[Outcome]:
    outcomes = []
    for question in questions:
        started = time.perf_counter()
        try:
            found = ranker(question)
        except Exception as exc:  # a question a mode cannot serve is a miss, not a crash
            print(f"{question.id}: {type(exc).__name__}: {exc}", file=sys.stderr)
            found = []
        outcomes.append(Outcome(question, found, (time.perf_counter() - started) * 1000))
    return outcomes


def _bm25(conversations: dict[str, Conversation]) -> Ranker:
    def rank(question: Question) -> list[str]:
        turns = conversations[question.conversation].turns
        scores = bm25_scores(question.text, [content for _, content in turns])
        return [turns[i][0] for i in ranked_order([s if s > 0 else None for s in scores])][:20]

    return rank


def _block(conversations: dict[str, Conversation], config: MemoryConfig) -> Ranker:
    """The turns whose content the injected ``<memory>`` block shows, as the block escapes it."""
    middleware = MemoryMiddleware(config=config)

    def shown(question: Question) -> list[str]:
        block = middleware.memory_context(user_id=question.user_id, query=question.text)
        return _shown_turns(conversations[question.conversation], block)

    return shown


def _shown_turns(conversation: Conversation, block: str) -> list[str]:
    """Fact lines are ``- [fields] content`` (the fields escape brackets); anything the line adds
    after the content (a date, a correction's mistake) follows a space."""
    turn_of_line = {inline_text(content): turn_id for turn_id, content in conversation.turns}
    longest_first = sorted(turn_of_line, key=len, reverse=True)
    shown = []
    for line in block.splitlines():
        if not line.startswith("- [") or "] " not in line:
            continue
        rest = line.split("] ", 1)[1]
        if rest not in turn_of_line:
            rest = next((text for text in longest_first if rest.startswith(text + " ")), "")
        if rest:
            shown.append(turn_of_line[rest])
    return shown


def _expansion(question: Question, conversation: Conversation, hits: Sequence[FactRecord]) -> list[str]:
    """The first hop's rarest new terms (document frequency in the conversation, then first seen)."""
    asked = set(query_terms(question.text))
    terms = dict.fromkeys(t for hit in hits for t in query_terms(hit.content) if t not in asked)
    frequency = conversation.document_frequency
    return sorted(terms, key=lambda term: frequency.get(term, 0))[:EXPANSION_TERMS]


def _second_hop(
    conversations: dict[str, Conversation],
    config: MemoryConfig,
    first: dict[str, list[FactRecord]],
    whole_text: bool,
) -> Ranker:
    """Ask again with the first hop's top hits added, then fuse both hops' rankings (RRF, equal weights)."""
    search = _search(config, "hybrid")

    def rank(question: Question) -> list[str]:
        conversation = conversations[question.conversation]
        hits = first[question.id]
        top = hits[:EXPANSION_HITS]
        extra = [hit.content for hit in top] if whole_text else _expansion(question, conversation, top)
        second = search(question, " ".join([question.text, *extra])) if extra else hits
        fused = fuse_rankings([(1.0, _turns(conversation, hits)), (1.0, _turns(conversation, second))], 60)
        return [str(turn) for turn in sorted(fused, key=lambda turn: -fused[turn])[:20]]

    return rank


def evaluate(
    conversations: dict[str, Conversation], questions: list[Question], config: MemoryConfig
) -> dict[str, list[Outcome]]:
    """System name -> one outcome per question."""
    results: dict[str, list[Outcome]] = {}

    def run(name: str, ranker: Ranker) -> None:
        started = time.perf_counter()
        results[name] = _timed(ranker, questions)
        print(f"{name}: {time.perf_counter() - started:.1f} s", file=sys.stderr)

    def variant(**settings: Any) -> MemoryConfig:
        return config.model_copy(update=settings)

    def searched(search: Search, keep: dict[str, list[FactRecord]]) -> Ranker:
        def rank(question: Question) -> list[str]:
            records = keep[question.id] = search(question, question.text)
            return _turns(conversations[question.conversation], records)

        return rank

    first: dict[str, list[FactRecord]] = {}
    scratch: dict[str, list[FactRecord]] = {}
    run(BM25, _bm25(conversations))
    run(FULLTEXT_ALL, searched(_search(variant(fulltext_match="all"), "fulltext"), scratch))
    run(FULLTEXT_ANY, searched(_search(variant(fulltext_match="any"), "fulltext"), scratch))
    run(SEMANTIC, searched(_search(config, "semantic"), scratch))
    before = variant(fulltext_match="all", hybrid_pool=DEFAULT_POOL, **BEFORE)
    run(HYBRID_ALL, searched(_search(before, "hybrid"), scratch))
    run(HYBRID_RRF, searched(_search(variant(hybrid_pool=DEFAULT_POOL, **BEFORE), "hybrid"), scratch))
    after = variant(fulltext_match="any", hybrid_pool=DEFAULT_POOL)
    run(HYBRID_ANY, searched(_search(after, "hybrid"), first))
    for pool in POOLS:
        if pool != DEFAULT_POOL:
            pooled = variant(fulltext_match="any", hybrid_pool=pool)
            run(f"hybrid pool {pool}", searched(_search(pooled, "hybrid"), scratch))
    results[f"hybrid pool {DEFAULT_POOL}"] = results[HYBRID_ANY]
    run(HOP_TERMS, _second_hop(conversations, after, first, whole_text=False))
    run(HOP_TEXT, _second_hop(conversations, after, first, whole_text=True))
    run(BLOCK_BEFORE, _block(conversations, variant(injection_fact_dates=False, **BEFORE)))
    run(BLOCK, _block(conversations, config))
    run(BLOCK_UNDATED, _block(conversations, variant(injection_fact_dates=False)))
    return results


def _recall(outcome: Outcome, depth: int | None) -> float:
    found = outcome.found if depth is None else outcome.found[:depth]
    return len(outcome.question.evidence & set(found)) / len(outcome.question.evidence)


def _mean(outcomes: Sequence[Outcome], depth: int | None, test: Callable[[Question], bool]) -> str:
    values = [_recall(o, depth) for o in outcomes if test(o.question)]
    return f"{statistics.fmean(values):.3f}" if values else "-"


def _median_ms(outcomes: Sequence[Outcome]) -> str:
    return f"{statistics.median(o.ms for o in outcomes):.1f}"


GROUPS: tuple[tuple[str, Callable[[Question], bool]], ...] = (
    *((language, lambda q, lang=language: q.language == lang) for language in LANGUAGES),
    *((kind, lambda q, k=kind: q.kind == k) for kind in KINDS),
)


def report(results: dict[str, list[Outcome]], facts: dict[str, str]) -> str:
    """The markdown tables."""
    everyone: Callable[[Question], bool] = lambda _: True  # noqa: E731
    searches = [
        FULLTEXT_ALL,
        FULLTEXT_ANY,
        SEMANTIC,
        HYBRID_ALL,
        HYBRID_RRF,
        HYBRID_ANY,
        HOP_TERMS,
        HOP_TEXT,
        BM25,
    ]
    count = len(results[BM25])
    out = [f"Recall@k over all {count} questions (share of each question's evidence turns found):", ""]
    out += ["| system | recall@5 | @10 | @20 | median ms |", "|---|---:|---:|---:|---:|"]
    for name in searches:
        cells = " | ".join(_mean(results[name], depth, everyone) for depth in DEPTHS)
        out.append(f"| {name} | {cells} | {_median_ms(results[name])} |")
    header = " | ".join(name for name, _ in GROUPS)
    rule = "|---|" + "---:|" * len(GROUPS)
    for depth in (10, 20):
        out += ["", f"Recall@{depth} per language and question kind:", ""]
        out += [f"| system | {header} |", rule]
        for name in searches:
            cells = " | ".join(_mean(results[name], depth, test) for _, test in GROUPS)
            out.append(f"| {name} | {cells} |")
    out += [
        "",
        "The injected block (`memory_context(query=question)`, 2,000 tokens): evidence share in block;",
        "",
    ]
    out += [f"| block | all | {header} | any evidence in block | turns shown (mean) | median ms |"]
    out.append("|---|---:|" + "---:|" * len(GROUPS) + "---:|---:|---:|")
    for name in (BLOCK_BEFORE, BLOCK, BLOCK_UNDATED):
        outcomes = results[name]
        cells = " | ".join(_mean(outcomes, None, test) for _, test in GROUPS)
        hit = statistics.fmean(1.0 if _recall(o, None) > 0 else 0.0 for o in outcomes)
        shown = statistics.fmean(len(o.found) for o in outcomes)
        total = _mean(outcomes, None, everyone)
        out.append(f"| {name} | {total} | {cells} | {hit:.3f} | {shown:.1f} | {_median_ms(outcomes)} |")
    out += ["", "Hybrid (any word) by `hybrid_pool`:", ""]
    out += [
        "| hybrid_pool | recall@5 | @10 | @20 | multi-hop @20 | median ms |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for pool in POOLS:
        outcomes = results[f"hybrid pool {pool}"]
        cells = " | ".join(_mean(outcomes, depth, everyone) for depth in DEPTHS)
        multi = _mean(outcomes, 20, lambda q: q.kind == "multi-hop")
        out.append(f"| {pool} | {cells} | {multi} | {_median_ms(outcomes)} |")
    out += ["", "Second hop (experiment; latency is the hop's own, on top of the first hybrid search):", ""]
    out += [
        f"| system | @10 all | {header} | extra median ms |",
        "|---|---:|" + "---:|" * len(GROUPS) + "---:|",
    ]
    for name in (HYBRID_ANY, HOP_TERMS, HOP_TEXT):
        cells = " | ".join(_mean(results[name], 10, test) for _, test in GROUPS)
        extra = "-" if name == HYBRID_ANY else _median_ms(results[name])
        out.append(f"| {name} | {_mean(results[name], 10, everyone)} | {cells} | {extra} |")
    out += ["", "| measurement | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in facts.items())]
    return "\n".join(out)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--long-conversations", action="store_true", help="run the long-conversation evaluation instead"
    )
    parser.add_argument("--data", type=Path, default=DATA, help="the long-conversation set")
    parser.add_argument("--conversations", help="only these conversation ids, comma-separated")
    parser.add_argument("--max-questions", type=int, help="only the first N questions of each conversation")


def run(args: argparse.Namespace) -> None:
    """Build a throwaway SQLite store, load, embed, ask, print (and write) the tables."""
    begun = time.perf_counter()
    only = set(args.conversations.split(",")) if args.conversations else None
    raw, questions = load_set(args.data, only, args.max_questions)
    if not questions:
        raise SystemExit("no questions selected")
    sizes = [sum(len(s["turns"]) for s in c["sessions"]) for c in raw]
    turns = sum(sizes)
    with tempfile.TemporaryDirectory() as directory:
        settings: dict[str, Any] = {
            "data_dir": directory,
            "embedding_provider": "local",
            "max_facts": max(500, *sizes),  # a scope keeps every turn (500 was the cap before issue 39)
            "access_tracking": False,
            "memory_context_timeout_seconds": 60.0,
        }
        if args.base_url:
            settings.update(
                embedding_model=args.model, embedding_base_url=args.base_url, embedding_provider="openai"
            )
        config = MemoryConfig(**settings)
        set_memory_config(config)
        reset_memory_storage()
        try:
            conversations, notes = store(raw)
            started = time.perf_counter()
            embedded = embed_facts()
            embed_seconds = time.perf_counter() - started
            results = evaluate(conversations, questions, config)
        finally:
            reset_memory_storage()
    languages = ", ".join(f"{lang} {sum(q.language == lang for q in questions)}" for lang in LANGUAGES)
    kinds = ", ".join(f"{kind} {sum(q.kind == kind for q in questions)}" for kind in KINDS)
    facts = {
        "conversations": ", ".join(sorted(conversations)),
        "turns stored (one fact each)": str(turns),
        "questions": f"{len(questions)} ({languages}; {kinds})",
        "evidence turns per question (mean)": f"{statistics.fmean(len(q.evidence) for q in questions):.2f}",
        "embedding model": config.embedding_model or "local default",
        f"embed {embedded} facts": f"{embed_seconds:.1f} s ({embedded / embed_seconds:.0f} facts/s)",
        "whole run": f"{time.perf_counter() - begun:.0f} s",
        "facts the store collapsed": "; ".join(notes) or "none",
    }
    text = report(results, facts)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n", encoding="utf-8")
