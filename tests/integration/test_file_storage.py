"""Guarantees specific to the file provider: layout, atomic writes, corrupt files."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from memstore.config import MemoryConfig, set_memory_config
from memstore.document import create_empty_memory
from memstore.storage.file import FileMemoryStorage


def _doc_with(content: str) -> dict[str, object]:
    doc = create_empty_memory()
    doc["facts"] = [{"id": "fact_00000001", "content": content, "category": "context", "confidence": 0.9}]
    return doc


def test_layout_matches_the_reference(tmp_path: Path) -> None:
    storage = FileMemoryStorage(tmp_path)
    assert storage.path_for() == tmp_path / "memory.json"
    assert storage.path_for("Coder") == tmp_path / "agents" / "coder" / "memory.json"
    assert storage.path_for(user_id="alice") == tmp_path / "users" / "alice" / "memory.json"
    assert storage.path_for("coder", user_id="alice") == tmp_path / "users/alice/agents/coder/memory.json"


def test_defaults_to_data_dir_and_honours_storage_path(tmp_path: Path) -> None:
    set_memory_config(MemoryConfig(data_dir=str(tmp_path / "d"), storage_path="legacy/global.json"))
    storage = FileMemoryStorage()
    assert storage.path_for(user_id="alice") == tmp_path / "d" / "users" / "alice" / "memory.json"
    assert storage.path_for() == tmp_path / "d" / "legacy" / "global.json"


def test_save_leaves_no_temp_files(tmp_path: Path) -> None:
    storage = FileMemoryStorage(tmp_path)
    for index in range(5):
        assert storage.save(_doc_with(f"v{index}"), user_id="alice")
    assert sorted(p.name for p in (tmp_path / "users" / "alice").iterdir()) == ["memory.json"]


def test_corrupt_file_reads_empty_and_is_kept_until_next_save(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    storage = FileMemoryStorage(tmp_path)
    path = storage.path_for(user_id="alice")
    path.parent.mkdir(parents=True)
    path.write_text('{"facts": [', encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        assert storage.load(user_id="alice")["facts"] == []
    assert "unreadable" in caplog.text
    assert path.read_text(encoding="utf-8") == '{"facts": ['
    assert storage.save(_doc_with("fresh"), user_id="alice")
    assert json.loads(path.read_text(encoding="utf-8"))["facts"][0]["content"] == "fresh"


def test_non_object_json_reads_empty(tmp_path: Path) -> None:
    storage = FileMemoryStorage(tmp_path)
    path = storage.path_for(user_id="alice")
    path.parent.mkdir(parents=True)
    path.write_text("[1, 2, 3]", encoding="utf-8")
    assert storage.load(user_id="alice")["facts"] == []
    assert path.read_text(encoding="utf-8") == "[1, 2, 3]"


def test_unwritable_directory_fails_cleanly(tmp_path: Path) -> None:
    storage = FileMemoryStorage(tmp_path)
    assert storage.save(_doc_with("kept"), user_id="alice")
    blocker = tmp_path / "users" / "bob"
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("not a directory", encoding="utf-8")
    assert storage.save(_doc_with("lost"), user_id="bob") is False
    assert storage.load(user_id="alice")["facts"][0]["content"] == "kept"


def test_external_edit_is_seen_without_reload(tmp_path: Path) -> None:
    storage = FileMemoryStorage(tmp_path)
    assert storage.save(_doc_with("before"), user_id="alice")
    assert storage.load(user_id="alice")["facts"][0]["content"] == "before"
    path = storage.path_for(user_id="alice")
    path.write_text(json.dumps(_doc_with("after")), encoding="utf-8")
    assert storage.load(user_id="alice")["facts"][0]["content"] == "after"
