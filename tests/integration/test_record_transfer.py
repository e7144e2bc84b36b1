"""Export and import carry the memory-record keys (issue 32), on every provider, and a DeerFlow
document that sets none exports byte for byte as it did before them."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from memstore.ops.transfer import export_scopes, import_entries, read_document
from memstore.record import RECORD_KEYS
from memstore.storage.base import MemoryStorage
from memstore.storage.file.layout import discover_tree, scope_path

RECORD_FACT = {
    "id": "fact_0000000b",
    "content": "Alice edits in vim",
    "category": "preference",
    "confidence": 0.9,
    "createdAt": "2026-07-01T10:00:00Z",
    "source": "thread-1",
    "type": "procedural",
    "importance": 0.8,
    "tags": ["editor", "work"],
    "sourceKind": "explicit_user_input",
    "raw": "I always use vim",
    "structured": {"editor": "vim"},
    "relations": [{"type": "supersedes", "target": "fact_0000000a"}],
}


def _deerflow_document() -> dict[str, Any]:
    """A document as DeerFlow writes it: no record keys."""
    return {
        "version": "1.0",
        "lastUpdated": "2026-07-01T10:00:00Z",
        "user": {
            "workContext": {"summary": "Alice is an SRE", "updatedAt": "2026-07-01T10:00:00Z"},
            "personalContext": {"summary": "", "updatedAt": ""},
            "topOfMind": {"summary": "", "updatedAt": ""},
        },
        "history": {
            "recentMonths": {"summary": "", "updatedAt": ""},
            "earlierContext": {"summary": "", "updatedAt": ""},
            "longTermBackground": {"summary": "", "updatedAt": ""},
        },
        "facts": [
            {
                "id": "fact_0000000a",
                "content": "Alice used emacs",
                "category": "behavior",
                "confidence": 0.7,
                "createdAt": "2026-06-01T10:00:00Z",
                "source": "thread-0",
            }
        ],
    }


def _write(root: Path, user_id: str, document: dict[str, Any]) -> None:
    path = scope_path(root, user_id, None)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, ensure_ascii=False), encoding="utf-8")


def _import(storage: MemoryStorage, root: Path) -> None:
    entries, _ = discover_tree(root)
    report = import_entries(storage, entries)
    assert not report.invalid, report.invalid


def test_a_fact_without_record_keys_exports_byte_for_byte_as_before(
    tmp_path: Path, storage: MemoryStorage
) -> None:
    plain = _deerflow_document()
    mixed = _deerflow_document()
    mixed["facts"].append(copy.deepcopy(RECORD_FACT))
    without = _deerflow_document()
    without["facts"].append({key: value for key, value in RECORD_FACT.items() if key not in RECORD_KEYS})
    source = tmp_path / "in"
    for user_id, document in (("plain", plain), ("mixed", mixed), ("without", without)):
        _write(source, user_id, document)
    _import(storage, source)
    out = tmp_path / "out"
    export_scopes(storage, [("plain", None), ("mixed", None), ("without", None)], out)

    exported = {user: scope_path(out, user, None).read_bytes() for user in ("plain", "mixed", "without")}
    # The DeerFlow document comes back as DeerFlow wrote it, only its save time new.
    stamp = json.loads(exported["plain"])["lastUpdated"]
    expected = json.dumps({**plain, "lastUpdated": stamp}, ensure_ascii=False, indent=2) + "\n"
    assert exported["plain"] == expected.encode("utf-8")
    # Beside a fact that has record keys, the same fact exports the same bytes; and the record
    # fact without its keys is exactly the export made without them.
    mixed_document = json.loads(exported["mixed"])
    assert mixed_document["facts"][1] == RECORD_FACT
    blocks = [json.dumps(fact, ensure_ascii=False, indent=2) for fact in mixed_document["facts"]]
    assert blocks[0] == json.dumps(json.loads(exported["plain"])["facts"][0], ensure_ascii=False, indent=2)
    stripped = {**mixed_document, "lastUpdated": json.loads(exported["without"])["lastUpdated"]}
    stripped["facts"][1] = {key: value for key, value in RECORD_FACT.items() if key not in RECORD_KEYS}
    assert (json.dumps(stripped, ensure_ascii=False, indent=2) + "\n").encode("utf-8") == exported["without"]


def test_export_then_import_carries_every_record_key_and_is_idempotent(
    tmp_path: Path, storage: MemoryStorage
) -> None:
    document = _deerflow_document()
    document["facts"].append(copy.deepcopy(RECORD_FACT))
    _write(tmp_path / "in", "alice", document)
    _import(storage, tmp_path / "in")
    out = tmp_path / "out"
    [path] = export_scopes(storage, [("alice", None)], out)
    exported = read_document(path)
    assert exported["facts"][1] == RECORD_FACT

    # The exported tree imported as another user: the same record keys, relations included.
    carol = tmp_path / "carol"
    _write(carol, "carol", exported)
    _import(storage, carol)
    assert storage.load(user_id="carol")["facts"] == exported["facts"]
    entries, _ = discover_tree(carol)
    again = import_entries(storage, entries)
    assert [entry.user_id for entry in again.unchanged] == ["carol"] and not again.imported


def test_an_import_tree_with_a_bad_record_key_reports_that_file(
    tmp_path: Path, storage: MemoryStorage
) -> None:
    bad = _deerflow_document()
    bad["facts"][0]["importance"] = 7
    _write(tmp_path / "in", "bob", bad)
    _write(tmp_path / "in", "alice", _deerflow_document())
    entries, _ = discover_tree(tmp_path / "in")
    report = import_entries(storage, entries)
    assert [entry.user_id for entry in report.imported] == ["alice"]
    [(path, reason)] = report.invalid
    assert path.parent.name == "bob" and reason == "fact 0: importance: must be between 0 and 1"


def test_a_re_import_of_unsorted_tags_is_unchanged(tmp_path: Path, storage: MemoryStorage) -> None:
    """The SQL provider keeps tags and relations as sorted sets: the same file again changes nothing."""
    document = _deerflow_document()
    fact = copy.deepcopy(RECORD_FACT)
    fact["tags"] = ["work", "editor"]
    document["facts"].append(fact)
    _write(tmp_path / "in", "alice", document)
    _import(storage, tmp_path / "in")
    entries, _ = discover_tree(tmp_path / "in")
    again = import_entries(storage, entries)
    assert [entry.user_id for entry in again.unchanged] == ["alice"] and not again.imported
