"""``memstore import`` embeds what it imported (issue 39), through the real console entry point on
SQLite and PostgreSQL, against the tests' OpenAI-compatible embeddings server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from memstore.config import FILE_STORAGE_CLASS
from tests.integration.conftest import Cli
from tests.integration.test_import_embeds import TREE, write_tree
from tests.support.openai_server import OpenAIStubServer
from tests.support.semantic import MODEL, STORED
from tests.support.terminal import run_on_terminal


def embeddings_on(cli: Cli, server: OpenAIStubServer) -> None:
    cli.env.update(
        MEMSTORE_EMBEDDING_PROVIDER="openai",
        MEMSTORE_EMBEDDING_MODEL=MODEL,
        MEMSTORE_EMBEDDING_BASE_URL=server.base_url,
    )


def status(cli: Cli) -> dict[str, Any]:
    report: dict[str, Any] = cli.json("embed", "--status")
    return report


def test_import_embeds_with_a_progress_line_and_reports_it(
    cli: Cli, openai_server: OpenAIStubServer, tmp_path: Path
) -> None:
    embeddings_on(cli, openai_server)
    write_tree(tmp_path / "tree", TREE)

    result = cli("import", str(tmp_path / "tree"), "--json")

    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert len(summary["imported"]) == 2
    assert summary["embedding"] == {"model": STORED, "embedded": 4, "error": None}
    assert "Embedding 4 fact(s)" in result.stderr  # the progress bar's line when stderr is no terminal
    assert status(cli)["missing"] == 0

    again = cli("import", str(tmp_path / "tree"))  # nothing new: no bar, nothing sent
    assert again.returncode == 0, again.stderr
    assert "unchanged: 2" in again.stdout and "embedded: 0 fact(s) with openai:test-embed" in again.stdout
    assert "Embedding" not in again.stderr


def test_on_a_terminal_the_embedding_has_a_progress_bar(
    cli: Cli, openai_server: OpenAIStubServer, tmp_path: Path
) -> None:
    embeddings_on(cli, openai_server)
    write_tree(tmp_path / "tree", TREE)
    code, stdout, terminal = run_on_terminal(cli.env, "import", str(tmp_path / "tree"))
    assert code == 0, terminal
    assert "embedded: 4 fact(s) with openai:test-embed" in stdout
    assert "Embedding 4 fact(s)" in terminal and "━" in terminal and "4/4" in terminal


def test_no_embed_and_dry_run_leave_the_facts_unembedded(
    cli: Cli, openai_server: OpenAIStubServer, tmp_path: Path
) -> None:
    embeddings_on(cli, openai_server)
    write_tree(tmp_path / "tree", TREE)

    dry = cli("import", str(tmp_path / "tree"), "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["embedding"] is None

    result = cli("import", str(tmp_path / "tree"), "--no-embed", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["embedding"] is None
    assert "Embedding" not in result.stderr and openai_server.embedding_requests == []
    assert status(cli)["missing"] == 4

    finish = cli("embed")
    assert finish.returncode == 0, finish.stderr
    assert status(cli)["missing"] == 0


def test_with_embedding_provider_none_the_import_says_so_once(cli: Cli, tmp_path: Path) -> None:
    write_tree(tmp_path / "tree", TREE)
    result = cli("import", str(tmp_path / "tree"), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["embedding"] == {"model": None, "embedded": 0, "error": None}
    assert result.stderr.count("embedding_provider is none") == 1
    quiet = cli("import", str(tmp_path / "tree"), "--no-embed")
    assert quiet.returncode == 0 and "embedding_provider" not in quiet.stderr


def test_a_failing_endpoint_exits_1_with_the_import_committed_and_names_memstore_embed(
    cli: Cli, openai_server: OpenAIStubServer, tmp_path: Path
) -> None:
    embeddings_on(cli, openai_server)
    write_tree(tmp_path / "tree", TREE)
    openai_server.fail_embeddings(503)

    result = cli("import", str(tmp_path / "tree"), "--json")

    assert result.returncode == 1
    summary = json.loads(result.stdout)  # the report is still printed, whole
    assert len(summary["imported"]) == 2 and summary["invalid"] == []
    assert summary["embedding"]["embedded"] == 0 and "503" in summary["embedding"]["error"]
    [error] = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert "the import is committed" in error and "run `memstore embed` to finish" in error
    shown = cli.json("show", "--user", "bob")
    assert len(shown["facts"]) == 2  # committed
    assert status(cli)["missing"] == 4

    openai_server.fail_embeddings(None)
    assert cli("embed").returncode == 0
    assert status(cli)["missing"] == 0


def test_a_setting_that_cannot_embed_fails_before_anything_is_written(
    cli: Cli, openai_server: OpenAIStubServer, tmp_path: Path
) -> None:
    embeddings_on(cli, openai_server)
    cli.env["MEMSTORE_STORAGE_CLASS"] = FILE_STORAGE_CLASS
    write_tree(tmp_path / "tree", TREE)
    refused = cli("import", str(tmp_path / "tree"))
    assert refused.returncode == 1
    assert "keeps none" in refused.stderr and "imported:" not in refused.stdout
    assert not (tmp_path / "data" / "users").exists()
    done = cli("import", str(tmp_path / "tree"), "--no-embed")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "data" / "users" / "alice" / "memory.json").exists()
