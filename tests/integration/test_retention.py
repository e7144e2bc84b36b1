"""Retention on the SQL provider: hybrid eviction at the cap, confirmations, and lifecycle expiry.

Every test runs on a real SQLite file and a real PostgreSQL database. The clock is controlled by
dating facts and their signals relative to one instant (``NOW`` for lifecycle runs, which take
it as an argument; the save's own clock for the cap, with margins of months).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text

from memstore.config import MemoryConfig
from memstore.document import create_empty_memory, format_timestamp
from memstore.ops.lifecycle import LIFECYCLE_ORIGIN, run_lifecycle
from memstore.storage.loader import reset_memory_storage
from memstore.storage.sql.documents.provider import SqlMemoryStorage
from memstore.storage.sql.engine import get_engine
from memstore.update.updater import MemoryUpdater
from tests.support.openai_server import OpenAIStubServer

USER = "alice"
NOW = datetime.now(UTC).replace(microsecond=0)


def _fact(
    number: int, content: str, confidence: float, *, age_days: float = 0, **extra: Any
) -> dict[str, Any]:
    return {
        "id": f"fact_{number:08x}",
        "content": content,
        "category": extra.pop("category", "knowledge"),
        "confidence": confidence,
        "createdAt": format_timestamp(NOW - timedelta(days=age_days)),
        "source": "test",
        **extra,
    }


def _storage(url: str, config: MemoryConfig, **settings: Any) -> SqlMemoryStorage:
    for name, value in settings.items():
        setattr(config, name, value)
    return SqlMemoryStorage(url)


def _save(storage: SqlMemoryStorage, facts: list[dict[str, Any]], **options: Any) -> None:
    document = storage.load(user_id=USER)
    document["facts"] = facts
    assert storage.save(document, user_id=USER, **options)


def _set_signals(url: str, fact_id: str, **columns: Any) -> None:
    assignments = ", ".join(f"{name} = :{name}" for name in columns)
    with get_engine(url).begin() as conn:
        conn.execute(
            text(f"UPDATE memory_facts SET {assignments} WHERE fact_id = :fact_id"),
            {**columns, "fact_id": fact_id},
        )


def _live_ids(storage: SqlMemoryStorage) -> list[str]:
    return [fact["id"] for fact in storage.reload(user_id=USER)["facts"]]


def _deletions(url: str) -> list[tuple[str, str, Any]]:
    with get_engine(url).connect() as conn:
        rows = conn.execute(
            text("SELECT entity_id, origin, detail FROM memory_history WHERE action = 'delete' ORDER BY id")
        ).all()
    # Raw SQL: SQLite hands JSON back as text, psycopg as a dict.
    return [
        (row.entity_id, row.origin, json.loads(row.detail) if isinstance(row.detail, str) else row.detail)
        for row in rows
    ]


def _ten_fresh(confidence: float = 0.9) -> list[dict[str, Any]]:
    return [_fact(100 + n, f"fresh fact {n}", confidence) for n in range(9)]


def test_an_old_unconfirmed_unused_fact_goes_before_a_newer_slightly_more_doubtful_one(
    sql_url: str, isolated_config: MemoryConfig
) -> None:
    storage = _storage(sql_url, isolated_config, max_facts=10)
    old = _fact(1, "user once used Perl", 0.80, age_days=400)
    _save(storage, [old, *_ten_fresh()])
    newer = _fact(2, "user tries Zig", 0.78)
    _save(storage, [*storage.load(user_id=USER)["facts"], newer], origin="thread-1")
    live = _live_ids(storage)
    assert old["id"] not in live and newer["id"] in live and len(live) == 10
    [(fact_id, origin, detail)] = _deletions(sql_url)
    assert (fact_id, origin) == (old["id"], "thread-1")
    assert detail["reason"] == "evicted" and detail["policy"] == "hybrid" and detail["max_facts"] == 10
    assert detail["confidence"] == 0.8 and detail["heat"] == 0.0 and detail["freshness"] < 0.03
    assert detail["score"] == pytest.approx(0.65 * 0.8 + 0.25 * detail["freshness"], abs=1e-6)


def test_the_confidence_policy_keeps_the_old_behaviour(sql_url: str, isolated_config: MemoryConfig) -> None:
    storage = _storage(sql_url, isolated_config, max_facts=10, eviction_policy="confidence")
    old = _fact(1, "user once used Perl", 0.80, age_days=400)
    _save(storage, [old, *_ten_fresh()])
    newer = _fact(2, "user tries Zig", 0.78)
    _save(storage, [*storage.load(user_id=USER)["facts"], newer])
    assert newer["id"] not in _live_ids(storage) and old["id"] in _live_ids(storage)
    assert _deletions(sql_url) == []  # the new fact was never stored, so nothing was deleted


def test_recent_use_and_confirmation_keep_a_fact(sql_url: str, isolated_config: MemoryConfig) -> None:
    storage = _storage(sql_url, isolated_config, max_facts=10)
    used = _fact(1, "user deploys with Helm", 0.7, age_days=300)
    confirmed = _fact(2, "user lives in Lyon", 0.7, age_days=300)
    forgotten = _fact(3, "user liked a podcast", 0.7, age_days=300)
    _save(storage, [used, confirmed, forgotten, *_ten_fresh()[:7]])
    _set_signals(sql_url, used["id"], access_count=6, last_accessed_at=NOW - timedelta(days=1))
    assert storage.save(storage.load(user_id=USER), user_id=USER, confirmed=[confirmed["id"]])
    _save(storage, [*storage.load(user_id=USER)["facts"], _fact(4, "user starts a course", 0.9)])
    live = _live_ids(storage)
    assert used["id"] in live and confirmed["id"] in live and forgotten["id"] not in live
    [(fact_id, _, detail)] = _deletions(sql_url)
    assert fact_id == forgotten["id"] and detail["reason"] == "evicted"


def test_corrections_keep_their_reserved_slot_and_every_eviction_is_audited(
    sql_url: str, isolated_config: MemoryConfig
) -> None:
    storage = _storage(sql_url, isolated_config, max_facts=10)
    weak_correction = _fact(1, "use tabs, not spaces", 0.3, age_days=200, category="correction")
    weaker_correction = _fact(2, "never force-push", 0.2, age_days=200, category="correction")
    _save(storage, [weak_correction, weaker_correction, *_ten_fresh()[:8]])
    extra = [_fact(200 + n, f"strong fact {n}", 0.95) for n in range(3)]
    _save(storage, [*storage.load(user_id=USER)["facts"], *extra])
    live = _live_ids(storage)
    # max_facts 10 reserves ceil(10 * 0.10) = 1 slot: the better correction keeps it.
    assert weak_correction["id"] in live and weaker_correction["id"] not in live and len(live) == 10
    deletions = _deletions(sql_url)
    assert len(deletions) == 13 - 10
    assert all(detail is not None and detail["reason"] == "evicted" for _, _, detail in deletions)


def test_a_confirmation_is_no_content_change(sql_url: str, isolated_config: MemoryConfig) -> None:
    storage = _storage(sql_url, isolated_config)
    fact = _fact(1, "user writes Go", 0.9, age_days=10)
    _save(storage, [fact])
    before = storage.load(user_id=USER)
    assert storage.save(before, user_id=USER, confirmed=[fact["id"], "fact_deadbeef"])
    after = storage.reload(user_id=USER)
    assert after["revision"] == before["revision"]
    with get_engine(sql_url).connect() as conn:
        confirmed_at = conn.execute(text("SELECT last_confirmed_at FROM memory_facts")).scalar_one()
        audit_rows = conn.execute(text("SELECT count(*) FROM memory_history")).scalar_one()
    assert confirmed_at is not None
    assert audit_rows == 1  # the insert only


def _expiry_scope(storage: SqlMemoryStorage, url: str) -> dict[str, dict[str, Any]]:
    facts = {
        "forgotten": _fact(1, "user used Python 2", 0.9, age_days=400),
        "fresh": _fact(2, "user uses Python 3.12", 0.9, age_days=5),
        "correction": _fact(3, "do not suggest Python 2", 0.9, age_days=400, category="correction"),
        "used": _fact(4, "user maintains a Django app", 0.9, age_days=400),
        "doubtful": _fact(5, "user may like Rust", 0.2, age_days=1),
    }
    _save(storage, list(facts.values()))
    _set_signals(url, facts["used"]["id"], access_count=5, last_accessed_at=NOW - timedelta(days=2))
    return facts


def test_lifecycle_dry_run_changes_nothing_and_a_run_removes_exactly_its_list(
    sql_url: str, isolated_config: MemoryConfig
) -> None:
    storage = _storage(sql_url, isolated_config, expire_below=0.2)
    facts = _expiry_scope(storage, sql_url)
    bob = create_empty_memory()
    bob["facts"] = [_fact(9, "bob used COBOL", 0.9, age_days=900)]
    assert storage.save(bob, user_id="bob")
    before = storage.reload(user_id=USER)

    dry = run_lifecycle(dry_run=True, user_id=USER, now=NOW, storage=storage)
    expected = {facts["forgotten"]["id"], facts["doubtful"]["id"]}
    assert {fact.fact_id for fact in dry.expiring} == expected
    assert all(fact.decay.value < 0.2 for fact in dry.expiring) and dry.removed == 0
    assert storage.reload(user_id=USER) == before
    assert _deletions(sql_url) == []

    run = run_lifecycle(dry_run=False, user_id=USER, now=NOW, storage=storage)
    assert [fact.to_json() for fact in run.expiring] == [fact.to_json() for fact in dry.expiring]
    assert run.removed == 2
    assert set(_live_ids(storage)) == {facts["fresh"]["id"], facts["correction"]["id"], facts["used"]["id"]}
    deletions = _deletions(sql_url)
    assert {fact_id for fact_id, _, _ in deletions} == expected
    assert all(
        origin == LIFECYCLE_ORIGIN and detail["reason"] == "expired" for _, origin, detail in deletions
    )
    assert [fact["id"] for fact in storage.reload(user_id="bob")["facts"]] == ["fact_00000009"]


def test_a_stale_document_cannot_bring_an_expired_fact_back(
    sql_url: str, isolated_config: MemoryConfig
) -> None:
    storage = _storage(sql_url, isolated_config, expire_below=0.2)
    facts = _expiry_scope(storage, sql_url)
    stale = storage.load(user_id=USER)  # a writer loads, then the lifecycle run lands first
    other_process = SqlMemoryStorage(sql_url)
    assert run_lifecycle(dry_run=False, user_id=USER, now=NOW, storage=other_process).removed == 2
    stale["facts"].append(_fact(6, "user starts learning Elixir", 0.9))
    stale["facts"][1]["content"] = "user uses Python 3.13"
    assert storage.save(stale, user_id=USER)
    live = {fact["id"]: fact for fact in storage.reload(user_id=USER)["facts"]}
    assert facts["forgotten"]["id"] not in live and facts["doubtful"]["id"] not in live
    assert live["fact_00000006"]["content"] == "user starts learning Elixir"
    assert live[facts["fresh"]["id"]]["content"] == "user uses Python 3.13"


def test_the_cli_lists_by_score_and_runs_the_lifecycle(cli: Any) -> None:
    storage = SqlMemoryStorage(cli.url)
    facts = _expiry_scope(storage, cli.url)
    listed = cli.json("facts", "list", "--user", USER, "--sort", "score")
    scores = [fact["score"] for fact in listed["facts"]]
    assert scores == sorted(scores, reverse=True) and len(scores) == 5
    by_id = {fact["fact_id"]: fact for fact in listed["facts"]}
    assert by_id[facts["used"]["id"]]["access_count"] == 5
    assert by_id[facts["used"]["id"]]["last_accessed_at"] is not None
    assert by_id[facts["fresh"]["id"]]["last_accessed_at"] is None
    by_use = cli.json("facts", "list", "--user", USER, "--sort", "access-count")
    assert by_use["facts"][0]["fact_id"] == facts["used"]["id"]
    table = cli("facts", "list", "--user", USER, "--retention")
    assert table.returncode == 0 and "SCORE" in table.stdout and "LAST ACCESS" in table.stdout

    unset = cli("lifecycle", "run", "--dry-run")
    assert unset.returncode == 0 and "expiry:     off: expire_below is not set" in unset.stdout
    dry = cli.json("lifecycle", "run", "--dry-run", "--below", "0.2")
    assert dry["dry_run"] and dry["removed"] == 0
    assert {fact["fact_id"] for fact in dry["expiring"]} == {
        facts["forgotten"]["id"],
        facts["doubtful"]["id"],
    }
    assert len(storage.reload(user_id=USER)["facts"]) == 5
    shown = cli("lifecycle", "run", "--dry-run", "--below", "0.2", "--limit", "5")
    assert "would remove 2 fact(s)" in shown.stdout and "user used Python 2" in shown.stdout
    run = cli.json("lifecycle", "run", "--below", "0.2", "--user", USER)
    assert run["removed"] == 2 and not run["dry_run"]
    assert len(storage.reload(user_id=USER)["facts"]) == 3
    audit = cli("history", "--user", USER)
    assert "user used Python 2 [expired, score 0.0" in audit.stdout and "lifecycle" in audit.stdout
    entries = cli.json("history", "--user", USER)
    expired = [entry for entry in entries if entry["action"] == "delete"]
    assert {entry["detail"]["reason"] for entry in expired} == {"expired"} and len(expired) == 2
    nothing = cli("lifecycle", "run", "--below", "0.2")
    assert nothing.returncode == 0 and "removed 0 fact(s)" in nothing.stdout  # a result, not an error


def test_the_updater_confirms_restated_facts_and_audits_why_facts_went(
    sql_url: str, isolated_config: MemoryConfig, openai_server: OpenAIStubServer
) -> None:
    """Through the real updater and an OpenAI-compatible server: re-statement, staleness, the cap."""
    storage = _storage(
        sql_url,
        isolated_config,
        max_facts=10,
        database_url=sql_url,
        llm_base_url=openai_server.base_url,
        llm_api_key="test-key",
        model_name="test-model",
    )
    restated = _fact(1, "User prefers Python", 0.9, age_days=200)
    stale = _fact(2, "User is moving house next week", 0.75, age_days=200)
    old = [_fact(10 + n, f"old fact {n}", 0.8, age_days=200) for n in range(8)]
    _save(storage, [restated, stale, *old])
    reset_memory_storage()
    openai_server.script(
        json.dumps(
            {
                "user": {},
                "history": {},
                "newFacts": [
                    {"content": "user prefers python", "category": "preference", "confidence": 0.95},
                    {"content": "User moved to Lyon", "category": "context", "confidence": 0.9},
                    {"content": "User learns Rust", "category": "goal", "confidence": 0.9},
                ],
                "factsToRemove": [],
                "staleFactsToRemove": [{"id": stale["id"], "reason": "the move is over"}],
            }
        )
    )
    messages = [{"role": "user", "content": "I still prefer Python. I moved to Lyon and I am learning Rust."}]
    assert MemoryUpdater().update_memory(messages, thread_id="thread-9", user_id=USER)
    live = storage.reload(user_id=USER)["facts"]
    contents = [fact["content"] for fact in live]
    assert contents.count("User prefers Python") == 1 and "user prefers python" not in contents
    assert "User moved to Lyon" in contents and "User learns Rust" in contents and len(live) == 10
    with get_engine(sql_url).connect() as conn:
        confirmed = (
            conn.execute(text("SELECT fact_id FROM memory_facts WHERE last_confirmed_at IS NOT NULL"))
            .scalars()
            .all()
        )
    assert confirmed == [restated["id"]]
    reasons = {fact_id: detail for fact_id, origin, detail in _deletions(sql_url) if origin == "thread-9"}
    assert reasons.pop(stale["id"]) == {"reason": "stale", "llm_reason": "the move is over"}
    # Eight old facts, the re-stated one and two new ones: one old fact goes, with its score.
    [(evicted_id, detail)] = reasons.items()
    assert (
        evicted_id.startswith("fact_000000")
        and detail["reason"] == "evicted"
        and detail["policy"] == "hybrid"
    )
    assert restated["id"] in [fact["id"] for fact in live]


def test_a_lifecycle_run_removes_only_its_list_even_over_the_cap(
    sql_url: str, isolated_config: MemoryConfig
) -> None:
    host = SqlMemoryStorage(sql_url, max_facts=50)  # a host's larger cap, e.g. DeerMem's
    facts = [_fact(1, "user used Python 2", 0.9, age_days=400)]
    facts += [_fact(10 + n, f"fresh fact {n}", 0.9) for n in range(14)]
    _save(host, facts)
    storage = _storage(sql_url, isolated_config, max_facts=10, expire_below=0.2)
    run = run_lifecycle(dry_run=False, user_id=USER, now=NOW, storage=storage)
    assert [fact.fact_id for fact in run.expiring] == ["fact_00000001"] and run.removed == 1
    assert len(_live_ids(storage)) == 14
    assert [fact_id for fact_id, _, _ in _deletions(sql_url)] == ["fact_00000001"]


def test_the_lifecycle_covers_legacy_scopes_and_reads_categories_and_dates_defensively(
    sql_url: str, isolated_config: MemoryConfig
) -> None:
    storage = _storage(sql_url, isolated_config, expire_below=0.2)
    legacy = create_empty_memory()
    legacy["facts"] = [
        _fact(1, "legacy global fact", 0.9, age_days=400),
        _fact(2, "a padded correction", 0.9, age_days=400, category="correction "),
        _fact(3, "dated in year 9999", 0.9, createdAt="9999-01-01T00:00:00Z"),
    ]
    assert storage.save(legacy)  # the legacy global scope: no user, no agent
    agent_only = create_empty_memory()
    agent_only["facts"] = [_fact(4, "agent-wide fact", 0.9, age_days=400)]
    assert storage.save(agent_only, "researcher")
    report = run_lifecycle(dry_run=True, now=NOW, storage=storage)
    found = {(fact.user_id, fact.agent_name, fact.fact_id) for fact in report.expiring}
    assert found == {
        (None, None, "fact_00000001"),
        (None, None, "fact_00000003"),
        (None, "researcher", "fact_00000004"),
    }
    assert report.scopes_scanned == 2


def test_the_fast_path_ranks_the_cap_with_the_signals_flushed_since_it_cached(
    sql_url: str, isolated_config: MemoryConfig
) -> None:
    storage = _storage(sql_url, isolated_config, max_facts=10)
    used = _fact(1, "user deploys with Helm", 0.80, age_days=300)
    unused = _fact(2, "user liked a podcast", 0.82, age_days=300)
    _save(storage, [used, unused, *_ten_fresh()[:8]])
    warm = storage.load(user_id=USER)  # cached before the accesses are written
    other_process = SqlMemoryStorage(sql_url)
    other_process.record_access(None, user_id=USER, fact_ids=[used["id"]] * 8)
    assert other_process.flush_access() == 1
    warm["facts"].append(_fact(3, "user starts a course", 0.9))
    assert storage.save(warm, user_id=USER)
    live = _live_ids(storage)
    assert used["id"] in live and unused["id"] not in live


def test_a_hosts_eviction_note_lands_only_on_the_deletion_its_save_made(
    sql_url: str, isolated_config: MemoryConfig
) -> None:
    storage = _storage(sql_url, isolated_config)
    _save(storage, [_fact(1, "user writes Go", 0.9), _fact(2, "user writes Zig", 0.9)])
    _save(storage, [_fact(2, "user writes Zig", 0.9)], origin="manual")  # a person deletes fact 1
    _save(storage, [])  # a host's save drops fact 2
    details: dict[str, dict[str, Any]] = {
        "fact_00000001": {"reason": "evicted"},
        "fact_00000002": {"reason": "evicted", "score": 0.3},
    }
    storage.annotate_removals(None, user_id=USER, details=details)
    assert {fact_id: detail for fact_id, _, detail in _deletions(sql_url)} == {
        "fact_00000001": None,
        "fact_00000002": {"reason": "evicted", "score": 0.3},
    }


def test_a_fact_confirmed_by_a_save_is_ranked_as_confirmed_by_that_saves_cap(
    sql_url: str, isolated_config: MemoryConfig
) -> None:
    host = SqlMemoryStorage(sql_url, max_facts=3)  # a store cap below the updater's
    restated = _fact(1, "user works at Acme", 0.8, age_days=400)
    _save(host, [restated, _fact(2, "user likes tea", 0.7), _fact(3, "user likes jazz", 0.7)])
    document = host.load(user_id=USER)
    document["facts"].append(_fact(4, "user learns Rust", 0.9))
    assert host.save(document, user_id=USER, confirmed=[restated["id"]])
    live = _live_ids(host)
    assert restated["id"] in live and len(live) == 3


def test_a_merged_fact_takes_over_its_sources_signals(sql_url: str, isolated_config: MemoryConfig) -> None:
    storage = _storage(sql_url, isolated_config, expire_below=0.2)
    sources = [
        _fact(1, "user uses Helm", 0.9, age_days=400),
        _fact(2, "user uses Argo CD", 0.9, age_days=400),
    ]
    _save(storage, [*sources, _fact(3, "user likes tea", 0.9)])
    _set_signals(sql_url, sources[0]["id"], access_count=3, last_accessed_at=NOW - timedelta(days=2))
    _set_signals(sql_url, sources[1]["id"], access_count=4, last_accessed_at=NOW - timedelta(days=1))
    merged = {
        **_fact(9, "user deploys with Helm and Argo CD", 0.9, age_days=400),
        "consolidatedFrom": ["a", "b"],
    }
    document = storage.load(user_id=USER)
    document["facts"] = [document["facts"][2], merged]
    removals = {source["id"]: {"reason": "consolidated", "into": merged["id"]} for source in sources}
    assert storage.save(document, user_id=USER, removals=removals)
    signals = storage.fact_signals(user_id=USER)[merged["id"]]
    assert signals.access_count == 7 and signals.last_accessed_at is not None
    assert signals.last_accessed_at > NOW - timedelta(days=1, minutes=1)
    assert run_lifecycle(dry_run=True, user_id=USER, storage=storage).expiring == []
