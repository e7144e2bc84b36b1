"""The memory-record fields (issue 32) through the fact helpers and the query surface, on the file
provider, SQLite and PostgreSQL: stored, filtered, scored, versioned, related, and refused when bad."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from memstore.config import FILE_STORAGE_CLASS, SQL_STORAGE_CLASS, MemoryConfig, set_memory_config
from memstore.errors import InvalidDocumentError, InvalidFactError, QueryError
from memstore.ops.facts import (
    create_memory_fact,
    create_memory_fact_with_created_fact,
    get_memory_data,
    import_memory_data,
    search_memory_facts,
    update_memory_fact,
)
from memstore.queries import FactFilter, fact_relations, list_facts, memory_history, search_facts
from memstore.record import RECORD_KEYS
from memstore.storage.loader import get_memory_storage, reset_memory_storage
from memstore.storage.sql.engine import dispose_engines

RECORD: dict[str, Any] = {
    "memory_type": "procedural",
    "importance": 0.9,
    "tags": ["work", "editor"],
    "source_kind": "explicit_user_input",
    "raw": "I always use vim, don't suggest anything else",
    "structured": {"editor": "vim", "strict": True},
}
STORED = {
    "type": "procedural",
    "importance": 0.9,
    "tags": ["editor", "work"],
    "sourceKind": "explicit_user_input",
    "raw": "I always use vim, don't suggest anything else",
    "structured": {"editor": "vim", "strict": True},
}


@pytest.fixture(
    autouse=True,
    params=["file", "sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)],
)
def provider(request: pytest.FixtureRequest, isolated_config: MemoryConfig) -> Iterator[str]:
    if request.param == "file":
        update: dict[str, Any] = {"storage_class": FILE_STORAGE_CLASS}
    else:
        url = request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "postgres_url")
        update = {"storage_class": SQL_STORAGE_CLASS, "database_url": url}
    set_memory_config(isolated_config.model_copy(update=update))
    reset_memory_storage()
    yield str(request.param)
    reset_memory_storage()
    dispose_engines()


def _fact(fact_id: str) -> dict[str, Any]:
    [fact] = [fact for fact in get_memory_data(user_id="alice")["facts"] if fact["id"] == fact_id]
    return dict(fact)


def test_a_manual_fact_stores_every_record_field_and_reads_them_back() -> None:
    _, created = create_memory_fact_with_created_fact(
        "Alice edits in vim", "preference", 0.95, user_id="alice", **RECORD
    )
    stored = _fact(created["id"])
    assert {key: stored[key] for key in STORED} == STORED
    [record] = list_facts(FactFilter(user_id="alice")).facts
    assert (record.memory_type, record.importance, record.tags, record.source_kind) == (
        "procedural",
        0.9,
        ("editor", "work"),
        "explicit_user_input",
    )
    assert (record.raw, record.structured, record.version) == (STORED["raw"], STORED["structured"], 1)
    assert record.decay is not None and record.score is not None


def test_a_manual_fact_without_record_fields_has_none_of_their_keys() -> None:
    _, created = create_memory_fact_with_created_fact("Alice drinks tea", "preference", user_id="alice")
    assert not set(RECORD_KEYS) & set(_fact(created["id"]))
    assert not set(RECORD_KEYS) & set(created)
    [record] = list_facts(FactFilter(user_id="alice")).facts
    # The documented defaults: the category's type, the middle importance, an inferred source.
    assert (record.memory_type, record.importance, record.tags, record.source_kind) == (
        "preference",
        0.5,
        (),
        "implicit_inference",
    )


def test_update_changes_record_fields_bumps_the_version_and_clears_at_the_default(provider: str) -> None:
    _, created = create_memory_fact_with_created_fact(
        "Alice edits in vim", "knowledge", user_id="alice", **RECORD
    )
    fact_id = created["id"]
    update_memory_fact(
        fact_id, user_id="alice", importance=0.2, tags=["home"], source_kind="corrected_memory"
    )
    stored = _fact(fact_id)
    assert (stored["importance"], stored["tags"], stored["sourceKind"]) == (0.2, ["home"], "corrected_memory")
    assert stored["raw"] == STORED["raw"]  # untouched
    update_memory_fact(
        fact_id, user_id="alice", importance=0.5, tags=[], raw="", structured={}, memory_type="semantic"
    )
    cleared = _fact(fact_id)
    assert set(RECORD_KEYS) & set(cleared) == {"sourceKind"}  # knowledge's type is semantic: no key
    [record] = list_facts(FactFilter(user_id="alice")).facts
    if provider == "file":
        assert record.version == 1  # files keep no versions
        return
    assert record.version == 3
    versions = [entry.version for entry in memory_history(FactFilter(user_id="alice"), fact_id=fact_id)]
    assert versions == [1, 2, 3]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"memory_type": "habit"}, "memory_type: must be one of"),
        ({"importance": -0.1}, "importance: must be between 0 and 1"),
        ({"tags": ["ok", "no,comma"]}, "tags: each tag must be"),
        ({"tags": [f"t{i}" for i in range(17)]}, "tags: at most 16 tags"),
        ({"source_kind": "rumour"}, "source_kind: must be one of"),
        ({"raw": "nul \x00"}, "raw: contains NUL"),
        ({"structured": ["not", "an", "object"]}, "structured: must be a JSON object"),
    ],
)
def test_bad_record_fields_are_refused_before_anything_is_stored(
    fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidFactError, match=message):
        create_memory_fact("Alice drinks tea", user_id="alice", **fields)
    assert get_memory_data(user_id="alice")["facts"] == []
    create_memory_fact("Alice drinks tea", user_id="alice")
    [fact_id] = [fact["id"] for fact in get_memory_data(user_id="alice")["facts"]]
    with pytest.raises(InvalidFactError, match=message):
        update_memory_fact(fact_id, user_id="alice", **fields)
    assert not set(RECORD_KEYS) & set(_fact(fact_id))


def _seed() -> dict[str, str]:
    ids = {}
    for name, content, fields in [
        ("vim", "Alice edits in vim", RECORD),
        ("tea", "Alice drinks green tea", {"tags": ["home"], "importance": 0.3}),
        ("trip", "Alice flew to Lisbon in May", {"memory_type": "episodic", "source_kind": "external_data"}),
        ("plain", "Alice likes green parks", {}),
    ]:
        _, created = create_memory_fact_with_created_fact(content, "knowledge", user_id="alice", **fields)
        ids[name] = created["id"]
    create_memory_fact("Bob edits in vim", user_id="bob", tags=["work"], importance=0.95)
    return ids


def test_list_and_search_filter_by_type_tag_importance_and_source_kind() -> None:
    ids = _seed()

    def listed(**fields: Any) -> set[str]:
        return {fact.fact_id for fact in list_facts(FactFilter(user_id="alice", **fields)).facts}

    assert listed(memory_type="procedural") == {ids["vim"]}
    assert listed(memory_type="semantic") == {ids["tea"], ids["plain"]}  # knowledge's default type
    assert listed(tag="work") == {ids["vim"]}
    assert listed(tag="home") == {ids["tea"]}
    assert listed(tag="none-such") == set()
    assert listed(min_importance=0.5) == {ids["vim"], ids["trip"], ids["plain"]}
    assert listed(min_importance=0.9) == {ids["vim"]}
    assert listed(source_kind="implicit_inference") == {ids["tea"], ids["plain"]}
    assert listed(source_kind="external_data", memory_type="episodic") == {ids["trip"]}
    everyone = list_facts(FactFilter(tag="work")).facts
    assert {(fact.user_id, fact.content) for fact in everyone} == {
        ("alice", "Alice edits in vim"),
        ("bob", "Bob edits in vim"),
    }
    found = search_facts("green", FactFilter(user_id="alice", tag="home"))
    assert [fact.fact_id for fact in found.facts] == [ids["tea"]]
    found = search_facts("vim", FactFilter(min_importance=0.95))
    assert [fact.user_id for fact in found.facts] == ["bob"]
    assert {fact.fact_id for fact in list_facts(FactFilter(fact_id=ids["tea"])).facts} == {ids["tea"]}
    ranked = list_facts(FactFilter(user_id="alice"), order="score").facts
    assert all(fact.decay is not None for fact in ranked)


def test_a_users_own_search_returns_the_record_keys() -> None:
    ids = _seed()
    [found] = search_memory_facts("vim", user_id="alice")
    assert found["id"] == ids["vim"] and {key: found[key] for key in STORED} == STORED


def test_relations_read_both_ways_inside_the_scope(provider: str) -> None:
    ids = _seed()
    memory = get_memory_data(user_id="alice")
    for fact in memory["facts"]:
        if fact["id"] == ids["tea"]:
            fact["relations"] = [
                {"type": "supersedes", "target": ids["plain"]},
                {"type": "related_to", "target": ids["vim"]},
            ]
        if fact["id"] == ids["trip"]:
            fact["relations"] = [{"type": "derived_from", "target": ids["tea"]}]
    assert get_memory_storage().save(memory, user_id="alice")
    tea = fact_relations(ids["tea"], user_id="alice")
    assert [(r.kind, r.fact_id, r.live) for r in tea.outgoing] == [
        ("related_to", ids["vim"], True),
        ("supersedes", ids["plain"], True),
    ]
    assert [(r.kind, r.fact_id) for r in tea.incoming] == [("derived_from", ids["trip"])]
    plain = fact_relations(ids["plain"], user_id="alice")
    assert (plain.outgoing, [(r.kind, r.fact_id) for r in plain.incoming]) == (
        [],
        [("supersedes", ids["tea"])],
    )
    # Another scope, or an unknown fact, has none.
    assert fact_relations(ids["tea"], user_id="bob").outgoing == []
    assert fact_relations(ids["tea"], "coder", user_id="alice").outgoing == []
    assert fact_relations("fact_unknown", user_id="alice").to_json()["incoming"] == []
    with pytest.raises(QueryError):
        fact_relations("", user_id="alice")
    if provider != "file":
        # The superseded fact goes; the relation to it stays, its end marked deleted.
        memory = get_memory_data(user_id="alice")
        memory["facts"] = [fact for fact in memory["facts"] if fact["id"] != ids["plain"]]
        assert get_memory_storage().save(memory, user_id="alice")
        [superseded] = [
            r for r in fact_relations(ids["tea"], user_id="alice").outgoing if r.kind == "supersedes"
        ]
        assert (superseded.fact_id, superseded.live) == (ids["plain"], False)


def test_other_owners_shared_facts_show_labels_but_not_words_or_relations(provider: str) -> None:
    _, shared = create_memory_fact_with_created_fact(
        "The team deploys on Fridays", user_id="bob", roles=["editor"], visibility="public", **RECORD
    )
    if provider == "file":  # one tenant, no sharing: another user finds nothing of bob's
        assert search_memory_facts("Fridays", user_id="alice") == []
        assert list_facts(FactFilter(user_id="alice", tag="work")).facts == []
        return
    _, other = create_memory_fact_with_created_fact("Bob's private note", user_id="bob")
    memory = get_memory_data(user_id="bob")
    for fact in memory["facts"]:
        if fact["id"] == shared["id"]:
            fact["relations"] = [{"type": "related_to", "target": other["id"]}]
    assert get_memory_storage().save(memory, user_id="bob")
    visible = get_memory_storage().visible_facts(user_id="alice")  # type: ignore[attr-defined]
    [seen] = [fact for fact in visible if fact["id"] == shared["id"]]
    # Sharing shares the summary and its labels, never the owner's own words or structured form.
    summary_keys = {key: value for key, value in STORED.items() if key not in ("raw", "structured")}
    assert {key: seen[key] for key in summary_keys} == summary_keys
    assert not {"relations", "raw", "structured"} & set(seen) and seen["visibility"] == "public"
    [found] = search_memory_facts("Fridays", user_id="alice")
    assert found["tags"] == ["editor", "work"] and not {"relations", "raw", "structured"} & set(found)
    for listing in (
        list_facts(FactFilter(user_id="alice", tag="work")).facts,
        search_facts("Fridays", FactFilter(user_id="alice")).facts,
    ):
        [record] = listing
        assert (record.user_id, record.raw, record.structured) == ("bob", None, None)
    [own] = list_facts(FactFilter(user_id="bob", tag="work")).facts
    assert (own.raw, own.structured) == (STORED["raw"], STORED["structured"])


def test_an_import_checks_the_record_keys_and_carries_them() -> None:
    good = {
        "facts": [
            {"id": "f1", "content": "Alice edits in vim", "category": "behavior", **STORED},
            {
                "id": "f2",
                "content": "Alice used emacs",
                "relations": [{"type": "supersedes", "target": "f1"}],
            },
        ]
    }
    stored = import_memory_data(good, user_id="alice")
    [first, second] = stored["facts"]
    assert {key: first[key] for key in STORED} == STORED
    assert second["relations"] == [{"type": "supersedes", "target": "f1"}]
    refusals: list[tuple[dict[str, Any], str]] = [
        ({"importance": "0.7"}, "fact 0: importance: must be a number"),
        ({"type": "habit"}, "fact 0: type: must be one of"),
        ({"tags": "work"}, "fact 0: tags: must be a list of text"),
        ({"sourceKind": 3}, "fact 0: sourceKind: must be one of"),
        ({"structured": {"deep": [[[[1]]]]}}, "fact 0: structured: nests deeper than 4 levels"),
        ({"relations": [{"type": "likes", "target": "f2"}]}, "fact 0: relations: type must be one of"),
        ({"relations": [{"type": "related_to"}]}, "fact 0: relations: each relation must be"),
    ]
    for bad, message in refusals:
        document = {"facts": [{"id": "b1", "content": "bad", **bad}]}
        with pytest.raises(InvalidDocumentError, match=message):
            import_memory_data(document, user_id="bob")
    assert get_memory_data(user_id="bob")["facts"] == []
