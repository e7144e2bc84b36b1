"""The save fast path (planning from the cached snapshot) against the full merge over the stored rows.

Each step edits the same document in two scopes: one saved by a storage whose cache holds the loaded
revision (the fast path), one by a storage that forgot its cache (the full path). Both must leave the
same rows, the same audit trail and the same document.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import Engine, event, text

from memstore.config import MemoryConfig
from memstore.document import create_empty_memory
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import get_engine

Step = Callable[[dict[str, Any]], None]
FAST, FULL = "fast", "full"


def _fact(index: int, content: str | None = None, **extra: Any) -> dict[str, Any]:
    fact: dict[str, Any] = {
        "id": f"fact_{index:08x}",
        "content": content if content is not None else f"fact number {index}",
        "category": "context",
        "confidence": round(0.5 + index % 7 / 20, 2),
        "createdAt": "2026-07-14T15:35:46.123456Z",
        "source": "thread-1",
    }
    fact.update(extra)
    return fact


def _new(doc: dict[str, Any], content: str | None = None, **extra: Any) -> dict[str, Any]:
    """A fact with an id the document does not have yet, the same in both scopes."""
    index = 1 + max((int(fact["id"][5:], 16) for fact in doc.get("facts", [])), default=0)
    return _fact(index, content, **extra)


def _seed(count: int) -> dict[str, Any]:
    doc = create_empty_memory()
    doc["facts"] = [_fact(index) for index in range(count)]
    doc["user"]["workContext"] = {"summary": "works on memstore", "updatedAt": "2026-07-14T15:35:46Z"}
    return doc


@contextmanager
def _fact_reads(engine: Engine) -> Iterator[list[str]]:
    """SELECTs on the fact and section tables: the full path reads them, the fast path must not."""
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().startswith("SELECT") and (
            "FROM memory_facts" in statement or "FROM memory_sections" in statement
        ):
            seen.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


def _state(engine: Engine, user: str) -> dict[str, Any]:
    """Everything a save writes for one scope, without ids and wall-clock stamps."""
    with engine.connect() as conn:
        params = {"u": user}
        scope = conn.execute(
            text("SELECT revision, version FROM memory_scopes WHERE user_id = :u"), params
        ).one()
        facts = conn.execute(
            text(
                "SELECT f.fact_id, f.position, f.content, f.content_key, f.category, f.confidence,"
                " f.created_at, f.source, f.source_error, f.extra, f.added_revision, f.updated_revision,"
                " f.deleted_revision FROM memory_facts f JOIN memory_scopes s ON s.id = f.scope_id"
                " WHERE s.user_id = :u ORDER BY f.fact_id"
            ),
            params,
        ).all()
        sections = conn.execute(
            text(
                "SELECT x.section, x.summary, x.updated_at, x.extra, x.revision FROM memory_sections x"
                " JOIN memory_scopes s ON s.id = x.scope_id WHERE s.user_id = :u ORDER BY x.section"
            ),
            params,
        ).all()
        history = conn.execute(
            text(
                "SELECT h.revision, h.entity, h.entity_id, h.action, h.before, h.after FROM memory_history h"
                " JOIN memory_scopes s ON s.id = h.scope_id WHERE s.user_id = :u ORDER BY h.id"
            ),
            params,
        ).all()
    return {
        "scope": tuple(scope),
        "facts": [tuple(row) for row in facts],
        "sections": [tuple(row) for row in sections],
        "history": [tuple(row) for row in history],
    }


def _comparable(doc: dict[str, Any]) -> dict[str, Any]:
    # The save time and the scope row's identity differ between the two scopes by design.
    return {key: value for key, value in doc.items() if key not in ("lastUpdated", "incarnation")}


def _run(url: str, seed: dict[str, Any], steps: list[Step], *, reads_signals: bool = False) -> None:
    """Apply each step in both scopes; the fast scope must take the fast path and match the full one.

    With ``reads_signals`` (a hybrid cap), a save over the cap may read the live facts' retention
    signals, which no snapshot holds, and nothing else.
    """
    fast, full = SqlMemoryStorage(url), SqlMemoryStorage(url)
    engine = get_engine(url)
    assert fast.save(seed, user_id=FAST) and full.save(seed, user_id=FULL)
    for step in steps:
        doc_fast, doc_full = fast.load(user_id=FAST), full.load(user_id=FULL)
        assert _comparable(doc_fast) == _comparable(doc_full)
        step(doc_fast)
        step(doc_full)
        full.close()  # no cached snapshot: parse everything, read and merge the rows
        with _fact_reads(engine) as reads:
            saved_fast = fast.save(doc_fast, user_id=FAST)
        if reads_signals:
            reads = [read for read in reads if not read.startswith(_SIGNALS_READ)]
        assert reads == []
        assert saved_fast == full.save(doc_full, user_id=FULL)
        assert _state(engine, FAST) == _state(engine, FULL)
        for storage in (fast, full):
            storage.close()
        assert _comparable(fast.load(user_id=FAST)) == _comparable(full.load(user_id=FULL))


def _append(doc: dict[str, Any]) -> None:
    doc["facts"].append(_new(doc, "one more"))


def _edit_in_place(doc: dict[str, Any]) -> None:
    doc["facts"][2]["content"] = "rewritten"
    doc["facts"][3]["confidence"] = 0.99


def _retype_confidence(doc: dict[str, Any]) -> None:
    # Equal under ==, but not the same document: 1 is kept as an int, True coerces to 0.5.
    doc["facts"][0]["confidence"] = 1.0
    doc["facts"][1]["confidence"] = True


def _remove(doc: dict[str, Any]) -> None:
    del doc["facts"][0]
    del doc["facts"][3]


def _duplicate_content(doc: dict[str, Any]) -> None:
    doc["facts"].append(_new(doc, "  FACT NUMBER 2 "))


def _edit_into_duplicate(doc: dict[str, Any]) -> None:
    doc["facts"][4]["content"] = "Fact Number 5"


def _take_freed_content(doc: dict[str, Any]) -> None:
    doc["facts"][1]["content"] = "renamed"
    doc["facts"].append(_new(doc, "fact number 1"))


def _reorder(doc: dict[str, Any]) -> None:
    doc["facts"].reverse()


def _insert_in_the_middle(doc: dict[str, Any]) -> None:
    doc["facts"].insert(2, _new(doc, "in the middle"))


def _sections_and_version(doc: dict[str, Any]) -> None:
    doc["user"]["workContext"] = {"summary": "new work", "updatedAt": "2026-07-15T00:00:00Z"}
    doc["history"]["recentMonths"] = {"summary": "busy months", "updatedAt": "2026-07-15", "note": 1}
    doc["version"] = "1.1"


def _unknown_keys(doc: dict[str, Any]) -> None:
    doc["facts"][0]["topics"] = {"a": [1, 2.0, True]}
    doc["facts"][1]["$memstore"] = "user data"


def _no_facts_key(doc: dict[str, Any]) -> None:
    del doc["facts"]
    doc["user"]["topOfMind"] = {"summary": "only a section", "updatedAt": ""}


def _nothing(_doc: dict[str, Any]) -> None:
    pass


def _swap_contents(doc: dict[str, Any]) -> None:
    # Both paths apply both edits, and the unique content key refuses the first one.
    first, second = doc["facts"][0], doc["facts"][1]
    first["content"], second["content"] = second["content"], first["content"]


@pytest.mark.parametrize(
    "step",
    [
        _append,
        _edit_in_place,
        _retype_confidence,
        _remove,
        _duplicate_content,
        _edit_into_duplicate,
        _take_freed_content,
        _reorder,
        _insert_in_the_middle,
        _sections_and_version,
        _unknown_keys,
        _no_facts_key,
        _nothing,
        _swap_contents,
    ],
)
def test_each_kind_of_change_matches_the_full_path(sql_url: str, step: Step) -> None:
    _run(sql_url, _seed(8), [step, _unknown_keys, step])


def test_nested_values_edited_in_place_are_seen(sql_url: str) -> None:
    def edit(doc: dict[str, Any]) -> None:
        doc["facts"][0]["topics"]["a"][1] = 2  # 2.0 -> 2: equal under ==, a different document

    _run(sql_url, _seed(4), [_unknown_keys, edit])


def test_a_removed_fact_comes_back_with_its_id(sql_url: str) -> None:
    removed = _seed(5)["facts"][2]

    def restore(doc: dict[str, Any]) -> None:
        doc["facts"].append(dict(removed))

    def remove(doc: dict[str, Any]) -> None:
        doc["facts"] = [fact for fact in doc["facts"] if fact["id"] != removed["id"]]

    _run(sql_url, _seed(5), [remove, restore, remove, restore])


_SIGNALS_READ = "SELECT memory_facts.fact_id, memory_facts.last_confirmed_at"


@pytest.mark.parametrize("policy", ["confidence", "hybrid"])
def test_the_cap_drops_the_same_facts(sql_url: str, isolated_config: MemoryConfig, policy: str) -> None:
    isolated_config.max_facts = 10
    isolated_config.eviction_policy = policy  # type: ignore[assignment]

    def add_strong(doc: dict[str, Any]) -> None:
        doc["facts"].append(_new(doc, "strong", confidence=0.97))
        doc["facts"].append(_new(doc, "weak", confidence=0.1))
        doc["facts"][0]["confidence"] = 0.2

    def add_ties(doc: dict[str, Any]) -> None:
        doc["facts"].insert(0, _new(doc, "tie one", confidence=0.5))
        doc["facts"].append(_new(doc, "tie two", confidence=0.5))

    _run(sql_url, _seed(10), [add_strong, add_ties, add_strong], reads_signals=policy == "hybrid")


@pytest.mark.parametrize("policy", ["confidence", "hybrid"])
def test_a_random_walk_of_edits_matches_the_full_path(
    sql_url: str, isolated_config: MemoryConfig, policy: str
) -> None:
    isolated_config.max_facts = 12
    isolated_config.eviction_policy = policy  # type: ignore[assignment]
    rng = random.Random(20260714)

    def random_step(doc: dict[str, Any]) -> None:
        facts = doc["facts"]
        for _ in range(rng.randint(0, 3)):
            action = rng.choice(["add", "add", "edit", "remove", "dup", "move", "section", "retype"])
            if action == "add":
                facts.insert(rng.randint(0, len(facts)), _new(doc, confidence=rng.random()))
            elif action == "dup" and facts:
                facts.append(_new(doc, rng.choice(facts)["content"].upper()))
            elif action == "edit" and facts:
                rng.choice(facts)["content"] = f"edited {rng.randint(0, 5)}"
            elif action == "remove" and facts:
                facts.pop(rng.randrange(len(facts)))
            elif action == "move" and facts:
                facts.insert(rng.randint(0, len(facts)), facts.pop(rng.randrange(len(facts))))
            elif action == "retype" and facts:
                rng.choice(facts)["confidence"] = rng.choice([1, 1.0, 0, 0.0, True, "0.9"])
            elif action == "section":
                doc["user"]["topOfMind"] = {"summary": f"mind {rng.randint(0, 3)}", "updatedAt": ""}

    saved: list[Any] = []

    def paired(doc: dict[str, Any]) -> None:
        """The first call of each step draws the random edits; the second (other scope) replays them."""
        if saved:
            rng.setstate(saved.pop())
        else:
            saved.append(rng.getstate())
        random_step(doc)

    _run(sql_url, _seed(10), [paired] * 40, reads_signals=policy == "hybrid")


# --- the fast path and other writers ----------------------------------------------------------------


def test_a_save_after_another_writer_merges_instead_of_replacing(sql_url: str) -> None:
    first, second = SqlMemoryStorage(sql_url), SqlMemoryStorage(sql_url)
    assert first.save(_seed(4), user_id="alice")
    doc = first.load(user_id="alice")
    doc["facts"].append(_fact(100, "from first, fast"))
    assert first.save(doc, user_id="alice")  # fast path: first's cache is current
    stale = first.load(user_id="alice")
    other = second.load(user_id="alice")
    other["facts"].append(_fact(101, "from second"))
    del other["facts"][0]
    assert second.save(other, user_id="alice")
    # first's cache is now behind the store: the full merge must keep second's add and delete.
    stale["facts"].append(_fact(102, "from first, merged"))
    stale["facts"][1]["confidence"] = 0.01
    assert first.save(stale, user_id="alice")
    contents = [fact["content"] for fact in SqlMemoryStorage(sql_url).load(user_id="alice")["facts"]]
    assert contents == [
        "fact number 1",
        "fact number 2",
        "fact number 3",
        "from first, fast",
        "from second",
        "from first, merged",
    ]
    assert first.load(user_id="alice")["facts"][0]["confidence"] == 0.01


def test_a_stale_document_from_the_same_instance_is_merged(sql_url: str) -> None:
    storage = SqlMemoryStorage(sql_url)
    assert storage.save(_seed(3), user_id="alice")
    stale, fresh = storage.load(user_id="alice"), storage.load(user_id="alice")
    del fresh["facts"][0]
    assert storage.save(fresh, user_id="alice")
    stale["facts"].append(_fact(100, "late add"))
    assert storage.save(stale, user_id="alice")  # revision behind the cache: the full merge
    contents = [fact["content"] for fact in storage.reload(user_id="alice")["facts"]]
    assert contents == ["fact number 1", "fact number 2", "late add"]


def test_the_cached_snapshot_does_not_share_objects_with_the_caller(sql_url: str) -> None:
    storage = SqlMemoryStorage(sql_url)
    assert storage.save(_seed(2), user_id="alice")
    doc = storage.load(user_id="alice")
    doc["facts"].append(_fact(100, "nested", topics={"a": [1]}))
    assert storage.save(doc, user_id="alice")
    doc["facts"][-1]["topics"]["a"].append(2)  # must not edit what the next save compares against
    again = storage.load(user_id="alice")
    assert again["facts"][-1]["topics"] == {"a": [1]}
    again["facts"][-1]["topics"]["a"].append(2)
    assert storage.save(again, user_id="alice")
    assert storage.reload(user_id="alice")["facts"][-1]["topics"] == {"a": [1, 2]}


def test_a_document_loaded_before_a_clear_does_not_bring_cleared_facts_back(sql_url: str) -> None:
    storage = SqlMemoryStorage(sql_url)
    assert storage.save(_seed(3), user_id="alice")
    doc = storage.load(user_id="alice")
    assert storage.clear(user_id="alice")
    doc["facts"].append(_fact(100, "after clear"))
    assert storage.save(doc, user_id="alice")
    assert [fact["content"] for fact in storage.reload(user_id="alice")["facts"]] == ["after clear"]
