"""Importing and exporting DeerFlow-style memory trees through every storage provider."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from memstore.document import create_empty_memory
from memstore.ops.transfer import export_scopes, import_entries, same_memory
from memstore.storage.base import MemoryStorage
from memstore.storage.file.layout import discover_tree, scope_path


def _write(path: Path, document: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, ensure_ascii=False), encoding="utf-8")


def _document(*contents: str, work: str = "") -> dict[str, Any]:
    document = create_empty_memory()
    document["user"]["workContext"] = {"summary": work, "updatedAt": "2026-07-01T10:00:00Z" if work else ""}
    document["facts"] = [
        {
            "id": f"fact_{index:08x}",
            "content": content,
            "category": "preference",
            "confidence": 0.9,
            "createdAt": "2026-07-01T10:00:00Z",
            "source": "thread-1",
            "customKey": {"kept": True},
        }
        for index, content in enumerate(contents)
    ]
    return document


def _tree(root: Path) -> None:
    _write(root / "memory.json", _document("legacy global fact"))
    _write(root / "agents" / "coder" / "memory.json", _document("legacy agent fact"))
    _write(root / "users" / "alice" / "memory.json", _document("Alice likes tea", work="Acme"))
    _write(root / "users" / "alice" / "agents" / "coder" / "memory.json", _document("Alice codes in Go"))
    _write(root / "users" / "wei" / "memory.json", _document("喜欢简洁的回答"))
    _write(root / "users" / "bad" / "memory.json", {"facts": "not a list"})
    _write(root / "users" / "bad.id" / "memory.json", _document("invalid user id"))
    _write(root / "users" / "carol" / "notes" / "memory.json", _document("wrong folder"))


def test_import_is_idempotent_and_reports_invalid_items(tmp_path: Path, storage: MemoryStorage) -> None:
    root = tmp_path / "tree"
    _tree(root)
    entries, misplaced = discover_tree(root)
    assert {(e.user_id, e.agent_name) for e in entries} == {
        (None, None),
        (None, "coder"),
        ("alice", None),
        ("alice", "coder"),
        ("wei", None),
        ("bad", None),
    }
    assert sorted(p.parent.name for p, _ in misplaced) == ["bad.id", "notes"]

    first = import_entries(storage, entries)
    assert len(first.imported) == 5
    assert [(p.parent.name, reason) for p, reason in first.invalid] == [
        ("bad", "'facts' must be a list of objects")
    ]
    assert [f["content"] for f in storage.load("coder", user_id="alice")["facts"]] == ["Alice codes in Go"]
    assert storage.load(user_id="alice")["facts"][0]["customKey"] == {"kept": True}

    second = import_entries(storage, entries)
    assert second.imported == []
    assert len(second.unchanged) == 5


def test_dry_run_writes_nothing(tmp_path: Path, storage: MemoryStorage) -> None:
    root = tmp_path / "tree"
    _tree(root)
    entries, _ = discover_tree(root)
    report = import_entries(storage, entries, dry_run=True)
    assert len(report.imported) == 5
    assert storage.load(user_id="alice")["facts"] == []


def test_export_then_import_is_a_no_op(tmp_path: Path, storage: MemoryStorage) -> None:
    root = tmp_path / "tree"
    _tree(root)
    entries, _ = discover_tree(root)
    import_entries(storage, entries)
    scopes = [(e.user_id, e.agent_name) for e in entries if e.user_id != "bad"]
    exported = export_scopes(storage, scopes, tmp_path / "export")
    assert scope_path(tmp_path / "export", None, None) in exported
    for entry in entries:
        if entry.user_id == "bad":
            continue
        original = json.loads(entry.path.read_text(encoding="utf-8"))
        copy = json.loads(scope_path(tmp_path / "export", entry.user_id, entry.agent_name).read_text("utf-8"))
        assert "revision" not in copy
        assert same_memory(original, copy)
    again, _ = discover_tree(tmp_path / "export")
    report = import_entries(storage, again)
    assert report.imported == [] and len(report.unchanged) == 5


def test_reimporting_facts_without_ids_writes_nothing(tmp_path: Path, storage: MemoryStorage) -> None:
    # Issue 14.1: every run used to give id-less facts fresh ids, tombstone the last run's rows and
    # bump the revision. At scale: 20 users with 90 id-less facts each (under the max_facts cap).
    users = [f"user{index:02d}" for index in range(20)]
    for user in users:
        document = create_empty_memory()
        document["facts"] = [
            {"content": f"{user} fact number {index}", "category": "context", "confidence": 0.8}
            for index in range(90)
        ]
        document["facts"].append({"id": "fact_keep0001", "content": f"{user} has an id", "confidence": 0.9})
        _write(tmp_path / "tree" / "users" / user / "memory.json", document)
    entries, _ = discover_tree(tmp_path / "tree")

    first = import_entries(storage, entries)
    assert len(first.imported) == len(users)
    stored = {user: storage.reload(user_id=user) for user in users}
    # SQL gives id-less facts ids; the file provider keeps the document as given (no ids).
    ids = {user: [fact.get("id") for fact in doc["facts"]] for user, doc in stored.items()}
    assert all(len(found) == 91 and "fact_keep0001" in found for found in ids.values())

    for _ in range(2):
        again = import_entries(storage, entries)
        assert (again.imported, len(again.unchanged)) == ([], len(users))
    for user in users:
        after = storage.reload(user_id=user)
        assert [fact.get("id") for fact in after["facts"]] == ids[user]
        assert (after.get("revision"), after["lastUpdated"]) == (
            stored[user].get("revision"),
            stored[user]["lastUpdated"],
        )

    # A changed document is still imported, and its id-less facts keep their ids where the content matches.
    path = tmp_path / "tree" / "users" / "user00" / "memory.json"
    changed_document = json.loads(path.read_text(encoding="utf-8"))
    changed_document["facts"][0]["confidence"] = 0.95
    _write(path, changed_document)
    changed = import_entries(storage, entries)
    assert len(changed.imported) == 1
    assert [fact.get("id") for fact in storage.reload(user_id="user00")["facts"]] == ids["user00"]
