"""The operator commands through the real ``memstore`` console entry point, on SQLite and PostgreSQL.

Each test builds a small DeerFlow-style tree, imports it with ``memstore import`` and then
drives ``facts``, ``stats``, ``history``, ``show``, ``export``, ``erase`` and ``vacuum`` as
an operator would, reading their tables and ``--json`` output.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from memstore.storage.sql.engine import get_engine
from tests.integration.conftest import Cli


def _document(facts: list[tuple[str, str, str, float]], summary: str = "") -> dict[str, Any]:
    return {
        "version": "1.0",
        "lastUpdated": "2026-01-01T00:00:00Z",
        "user": {"workContext": {"summary": summary, "updatedAt": "2026-01-01T00:00:00Z"}},
        "history": {},
        "facts": [
            {
                "id": fact_id,
                "content": content,
                "category": category,
                "confidence": confidence,
                "createdAt": "2026-01-02T00:00:00Z",
                "source": "seed-thread",
            }
            for fact_id, content, category, confidence in facts
        ],
    }


def _write_tree(root: Path) -> Path:
    documents = {
        "users/alice/memory.json": _document(
            [
                ("a1", "Alice maintains deer-flow deployments", "knowledge", 0.9),
                ("a2", "用户喜欢喝咖啡", "preference", 0.8),
                ("a3", "Alice prefers short answers", "preference", 0.7),
            ],
            summary="Alice is an SRE",
        ),
        "users/alice/agents/coder/memory.json": _document([("c1", "Alice writes Rust", "knowledge", 0.6)]),
        "users/bob/memory.json": _document([("b1", "Bob evaluates deer-flow", "goal", 0.5)]),
    }
    for relative, document in documents.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(document, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    return root


@pytest.fixture
def seeded(cli: Cli, tmp_path: Path) -> Cli:
    result = cli("import", str(_write_tree(tmp_path / "tree")))
    assert result.returncode == 0, result.stderr
    assert "imported: 3  unchanged: 0  invalid: 0" in result.stdout
    return cli


def test_facts_search_finds_hyphenated_and_chinese_text(seeded: Cli) -> None:
    page = seeded.json("facts", "search", "deer-flow")
    assert {(f["user_id"], f["fact_id"]) for f in page["facts"]} == {("alice", "a1"), ("bob", "b1")}
    assert page["search_mode"] == "fulltext"
    chinese = seeded.json("facts", "search", "咖啡")
    assert [f["fact_id"] for f in chinese["facts"]] == ["a2"]

    table = seeded("facts", "search", "deer-flow", "--user", "bob")
    assert table.returncode == 0
    assert "Bob evaluates deer-flow" in table.stdout and "showing 1-1 of 1" in table.stdout


def test_facts_search_matches_any_word_unless_told_all(seeded: Cli) -> None:
    question = "who runs the deer-flow deployments?"
    anyword = seeded.json("facts", "search", question)
    assert anyword["facts"][0]["fact_id"] == "a1"  # deer, flow and deployments
    assert {f["fact_id"] for f in anyword["facts"]} == {"a1", "b1"}
    assert seeded.json("facts", "search", question, "--match", "all")["facts"] == []
    bad = seeded("facts", "search", "tea", "--match", "some")
    assert bad.returncode == 2 and "'--match'" in bad.stderr


def test_facts_list_filters_and_pages(seeded: Cli) -> None:
    everything = seeded.json("facts", "list")
    assert everything["total"] == 5
    preferences = seeded.json("facts", "list", "--category", "preference", "--min-confidence", "0.75")
    assert [f["fact_id"] for f in preferences["facts"]] == ["a2"]
    coder = seeded.json("facts", "list", "--agent", "coder")
    assert [f["fact_id"] for f in coder["facts"]] == ["c1"]
    own = seeded.json("facts", "list", "--user", "alice", "--no-agent", "--limit", "2")
    assert own["total"] == 3 and len(own["facts"]) == 2 and own["next_offset"] == 2
    none = seeded.json("facts", "list", "--since", "2026-01-03")
    assert none["total"] == 0
    assert seeded.json("facts", "list", "--text", "RUST")["facts"][0]["fact_id"] == "c1"


def test_bad_filters_exit_with_a_message(seeded: Cli) -> None:
    result = seeded("facts", "list", "--min-confidence", "7")
    assert result.returncode == 2 and "'--min-confidence': 7.0 is not in the range 0<=x<=1" in result.stderr
    # --user takes external ids (mapped by make_safe_user_id): "../etc" is a user with no facts.
    assert seeded.json("facts", "list", "--user", "../etc")["facts"] == []
    result = seeded("facts", "list", "--agent", "coder", "--no-agent")
    assert result.returncode == 2


def test_stats_counts_users_scopes_and_categories(seeded: Cli) -> None:
    stats = seeded.json("stats")
    assert (stats["users"], stats["scopes"], stats["facts"]) == (2, 3, 5)
    assert stats["facts_by_category"] == {"goal": 1, "knowledge": 2, "preference": 2}
    assert stats["database_bytes"] > 0
    table = seeded("stats")
    assert "users: 2  scopes: 3  facts: 5" in table.stdout and "preference" in table.stdout


def test_history_shows_imports_and_manual_changes(seeded: Cli) -> None:
    entries = seeded.json("history", "--user", "alice", "--fact", "a1")
    assert [(e["action"], e["origin"]) for e in entries] == [("insert", "import")]
    assert entries[0]["after"]["content"] == "Alice maintains deer-flow deployments"
    everything = seeded.json("history", "--user", "alice")
    assert {e["agent_name"] for e in everything} == {None, "coder"}
    table = seeded("history", "--user", "alice", "--agent", "coder")
    assert "Alice writes Rust" in table.stdout and "2 change(s)" in table.stdout  # a fact and a section


def test_show_prints_one_scope(seeded: Cli) -> None:
    shown = seeded("show", "--user", "alice")
    assert "Alice is an SRE" in shown.stdout and "a1" in shown.stdout and "c1" not in shown.stdout


def test_export_then_import_is_a_no_op(seeded: Cli, tmp_path: Path) -> None:
    out = tmp_path / "export"
    result = seeded("export", str(out))
    assert result.returncode == 0 and "exported 3 scope(s)" in result.stdout
    source = tmp_path / "tree"
    for path in source.rglob("memory.json"):
        exported = json.loads((out / path.relative_to(source)).read_text(encoding="utf-8"))
        original = json.loads(path.read_text(encoding="utf-8"))
        exported.pop("lastUpdated")
        original.pop("lastUpdated")
        assert exported["facts"] == original["facts"]
        assert exported["user"]["workContext"] == original["user"]["workContext"]
    again = seeded("import", str(out))
    assert "imported: 0  unchanged: 3  invalid: 0" in again.stdout
    only_bob = seeded.json("export", str(tmp_path / "bob"), "--user", "bob")
    assert [Path(p).relative_to(tmp_path / "bob").as_posix() for p in only_bob["files"]] == [
        "users/bob/memory.json"
    ]


def test_erase_needs_confirmation_then_removes_every_row(seeded: Cli) -> None:
    refused = seeded("erase", "--user", "alice")
    assert refused.returncode == 2 and "--yes" in refused.stderr
    declined = seeded("erase", "--user", "alice")  # stdin is not a terminal: still refused
    assert declined.returncode == 2
    assert seeded.json("stats")["users"] == 2

    erased = seeded.json("erase", "--user", "alice", "--yes")
    assert erased["deleted"]["memory_scopes"] == 2
    assert erased["deleted"]["memory_facts"] == 4
    assert erased["deleted"]["memory_history"] > 0
    engine = get_engine(seeded.url)
    with engine.connect() as conn:
        for table in ("memory_scopes", "memory_facts", "memory_history", "memory_sections"):
            rows = conn.execute(text(f"SELECT * FROM {table}")).all()
            assert not any("alice" in str(row) or "Alice" in str(row) for row in rows), table
    assert seeded.json("stats")["users"] == 1
    bob = seeded("erase", "--user", "bob", "--yes")
    assert "erased user bob" in bob.stdout and "memory_facts: 1" in bob.stdout


def test_vacuum_purges_history(seeded: Cli) -> None:
    kept = seeded.json("vacuum", "--older-than", "30")
    assert kept["purged"] == {"memory_facts": 0, "memory_history": 0, "memory_erasures": 0}
    purged = seeded.json("vacuum", "--older-than", "0", "--yes")
    assert purged["purged"]["memory_history"] > 0
    assert seeded.json("history", "--user", "alice") == []
    assert seeded.json("stats")["facts"] == 5  # live memory untouched
    negative = seeded("vacuum", "--older-than", "-1")
    assert negative.returncode == 2


def test_user_takes_the_external_id_a_gateway_mapped(cli: Cli) -> None:
    """``--user alice@example.com`` and a 140-character id find the scopes a gateway stored."""
    from memstore.scope import make_safe_user_id
    from memstore.storage.sql import SqlMemoryStorage

    storage = SqlMemoryStorage(cli.url)
    for raw in ("alice@example.com", "u" * 140):
        fact = {"id": "fact_00000001", "content": f"stored for {raw[:5]}", "confidence": 0.9}
        assert storage.save({"facts": [fact]}, user_id=make_safe_user_id(raw))
        page = cli.json("facts", "list", "--user", raw)
        assert [f["content"] for f in page["facts"]] == [f"stored for {raw[:5]}"]
