"""The agent documents' store on SQLite and PostgreSQL: versions, conflicts, caps, history, erase."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from memstore.agent_doc import MAIN_DOC_PATH, DocScope
from memstore.config import MemoryConfig, set_memory_config
from memstore.errors import (
    AgentDocConflictError,
    AgentDocEditError,
    AgentDocLimitError,
    AgentDocNotFoundError,
    AgentDocPathError,
    ConfigError,
)
from memstore.ops import agent_docs as ops
from memstore.storage.sql.engine import get_engine
from memstore.storage.sql.schema.models import agent_document_versions_table, agent_documents_table

AGENT = DocScope("coder")


@pytest.fixture(autouse=True)
def database(sql_url: str) -> str:
    set_memory_config(MemoryConfig(database_url=sql_url, agent_doc_max_docs=3, agent_doc_history_keep=3))
    ops.reset_agent_doc_stores()
    return sql_url


def test_write_read_edit_delete_bump_one_version_each_and_keep_the_history() -> None:
    created = ops.write_doc(
        AGENT, MAIN_DOC_PATH, "# Role\nI review code.\n", expected_version=0, author="agent"
    )
    assert created.version == 1
    edited = ops.edit_doc(
        AGENT, MAIN_DOC_PATH, "review", "write", expected_version=1, author="agent", actor="bob"
    )
    assert (edited.version, edited.content) == (2, "# Role\nI write code.\n")
    read = ops.read_doc(AGENT, MAIN_DOC_PATH)
    assert (read.version, read.content, read.actor, read.author) == (
        2,
        "# Role\nI write code.\n",
        "bob",
        "agent",
    )
    assert ops.delete_doc(AGENT, MAIN_DOC_PATH, expected_version=2, author="operator") == 3
    with pytest.raises(AgentDocNotFoundError):
        ops.read_doc(AGENT, MAIN_DOC_PATH)
    assert ops.list_docs(AGENT) == []
    # Written again, it goes on from the delete's version: a reader of version 1 or 2 conflicts.
    again = ops.write_doc(AGENT, MAIN_DOC_PATH, "new", expected_version=0, author="operator")
    assert again.version == 4
    history = ops.doc_history(AGENT, MAIN_DOC_PATH)
    assert [(v.version, v.action, v.content) for v in history] == [
        (4, "write", "new"),
        (3, "delete", None),
        (2, "edit", "# Role\nI write code.\n"),
    ]  # history_keep 3: version 1 was pruned


def test_a_stale_version_is_a_conflict_and_changes_nothing() -> None:
    ops.write_doc(AGENT, MAIN_DOC_PATH, "one", expected_version=0, author="agent")
    ops.write_doc(AGENT, MAIN_DOC_PATH, "two", expected_version=1, author="agent")
    for attempt in (
        lambda: ops.write_doc(AGENT, MAIN_DOC_PATH, "three", expected_version=1, author="agent"),
        lambda: ops.write_doc(AGENT, MAIN_DOC_PATH, "three", expected_version=0, author="agent"),
        lambda: ops.edit_doc(AGENT, MAIN_DOC_PATH, "two", "2", expected_version=1, author="agent"),
        lambda: ops.delete_doc(AGENT, MAIN_DOC_PATH, expected_version=1, author="agent"),
    ):
        with pytest.raises(AgentDocConflictError):
            attempt()
    assert ops.read_doc(AGENT, MAIN_DOC_PATH).content == "two"
    assert len(ops.doc_history(AGENT, MAIN_DOC_PATH)) == 2


def test_an_edit_must_match_exactly_once() -> None:
    ops.write_doc(AGENT, MAIN_DOC_PATH, "a a b", expected_version=0, author="agent")
    with pytest.raises(AgentDocEditError, match="2 times"):
        ops.edit_doc(AGENT, MAIN_DOC_PATH, "a", "c", expected_version=None, author="agent")
    with pytest.raises(AgentDocEditError, match="does not occur"):
        ops.edit_doc(AGENT, MAIN_DOC_PATH, "z", "c", expected_version=None, author="agent")
    with pytest.raises(AgentDocNotFoundError):
        ops.edit_doc(AGENT, "/memories/none.md", "a", "c", expected_version=None, author="agent")
    assert ops.read_doc(AGENT, MAIN_DOC_PATH).version == 1


def test_caps_per_document_and_per_agent(database: str) -> None:
    set_memory_config(
        MemoryConfig(
            database_url=database,
            agent_doc_max_docs=2,
            agent_doc_max_chars=1000,
            agent_doc_max_total_chars=1500,
        )
    )
    with pytest.raises(AgentDocEditError, match="agent_doc_max_chars"):
        ops.write_doc(AGENT, "/memories/a.md", "x" * 1001, expected_version=0, author="agent")
    ops.write_doc(AGENT, "/memories/a.md", "x" * 1000, expected_version=0, author="agent")
    with pytest.raises(AgentDocLimitError, match="agent_doc_max_total_chars"):
        ops.write_doc(AGENT, "/memories/b.md", "x" * 501, expected_version=0, author="agent")
    ops.write_doc(AGENT, "/memories/b.md", "x" * 500, expected_version=0, author="agent")
    with pytest.raises(AgentDocLimitError, match="agent_doc_max_docs"):
        ops.write_doc(AGENT, "/memories/c.md", "x", expected_version=0, author="agent")
    # Rewriting a document within the caps is fine; another agent has caps of its own.
    ops.write_doc(AGENT, "/memories/a.md", "y" * 900, expected_version=None, author="agent")
    ops.write_doc(DocScope("other"), "/memories/c.md", "x" * 1000, expected_version=0, author="agent")
    assert [doc.path for doc in ops.list_docs(AGENT)] == ["/memories/a.md", "/memories/b.md"]


def test_listing_is_by_folder_and_scopes_are_apart() -> None:
    mine, user_doc = DocScope("coder", None, "t1"), DocScope("coder", "alice", "t1")
    ops.write_doc(mine, "/memories/agent.md", "agent", expected_version=0, author="agent")
    ops.write_doc(mine, "/memories/projects/x.md", "x", expected_version=0, author="agent")
    ops.write_doc(mine, "/memories/projects_x.md", "underscore", expected_version=0, author="agent")
    ops.write_doc(user_doc, "/memories/agent.md", "alice's", expected_version=0, author="agent")
    assert [d.path for d in ops.list_docs(mine, "/memories/projects")] == ["/memories/projects/x.md"]
    assert [d.path for d in ops.list_docs(mine, "/memories/")] == [
        "/memories/agent.md",
        "/memories/projects/x.md",
        "/memories/projects_x.md",
    ]
    assert ops.read_doc(user_doc, MAIN_DOC_PATH).content == "alice's"
    assert ops.list_docs(DocScope("coder")) == []  # the default tenant has none
    with pytest.raises(AgentDocPathError):
        ops.list_docs(mine, "/memories/../x")


def test_erasing_the_agent_and_the_user() -> None:
    shared, alice = DocScope("coder"), DocScope("coder", "alice")
    ops.write_doc(shared, MAIN_DOC_PATH, "shared", expected_version=0, author="agent", actor="alice")
    ops.write_doc(alice, MAIN_DOC_PATH, "alice's", expected_version=0, author="agent", actor="alice")
    ops.write_doc(DocScope("other"), MAIN_DOC_PATH, "other", expected_version=0, author="agent")
    summaries = ops.doc_summaries()
    assert [(s.agent_name, s.user_id, s.documents) for s in summaries] == [
        ("coder", None, 1),
        ("coder", "alice", 1),
        ("other", None, 1),
    ]
    assert ops.erase_agent_docs("coder") == {"memory_agent_document_versions": 2, "memory_agent_documents": 2}
    assert [s.agent_name for s in ops.doc_summaries()] == ["other"]


def test_the_file_provider_is_refused_with_a_clear_error() -> None:
    set_memory_config(MemoryConfig(storage_class="memstore.storage.FileMemoryStorage"))
    with pytest.raises(ConfigError, match="need the SQL provider, but storage_class"):
        ops.get_agent_doc_store()


def test_creating_and_deleting_documents_without_end_keeps_storage_bounded(database: str) -> None:
    set_memory_config(MemoryConfig(database_url=database, agent_doc_max_docs=2, agent_doc_history_keep=3))
    ops.write_doc(AGENT, MAIN_DOC_PATH, "kept", expected_version=0, author="agent")
    for number in range(30):
        path = f"/memories/churn-{number}.md"
        ops.write_doc(AGENT, path, "x" * 100, expected_version=0, author="agent")
        ops.delete_doc(AGENT, path, expected_version=1, author="agent")
    with get_engine(database).connect() as conn:  # the tables themselves, tombstones included
        rows = conn.execute(select(func.count()).select_from(agent_documents_table)).scalar_one()
        versions = conn.execute(select(func.count()).select_from(agent_document_versions_table)).scalar_one()
    assert rows <= 2 * 2 and versions <= rows * 3
    assert ops.read_doc(AGENT, MAIN_DOC_PATH).content == "kept"  # a live document is never purged
    # A writer still holding a purged document's version is refused, not handed a fresh document.
    with pytest.raises(AgentDocConflictError):
        ops.write_doc(AGENT, "/memories/churn-0.md", "late", expected_version=1, author="agent")


def test_line_endings_are_stored_as_newlines_so_edits_across_lines_match() -> None:
    ops.write_doc(AGENT, MAIN_DOC_PATH, "# Role\r\nreviews\r\ncode\rnow", expected_version=0, author="import")
    assert ops.read_doc(AGENT, MAIN_DOC_PATH).content == "# Role\nreviews\ncode\nnow"
    edited = ops.edit_doc(
        AGENT, MAIN_DOC_PATH, "reviews\ncode", "writes\r\ncode", expected_version=1, author="agent"
    )
    assert edited.content == "# Role\nwrites\ncode\nnow"
