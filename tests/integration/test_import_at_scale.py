"""Issue acceptance: a 2,000-user × 50-fact DeerFlow tree through ``memstore import`` and ``export``.

Runs the real console entry point on SQLite and PostgreSQL: the first import shows a progress
bar and imports everything, the second reports everything unchanged and writes no row, and an
export differs from the source tree only in the ``lastUpdated`` lines.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from memstore.storage.sql.engine import dispose_engines, get_engine
from tests.support.terminal import memstore_executable, run_on_terminal

USERS = 2000
FACTS = 50


def _document(user: int) -> dict[str, Any]:
    stamp = "2026-01-01T00:00:00Z"
    return {
        "version": "1.0",
        "lastUpdated": stamp,
        "user": {
            name: {"summary": f"user {user} {name}", "updatedAt": stamp}
            for name in ("workContext", "personalContext", "topOfMind")
        },
        "history": {
            name: {"summary": "", "updatedAt": ""}
            for name in ("recentMonths", "earlierContext", "longTermBackground")
        },
        "facts": [
            {
                "id": f"fact_{user:04d}{index:04d}",
                "content": f"user {user} fact {index} about deer-flow"
                if index == 0
                else f"用户 {user} 的事实 {index}",
                "category": "context",
                "confidence": 0.8,
                "createdAt": stamp,
                "source": "seed-thread",
            }
            for index in range(FACTS)
        ],
    }


def _write_tree(root: Path) -> None:
    for user in range(USERS):
        path = root / "users" / f"user{user:04d}" / "memory.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(_document(user), ensure_ascii=False, indent=2) + "\n", encoding="utf-8")


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    command = [memstore_executable(), *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, check=False)


def _footprint(url: str) -> tuple[int, int, int]:
    """History rows, the sum of scope revisions and the newest update: any write moves one of them."""
    with get_engine(url).connect() as conn:
        history = conn.execute(text("SELECT count(*) FROM memory_history")).scalar_one()
        revisions, newest = conn.execute(
            text("SELECT sum(revision), count(DISTINCT updated_at) FROM memory_scopes")
        ).one()
    return int(history), int(revisions), int(newest)


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_large_tree_imports_idempotently_and_exports_back(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    tree = tmp_path / "tree"
    _write_tree(tree)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTORE_")}
    env["MEMSTORE_DATA_DIR"] = str(tmp_path / "data")
    if backend == "postgresql":
        url = str(request.getfixturevalue("pg_url"))
        env["MEMSTORE_DATABASE_URL"] = url
        env["MEMSTORE_AUTO_MIGRATE"] = "true"
    else:
        url = f"sqlite:///{tmp_path / 'data' / 'memory.db'}"

    try:
        code, stdout, terminal = run_on_terminal(env, "import", str(tree))
        assert code == 0, terminal
        assert f"imported: {USERS}  unchanged: 0  invalid: 0" in stdout
        assert "Importing" in terminal and "━" in terminal and f"{USERS}/{USERS}" in terminal  # Rich's bar
        before = _footprint(url)
        assert before[0] == USERS * (FACTS + 3)  # one history row per fact and non-empty section

        second = _run(env, "import", str(tree), "--json")
        assert second.returncode == 0, second.stderr
        summary = json.loads(second.stdout)
        assert summary["imported"] == [] and summary["unchanged"] == USERS and summary["invalid"] == []
        assert _footprint(url) == before

        out = tmp_path / "export"
        exported = _run(env, "export", str(out))
        assert exported.returncode == 0, exported.stderr
        differing: list[str] = []
        for path in sorted(tree.rglob("memory.json")):
            source = path.read_text(encoding="utf-8").splitlines()
            copy = (out / path.relative_to(tree)).read_text(encoding="utf-8").splitlines()
            assert len(source) == len(copy), path
            differing.extend(a.split(":")[0].strip() for a, b in zip(source, copy, strict=True) if a != b)
        assert set(differing) == {'"lastUpdated"'} and len(differing) == USERS

        searched = json.loads(_run(env, "facts", "search", "deer-flow", "--json", "--limit", "5").stdout)
        assert searched["total"] == USERS
    finally:
        dispose_engines()
