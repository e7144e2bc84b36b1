"""``memstore import`` through the real console entry point."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from memstore.config import FILE_STORAGE_CLASS, SQL_STORAGE_CLASS
from memstore.document import (
    MAX_DOCUMENT_BYTES,
    MAX_DOCUMENT_DEPTH,
    MAX_DOCUMENT_FACTS,
    MAX_FACT_CHARS,
    create_empty_memory,
)


def _run(
    args: list[str], data_dir: Path, storage: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    executable = shutil.which("memstore", path=str(Path(sys.executable).parent))
    assert executable is not None
    env = {
        **os.environ,
        "MEMSTORE_DATA_DIR": str(data_dir),
        **(storage or {"MEMSTORE_STORAGE_CLASS": FILE_STORAGE_CLASS}),
    }
    return subprocess.run([executable, *args], capture_output=True, text=True, env=env, check=False)


def test_tree_import_reports_then_is_idempotent(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    for user in ("alice", "bob"):
        document = create_empty_memory()
        document["facts"] = [
            {"id": "fact_00000001", "content": f"{user} fact", "category": "context", "confidence": 0.8}
        ]
        path = tree / "users" / user / "memory.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(document), encoding="utf-8")
    broken = tree / "users" / "carol" / "memory.json"
    broken.parent.mkdir(parents=True)
    broken.write_text("{not json", encoding="utf-8")

    first = _run(["import", str(tree), "--json"], tmp_path / "data")
    assert first.returncode == 3, first.stderr
    summary = json.loads(first.stdout)
    assert len(summary["imported"]) == 2
    assert summary["invalid"][0]["path"].endswith("carol/memory.json")
    assert "not valid JSON" in summary["invalid"][0]["reason"]
    assert "Importing" in first.stderr

    broken.unlink()
    second = _run(["import", str(tree)], tmp_path / "data")
    assert second.returncode == 0, second.stderr
    assert "imported: 0  unchanged: 2  invalid: 0" in second.stdout


def test_json_files_not_named_memory_json_are_reported_as_skipped(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    document = json.dumps({"facts": [{"id": "fact_00000001", "content": "Alice fact"}]})
    for relative in ("users/alice/memory.json", "users/bob.json", "users/alice/notes.json", "Backup.JSON"):
        (tree / relative).parent.mkdir(parents=True, exist_ok=True)
        (tree / relative).write_text(document, encoding="utf-8")
    (tree / "README.md").write_text("not JSON, not reported", encoding="utf-8")

    result = _run(["import", str(tree), "--json"], tmp_path / "data")

    assert result.returncode == 0, result.stderr  # skipped files are not invalid documents
    summary = json.loads(result.stdout)
    assert summary["imported"] == [str(tree / "users" / "alice" / "memory.json")]
    assert summary["invalid"] == []
    reason = "not named memory.json, so no scope is read from it"
    assert summary["skipped"] == [
        {"path": str(tree / relative), "reason": reason}
        for relative in ("Backup.JSON", "users/alice/notes.json", "users/bob.json")
    ]
    text = _run(["import", str(tree)], tmp_path / "data")
    assert "imported: 0  unchanged: 1  invalid: 0  skipped: 3" in text.stdout
    assert f"  skipped {tree / 'users' / 'bob.json'}: {reason}" in text.stdout
    assert "memstore import FILE --user USER" in text.stdout


def test_single_file_needs_valid_scope(tmp_path: Path) -> None:
    path = tmp_path / "one.json"
    path.write_text(json.dumps(create_empty_memory()), encoding="utf-8")
    result = _run(["import", str(path), "--user", "../etc"], tmp_path / "data")
    assert result.returncode != 0
    assert "Invalid user_id" in result.stderr


@pytest.fixture(params=["file", "sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def storage_env(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    """Environment variables selecting one provider for the ``memstore`` subprocess."""
    if request.param == "file":
        return {"MEMSTORE_STORAGE_CLASS": FILE_STORAGE_CLASS}
    if request.param == "sqlite":
        return {"MEMSTORE_STORAGE_CLASS": SQL_STORAGE_CLASS}
    url = str(request.getfixturevalue("postgres_url"))
    return {"MEMSTORE_STORAGE_CLASS": SQL_STORAGE_CLASS, "MEMSTORE_DATABASE_URL": url}


def _nested(depth: int) -> str:
    return '{"facts": [{"id": "fact_00000001", "content": "x", "deep": ' + "[" * depth + "]" * depth + "}]}"


def test_documents_over_the_caps_are_invalid_items_not_tracebacks(
    tmp_path: Path, storage_env: dict[str, str]
) -> None:
    tree = tmp_path / "tree"
    bodies = {
        "depth500": _nested(500),
        "depth100k": _nested(100_000),
        "toomany": json.dumps(
            {"facts": [{"id": f"f{n}", "content": f"fact {n}"} for n in range(MAX_DOCUMENT_FACTS + 1)]}
        ),
        "longfact": json.dumps({"facts": [{"id": "f1", "content": "x" * (MAX_FACT_CHARS + 1)}]}),
        "nul": json.dumps({"facts": [{"id": "f1", "content": "a\x00b"}]}),
        "fine": json.dumps({"facts": [{"id": "f1", "content": "Kept"}]}),
    }
    for user, body in bodies.items():
        path = tree / "users" / user / "memory.json"
        path.parent.mkdir(parents=True)
        path.write_text(body, encoding="utf-8")
    huge = tree / "users" / "huge" / "memory.json"
    huge.parent.mkdir(parents=True)
    with huge.open("wb") as file:  # a valid document, one byte over the cap
        file.write(b'{"facts": [], "pad": "' + b"x" * (MAX_DOCUMENT_BYTES - 23) + b'"}')
    assert huge.stat().st_size == MAX_DOCUMENT_BYTES + 1

    result = _run(["import", str(tree), "--json"], tmp_path / "data", storage_env)

    assert result.returncode == 3, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    summary = json.loads(result.stdout)
    assert summary["imported"] == [str(tree / "users" / "fine" / "memory.json")]
    reasons = {Path(item["path"]).parent.name: item["reason"] for item in summary["invalid"]}
    assert reasons == {
        "depth500": f"nested deeper than {MAX_DOCUMENT_DEPTH} levels",
        "depth100k": "not valid JSON: nested too deeply to parse",
        "toomany": f"{MAX_DOCUMENT_FACTS + 1} facts, over the {MAX_DOCUMENT_FACTS} accepted",
        "longfact": f"fact 0: content is {MAX_FACT_CHARS + 1} characters, over the {MAX_FACT_CHARS} accepted",
        "nul": "a text value contains NUL (U+0000), which cannot be stored",
        "huge": f"larger than the {MAX_DOCUMENT_BYTES} bytes accepted",
    }
