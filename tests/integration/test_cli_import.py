"""``memstore import`` through the real console entry point."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from memstore.config import FILE_STORAGE_CLASS
from memstore.document import create_empty_memory


def _run(args: list[str], data_dir: Path) -> subprocess.CompletedProcess[str]:
    executable = shutil.which("memstore", path=str(Path(sys.executable).parent))
    assert executable is not None
    env = {**os.environ, "MEMSTORE_DATA_DIR": str(data_dir), "MEMSTORE_STORAGE_CLASS": FILE_STORAGE_CLASS}
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


def test_single_file_needs_valid_scope(tmp_path: Path) -> None:
    path = tmp_path / "one.json"
    path.write_text(json.dumps(create_empty_memory()), encoding="utf-8")
    result = _run(["import", str(path), "--user", "../etc"], tmp_path / "data")
    assert result.returncode != 0
    assert "Invalid user_id" in result.stderr
