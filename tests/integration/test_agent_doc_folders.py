"""Listing a folder of agent documents gives the same answer on both dialects: paths are
case-sensitive (SQLite's ``LIKE`` is not) and come sorted by code point, not by the database's
collation."""

from __future__ import annotations

from memstore.agent_doc import DocScope
from memstore.config import MemoryConfig, set_memory_config
from memstore.ops import agent_docs as ops

SCOPE = DocScope("coder")
PATHS = (
    "/memories/notes/a.md",
    "/memories/Notes/b.md",
    "/memories/NOTES.md",
    "/memories/notes_x/c.md",
    "/memories/notesx.md",
    "/memories/Zeta.md",
    "/memories/agent.md",
)


def test_a_folder_lists_its_own_paths_exactly_and_in_code_point_order(sql_url: str) -> None:
    set_memory_config(MemoryConfig(database_url=sql_url))
    ops.reset_agent_doc_stores()
    for path in PATHS:
        ops.write_doc(SCOPE, path, path, expected_version=0, author="operator")

    def listed(folder: str) -> list[str]:
        return [doc.path for doc in ops.list_docs(SCOPE, folder)]

    assert listed("/memories/notes/") == ["/memories/notes/a.md"]
    assert listed("/memories/Notes") == ["/memories/Notes/b.md"]
    assert listed("/memories/NOTES/") == []
    assert listed("/memories/") == sorted(PATHS)
    assert sorted(PATHS)[:3] == ["/memories/NOTES.md", "/memories/Notes/b.md", "/memories/Zeta.md"]
