"""Fact CRUD, import/clear and search helpers on the real file and SQLite providers."""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any, ClassVar

import pytest

from memstore.config import FILE_STORAGE_CLASS, SQL_STORAGE_CLASS, MemoryConfig, set_memory_config
from memstore.document import (
    MAX_CATEGORY_CHARS,
    MAX_DOCUMENT_DEPTH,
    MAX_DOCUMENT_FACTS,
    MAX_FACT_CHARS,
    MAX_SUMMARY_CHARS,
    MemoryDocument,
    create_empty_memory,
)
from memstore.errors import DuplicateFactError, InvalidDocumentError, InvalidFactError, QueryError
from memstore.ops.facts import (
    clear_memory_data,
    create_memory_fact,
    create_memory_fact_with_created_fact,
    delete_memory_fact,
    get_memory_data,
    import_memory_data,
    reload_memory_data,
    search_memory_facts,
    update_memory_fact,
)
from memstore.storage.file import FileMemoryStorage
from memstore.storage.loader import get_memory_storage, reset_memory_storage


class ReadOnlyFileStorage(FileMemoryStorage):
    """A file provider whose saves can be switched off, like a disk that has gone read-only."""

    refuse_saves: ClassVar[bool] = False

    def save(
        self,
        memory: MemoryDocument,
        agent_name: str | None = None,
        *,
        user_id: str | None = None,
        origin: str | None = None,
        captured_at: datetime | None = None,
        removals: Mapping[str, Mapping[str, Any]] | None = None,
        confirmed: Collection[str] = (),
        folded: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    ) -> bool:
        if type(self).refuse_saves:
            return False
        return super().save(memory, agent_name, user_id=user_id)


# Tests that store documents only the file provider accepts (non-string content, top-level
# keys of other tools) run on it alone; the SQL provider refuses such saves outright.
file_only = pytest.mark.parametrize("provider", ["file"], indirect=True)


@pytest.fixture(autouse=True, params=["file", "sqlite"])
def provider(request: pytest.FixtureRequest, isolated_config: MemoryConfig) -> str:
    storage_class = FILE_STORAGE_CLASS if request.param == "file" else SQL_STORAGE_CLASS
    set_memory_config(isolated_config.model_copy(update={"storage_class": storage_class}))
    reset_memory_storage()
    return str(request.param)


def _fresh_read(agent_name: str | None = None, *, user_id: str | None = None) -> MemoryDocument:
    """Read through a brand-new provider instance, so nothing comes from an in-process cache."""
    reset_memory_storage()
    return get_memory_data(agent_name, user_id=user_id)


def _contents(memory: MemoryDocument) -> list[str]:
    return [fact["content"] for fact in memory["facts"]]


def test_create_stores_a_manual_fact() -> None:
    memory, created = create_memory_fact_with_created_fact(
        "  Prefers dark mode  ", "preference", 0.9, user_id="alice"
    )

    assert re.fullmatch(r"fact_[0-9a-f]{8}", created["id"])
    assert created["content"] == "Prefers dark mode"
    assert (created["category"], created["confidence"], created["source"]) == ("preference", 0.9, "manual")
    assert created["createdAt"].endswith("Z")
    assert memory["facts"] == [created]
    assert _fresh_read(user_id="alice")["facts"] == [created]


def test_create_defaults_and_blank_category() -> None:
    memory = create_memory_fact("Works on memstore", category="   ", user_id="alice")

    [fact] = memory["facts"]
    assert (fact["category"], fact["confidence"]) == ("context", 0.7)  # the one manual default


@pytest.mark.parametrize("content", ["", "   ", None, 42])
def test_create_rejects_blank_content_before_touching_storage(content: Any) -> None:
    with pytest.raises(ValueError) as excinfo:
        create_memory_fact(content, user_id="alice")

    assert excinfo.value.args == ("content",)
    assert not FileMemoryStorage().path_for(user_id="alice").exists()


@pytest.mark.parametrize("confidence", [math.nan, math.inf, -math.inf, -0.01, 1.01, True, "0.5", None])
def test_create_rejects_invalid_confidence(confidence: Any) -> None:
    with pytest.raises(ValueError) as excinfo:
        create_memory_fact("Valid content", confidence=confidence, user_id="alice")

    assert excinfo.value.args == ("confidence",)
    assert not FileMemoryStorage().path_for(user_id="alice").exists()


@pytest.mark.parametrize("confidence", [0, 1, 0.0, 1.0])
def test_create_accepts_boundary_confidence(confidence: float) -> None:
    [fact] = create_memory_fact("Edge", confidence=confidence, user_id="alice")["facts"]
    assert fact["confidence"] == float(confidence)


def test_create_refuses_a_duplicate_content_key() -> None:
    original = create_memory_fact("Uses PostgreSQL", user_id="alice")

    with pytest.raises(DuplicateFactError, match="Duplicate fact") as excinfo:
        create_memory_fact("  uses postgresql ", confidence=0.9, user_id="alice")

    assert isinstance(excinfo.value, ValueError)
    assert excinfo.value.existing_id == original["facts"][0]["id"]
    assert _contents(_fresh_read(user_id="alice")) == ["Uses PostgreSQL"]


def test_same_content_is_allowed_in_another_scope() -> None:
    create_memory_fact("Uses PostgreSQL", user_id="alice")
    create_memory_fact("Uses PostgreSQL", user_id="bob")
    create_memory_fact("Uses PostgreSQL", agent_name="coder", user_id="alice")

    for agent, user in ((None, "alice"), (None, "bob"), ("coder", "alice")):
        assert _contents(get_memory_data(agent, user_id=user)) == ["Uses PostgreSQL"]


@pytest.mark.parametrize("policy", ["confidence", "hybrid"])
def test_create_trims_to_max_facts_by_confidence(isolated_config: MemoryConfig, policy: str) -> None:
    """Facts created together differ only in confidence, so both policies evict the least confident."""
    set_memory_config(isolated_config.model_copy(update={"max_facts": 10, "eviction_policy": policy}))
    for index in range(10):
        create_memory_fact(f"fact {index}", confidence=0.5 + index / 100, user_id="alice")

    memory, created = create_memory_fact_with_created_fact("low", confidence=0.1, user_id="alice")
    assert len(memory["facts"]) == 10
    assert created["id"] not in {fact["id"] for fact in memory["facts"]}

    memory, created = create_memory_fact_with_created_fact("high", confidence=0.95, user_id="alice")
    stored = _fresh_read(user_id="alice")["facts"]
    assert len(stored) == 10
    # The reference's trim re-sorts by confidence; the hybrid policy keeps the document order.
    assert stored[0 if policy == "confidence" else -1]["id"] == created["id"]
    assert "fact 0" not in [fact["content"] for fact in stored]


def test_update_changes_only_given_fields() -> None:
    imported = create_empty_memory()
    imported["facts"] = [
        {
            "id": "fact_0000aaaa",
            "content": "Uses tabs",
            "category": "correction",
            "confidence": 0.8,
            "createdAt": "2026-01-01T00:00:00Z",
            "source": "thread-1",
            "sourceError": "Said spaces",
            "customKey": {"kept": True},
        }
    ]
    import_memory_data(imported, user_id="alice")

    update_memory_fact("fact_0000aaaa", confidence=0.95, user_id="alice")
    memory = update_memory_fact("fact_0000aaaa", content="  Uses two-space tabs ", user_id="alice")

    expected = dict(imported["facts"][0], content="Uses two-space tabs", confidence=0.95)
    assert memory["facts"] == [expected]
    assert _fresh_read(user_id="alice")["facts"] == [expected]

    memory = update_memory_fact("fact_0000aaaa", category="  ", user_id="alice")
    assert memory["facts"][0]["category"] == "context"


def test_update_errors() -> None:
    [first] = create_memory_fact("First", user_id="alice")["facts"]
    create_memory_fact("Second", user_id="alice")

    with pytest.raises(KeyError) as missing:
        update_memory_fact("fact_missing", content="x", user_id="alice")
    assert missing.value.args == ("fact_missing",)
    with pytest.raises(ValueError) as blank:
        update_memory_fact(first["id"], content="  ", user_id="alice")
    assert blank.value.args == ("content",)
    with pytest.raises(ValueError) as bad:
        update_memory_fact(first["id"], confidence=math.nan, user_id="alice")
    assert bad.value.args == ("confidence",)
    with pytest.raises(DuplicateFactError, match="Duplicate fact"):
        update_memory_fact(first["id"], content="SECOND", user_id="alice")

    # Re-casing a fact's own content is not a duplicate of itself.
    memory = update_memory_fact(first["id"], content="FIRST", user_id="alice")
    assert _contents(memory) == ["FIRST", "Second"]


def test_delete_fact() -> None:
    [first] = create_memory_fact("First", user_id="alice")["facts"]
    create_memory_fact("Second", user_id="alice")

    memory = delete_memory_fact(first["id"], user_id="alice")

    assert _contents(memory) == ["Second"]
    assert _contents(_fresh_read(user_id="alice")) == ["Second"]
    with pytest.raises(KeyError) as excinfo:
        delete_memory_fact(first["id"], user_id="alice")
    assert excinfo.value.args == (first["id"],)


def test_every_entry_point_stays_in_its_scope() -> None:
    scopes: list[tuple[str | None, str | None]] = [
        (None, None),
        (None, "alice"),
        ("coder", "alice"),
        (None, "bob"),
        ("coder", None),
    ]
    ids = {}
    for agent, user in scopes:
        _, created = create_memory_fact_with_created_fact(
            f"scope {agent}/{user}", "goal", 0.8, agent, user_id=user
        )
        ids[(agent, user)] = created["id"]

    for agent, user in scopes:
        assert _contents(get_memory_data(agent, user_id=user)) == [f"scope {agent}/{user}"]
        assert [f["id"] for f in search_memory_facts("scope", agent_name=agent, user_id=user)] == [
            ids[(agent, user)]
        ]

    alice_id = ids[(None, "alice")]
    with pytest.raises(KeyError):
        update_memory_fact(alice_id, content="hijack", user_id="bob")
    with pytest.raises(KeyError):
        delete_memory_fact(alice_id, "coder", user_id="alice")

    update_memory_fact(ids[("coder", "alice")], content="agent edit", agent_name="coder", user_id="alice")
    delete_memory_fact(ids[(None, "bob")], user_id="bob")
    clear_memory_data(None, user_id=None)

    assert _contents(_fresh_read(user_id="alice")) == ["scope None/alice"]
    assert _contents(_fresh_read("coder", user_id="alice")) == ["agent edit"]
    assert _contents(_fresh_read(user_id="bob")) == []
    assert _contents(_fresh_read()) == []
    assert _contents(_fresh_read("coder")) == ["scope coder/None"]


@file_only
def test_edits_keep_provider_top_level_keys() -> None:
    imported = create_empty_memory()
    imported["revision"] = 7
    imported["x-tool"] = {"note": "kept"}
    import_memory_data(imported, user_id="alice")

    [fact] = create_memory_fact("Kept keys", user_id="alice")["facts"]
    update_memory_fact(fact["id"], confidence=0.6, user_id="alice")
    memory = delete_memory_fact(fact["id"], user_id="alice")

    assert (memory["revision"], memory["x-tool"]) == (7, {"note": "kept"})
    stored = _fresh_read(user_id="alice")
    assert (stored["revision"], stored["x-tool"]) == (7, {"note": "kept"})


def test_import_returns_the_stored_document_and_clear_replaces_it() -> None:
    imported = create_empty_memory()
    imported["lastUpdated"] = "2000-01-01T00:00:00Z"
    imported["user"]["workContext"] = {"summary": "Builds memstore", "updatedAt": "2026-01-01T00:00:00Z"}
    imported["facts"] = [{"id": "fact_1234abcd", "content": "Likes tea", "category": "preference"}]

    result = import_memory_data(imported, "coder", user_id="alice")

    assert result["lastUpdated"] != "2000-01-01T00:00:00Z"
    assert result["facts"] == imported["facts"]
    assert reload_memory_data("coder", user_id="alice")["user"]["workContext"]["summary"] == "Builds memstore"

    cleared = clear_memory_data("coder", user_id="alice")

    assert cleared["facts"] == [] and "revision" not in cleared
    stored = _fresh_read("coder", user_id="alice")
    assert stored["facts"] == [] and stored["user"]["workContext"]["summary"] == ""


def test_import_rejects_a_non_document() -> None:
    with pytest.raises(TypeError):
        import_memory_data([], user_id="alice")  # type: ignore[arg-type]


@pytest.fixture
def read_only_storage(isolated_config: MemoryConfig) -> ReadOnlyFileStorage:
    set_memory_config(isolated_config.model_copy(update={"storage_class": f"{__name__}.ReadOnlyFileStorage"}))
    reset_memory_storage()
    ReadOnlyFileStorage.refuse_saves = False
    storage = get_memory_storage()
    assert isinstance(storage, ReadOnlyFileStorage)
    return storage


@file_only
def test_save_failure_raises_oserror_and_keeps_memory(read_only_storage: ReadOnlyFileStorage) -> None:
    [kept] = create_memory_fact("Kept fact", confidence=0.9, user_id="alice")["facts"]
    before = reload_memory_data(user_id="alice")
    ReadOnlyFileStorage.refuse_saves = True
    try:
        with pytest.raises(OSError):
            create_memory_fact("New fact", user_id="alice")
        with pytest.raises(OSError):
            update_memory_fact(kept["id"], content="Changed", user_id="alice")
        with pytest.raises(OSError):
            delete_memory_fact(kept["id"], user_id="alice")
        with pytest.raises(OSError):
            clear_memory_data(user_id="alice")
        with pytest.raises(OSError):
            import_memory_data(create_empty_memory(), user_id="alice")
    finally:
        ReadOnlyFileStorage.refuse_saves = False

    assert get_memory_data(user_id="alice") == before
    assert reload_memory_data(user_id="alice") == before
    assert _contents(before) == ["Kept fact"]


@pytest.fixture
def searchable() -> None:
    memory = create_empty_memory()
    memory["facts"] = [
        {"id": "fact_00000001", "content": "Writes Python daily", "category": "knowledge", "confidence": 0.6},
        {
            "id": "fact_00000002",
            "content": "Prefers PYTHON 3.12",
            "category": "preference",
            "confidence": 0.9,
        },
        {
            "id": "fact_00000003",
            "content": "python packaging pain",
            "category": "context",
            "confidence": None,
        },
        {"id": "fact_00000004", "content": "Likes dark mode", "category": "preference", "confidence": 0.99},
        {"id": "fact_00000005", "content": 12345, "category": "context", "confidence": 1.0},
        {"id": "fact_00000006", "content": "Lives near the Straße", "category": "context", "confidence": 0.7},
    ]
    import_memory_data(memory, user_id="alice")


@file_only
@pytest.mark.usefixtures("searchable")
def test_search_is_case_insensitive_and_sorted_by_confidence() -> None:
    results = search_memory_facts("  Python ", user_id="alice")
    # The unreadable confidence ranks as 0.5, below 0.6.
    assert [fact["id"] for fact in results] == ["fact_00000002", "fact_00000001", "fact_00000003"]
    assert [f["id"] for f in search_memory_facts("STRASSE", user_id="alice")] == ["fact_00000006"]


@file_only
@pytest.mark.usefixtures("searchable")
def test_search_filters() -> None:
    assert [f["id"] for f in search_memory_facts("e", category="preference", user_id="alice")] == [
        "fact_00000004",
        "fact_00000002",
    ]
    assert search_memory_facts("python", category="goal", user_id="alice") == []
    assert search_memory_facts("python", category="", user_id="alice") == []
    assert len(search_memory_facts("python", limit=2, user_id="alice")) == 2
    assert search_memory_facts("python", limit=0, user_id="alice") == []
    assert search_memory_facts("python", limit=-1, user_id="alice") == []
    assert search_memory_facts("   ", user_id="alice") == []
    assert search_memory_facts("nothing like this", user_id="alice") == []
    assert search_memory_facts("python", user_id="bob") == []


@file_only
@pytest.mark.usefixtures("searchable")
def test_search_returns_copies() -> None:
    [first] = search_memory_facts("dark", user_id="alice")
    first["content"] = "tampered"

    assert search_memory_facts("dark", user_id="alice")[0]["content"] == "Likes dark mode"


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("content", "x" * (MAX_FACT_CHARS + 1), "content: 2,001 characters, the limit is 2,000"),
        ("content", "a\x00b", "content: contains NUL (U+0000), which cannot be stored"),
        (
            "content",
            "a\ud800b",
            "content: contains a lone surrogate (U+D800 to U+DFFF), which is not valid Unicode",
        ),
        ("category", "c" * (MAX_CATEGORY_CHARS + 1), "category: 65 characters, the limit is 64"),
        ("category", "pref\x00", "category: contains NUL (U+0000), which cannot be stored"),
    ],
)
def test_helpers_refuse_oversized_or_unstorable_text(field: str, value: str, reason: str) -> None:
    [kept] = create_memory_fact("Kept fact", user_id="alice")["facts"]
    with pytest.raises(InvalidFactError) as created:
        create_memory_fact(**{"content": "New fact", field: value}, user_id="alice")  # type: ignore[arg-type]
    with pytest.raises(InvalidFactError) as updated:
        update_memory_fact(kept["id"], **{field: value}, user_id="alice")  # type: ignore[arg-type]

    # args stay the reference's (field,); the message says which rule, never quoting the value.
    assert created.value.args == updated.value.args == (field,)
    assert str(created.value) == created.value.message == str(updated.value) == reason
    assert _fresh_read(user_id="alice")["facts"] == [kept]


def test_content_at_the_cap_is_stored() -> None:
    [fact] = create_memory_fact(" " + "x" * MAX_FACT_CHARS + " ", user_id="alice")["facts"]
    assert fact["content"] == "x" * MAX_FACT_CHARS


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"facts": [{"id": "f1", "content": "x" * (MAX_FACT_CHARS + 1)}]}, "fact 0: content is 2001"),
        ({"facts": [{"id": f"f{n}", "content": "x"} for n in range(MAX_DOCUMENT_FACTS + 1)]}, "5001 facts"),
        ({"user": {"topOfMind": {"summary": "s" * (MAX_SUMMARY_CHARS + 1)}}}, "topOfMind: summary"),
        ({"facts": [{"id": "f1", "content": "x", "category": "c" * 65}]}, "category is 65"),
        ({"facts": [{"id": "f1", "content": "nul\x00"}]}, "NUL"),
        ({"x-tool": {"note": "\udc80"}}, "lone surrogate"),
        ({"facts": [{"id": "f1", "content": "x", "confidence": math.nan}]}, "nan"),
    ],
)
def test_import_refuses_documents_over_the_caps(change: dict[str, Any], reason: str) -> None:
    create_memory_fact("Kept fact", user_id="alice")
    with pytest.raises(InvalidDocumentError, match=reason):
        import_memory_data({**create_empty_memory(), **change}, user_id="alice")
    assert _contents(_fresh_read(user_id="alice")) == ["Kept fact"]


def test_import_refuses_nesting_deeper_than_the_cap() -> None:
    deep: object = "bottom"
    for _ in range(100_000):
        deep = {"d": deep}
    document = create_empty_memory()
    document["facts"] = [{"id": "fact_00000001", "content": "deep", "nested": deep}]
    with pytest.raises(InvalidDocumentError, match=f"nested deeper than {MAX_DOCUMENT_DEPTH}"):
        import_memory_data(document, user_id="alice")
    assert _fresh_read(user_id="alice")["facts"] == []


@pytest.mark.parametrize(
    ("query", "category", "reason"),
    [
        ("a\x00b", None, "query: contains NUL"),
        ("x" * (MAX_FACT_CHARS + 1), None, "query: 2,001 characters, the limit is 2,000"),
        ("tea", "pref\x00", "category: contains NUL"),
        ("tea\udfff", None, "lone surrogate"),
    ],
)
def test_search_refuses_unstorable_or_oversized_text(query: str, category: str | None, reason: str) -> None:
    create_memory_fact("Likes tea", user_id="alice")
    with pytest.raises(QueryError, match=reason):
        search_memory_facts(query, category, user_id="alice")
