"""Ready for distributed PostgreSQL (issue 36): every per-user statement reaches one shard.

Each per-user path runs on a real PostgreSQL database while every statement the process sends
is recorded with its parameters; each is then planned again (``EXPLAIN``) and every scan or
insert of a distributed table must be pinned to one value of that table's distribution column
(``tests/support/distribution.py`` has the layout of docs/scale.md and the rule). A statement
that reaches a distributed table without it would, on Citus, run on every shard.

The paths: load, save, search (full text, semantic, a user's own search), clear, erase,
history, the records queries for one user, session memory, the LangGraph store's items, the
agents' documents, and the durable queue (enqueue, claim, the update's save, settle).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from memstore.agent_doc import MAIN_DOC_PATH, DocScope
from memstore.config import MemoryConfig, set_memory_config
from memstore.integrations.langgraph_store import MemstoreStore
from memstore.ops import agent_docs, sessions
from memstore.ops.embeddings import embed_facts
from memstore.ops.fact_search import search_memory_facts
from memstore.ops.facts import create_memory_fact, get_memory_data
from memstore.queries import (
    FactFilter,
    count_facts,
    erase_user,
    fact_relations,
    list_facts,
    list_scopes,
    memory_history,
    search_facts,
)
from memstore.queue import get_memory_queue, reset_memory_queue
from memstore.storage.loader import get_memory_storage, reset_memory_storage
from memstore.storage.sql.schema.base import Base
from tests.support.distribution import LAYOUT, REFERENCE, Sent, Verdict, recorded, verdicts
from tests.support.openai_server import OpenAIStubServer

pytestmark = pytest.mark.postgres

USER = "alice"
AGENT = "coder"


def _fact(number: int, content: str, **more: Any) -> dict[str, Any]:
    return {
        "id": f"fact_{number:08x}",
        "content": content,
        "category": "preference",
        "confidence": 0.9,
        **more,
    }


def _save_and_load() -> None:
    storage = get_memory_storage()
    document = {
        "facts": [
            _fact(1, "Alice likes green tea", tags=["drink"]),
            _fact(2, "Alice uses rust", tags=["lang"]),
        ]
    }
    document["facts"][1]["relations"] = [{"type": "related_to", "target": "fact_00000001"}]
    assert storage.save(document, user_id=USER)
    loaded = storage.reload(user_id=USER)
    loaded["facts"] = [fact for fact in loaded["facts"] if fact["id"] != "fact_00000001"]
    assert storage.save(loaded, user_id=USER)  # a deletion: tombstone, tags, history
    storage.load(user_id=USER)
    storage.load(AGENT, user_id=USER)
    get_memory_data(user_id=USER)


def _manual_create() -> None:
    create_memory_fact("Alice plays chess", user_id=USER, tags=["game"])
    create_memory_fact(
        "Alice plays rust chess on fridays",
        user_id=USER,
        roles=["editor"],
        visibility="shared",
        allowed_users=["bob"],
    )


def _search() -> None:
    for mode in ("fulltext", "semantic", "hybrid"):
        search_facts("rust chess", FactFilter(user_id=USER), mode=mode)
        search_memory_facts("rust", user_id=USER, mode=mode)


def _records_queries() -> None:
    list_facts(FactFilter(user_id=USER))
    list_facts(FactFilter(user_id=USER, agent_name=None, tag="lang"))
    count_facts(FactFilter(user_id=USER))
    list_scopes(USER)
    fact_relations("fact_00000002", user_id=USER)


def _history() -> None:
    memory_history(FactFilter(user_id=USER))
    memory_history(FactFilter(user_id=USER), fact_id="fact_00000002")


def _clear() -> None:
    get_memory_storage().clear(user_id=USER)


def _erase() -> None:
    # Bob shares a fact with Alice by name: her erase moves his scope to a new revision too.
    create_memory_fact(
        "Bob lends Alice a book", user_id="bob", roles=["editor"], visibility="shared", allowed_users=[USER]
    )
    erase_user(USER)


def _sessions() -> None:
    turns = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    sessions.append_turns(USER, "s1", turns)
    sessions.read_session(USER, "s1")
    sessions.session_context(USER, "s1")
    sessions.list_sessions(USER)
    sessions.clear_session(USER, "s1")
    sessions.erase_user_sessions(USER)


def _store_items(config: MemoryConfig) -> None:
    store = MemstoreStore(user_id=USER, agent_name=AGENT, config=config)
    store.put(("notes",), "n1", {"text": "green tea at four"})
    store.get(("notes",), "n1")
    store.search(("notes",), query="tea", limit=5)
    store.search(("notes",), filter={"text": "green tea at four"})
    store.list_namespaces(prefix=("notes",))
    store.delete(("notes",), "n1")


def _agent_docs() -> None:
    mine = DocScope(AGENT, user_id=USER)
    created = agent_docs.write_doc(
        mine, MAIN_DOC_PATH, "# Notes\nlikes tea\n", expected_version=0, author="user"
    )
    agent_docs.edit_doc(mine, MAIN_DOC_PATH, "tea", "coffee", expected_version=created.version, author="user")
    agent_docs.read_doc(mine, MAIN_DOC_PATH)
    agent_docs.list_docs(mine)
    agent_docs.doc_history(mine, MAIN_DOC_PATH)
    agent_docs.load_main_doc(mine)
    agent_docs.delete_doc(mine, MAIN_DOC_PATH, expected_version=None, author="user")


def _queue() -> None:
    queue = get_memory_queue()
    queue.add_nowait("t1", [{"role": "user", "content": "I prefer oolong tea."}], user_id=USER)
    queue.flush()  # claim, the update's load and save, settle


PATHS: dict[str, Callable[[MemoryConfig], None]] = {
    "save+load": lambda _config: _save_and_load(),
    "manual create": lambda _config: _manual_create(),
    "search": lambda _config: _search(),
    "records queries": lambda _config: _records_queries(),
    "history": lambda _config: _history(),
    "session memory": lambda _config: _sessions(),
    "store items": _store_items,
    "agent documents": lambda _config: _agent_docs(),
    "queue": lambda _config: _queue(),
    "clear": lambda _config: _clear(),
    "erase": lambda _config: _erase(),
}
"""In this order: each path finds the rows the ones before it wrote (erase last)."""


@pytest.fixture
def configured(postgres_url: str, tmp_path: Path, openai_server: OpenAIStubServer) -> Iterator[MemoryConfig]:
    config = MemoryConfig(
        data_dir=str(tmp_path / "data"),
        database_url=postgres_url,
        extractor="rules",
        queue_workers=0,
        embedding_provider="openai",
        embedding_base_url=openai_server.base_url,
        embedding_model="test-embed",
    )
    set_memory_config(config)
    reset_memory_storage()
    reset_memory_queue()
    agent_docs.reset_agent_doc_stores()
    yield config
    reset_memory_queue()
    agent_docs.reset_agent_doc_stores()


CROSS_USER = [
    (
        r"memory_facts\.visibility != 'private'",
        "memory_facts",
        "the probe: does the tenant share any fact at all",
    ),
    (
        r"memory_facts\.visibility = %\(visibility_\d+\)s",
        "memory_facts",
        "the other owners' shared and public facts this user may read: across the tenant's users",
    ),
    (
        r"^DELETE FROM memory_fact_grants WHERE .*grantee = ",
        "memory_fact_grants",
        "erase: the user leaves others' grants",
    ),
    (
        r"^SELECT DISTINCT memory_fact_grants\.scope_id FROM memory_fact_grants WHERE .*grantee = ",
        "memory_fact_grants",
        "erase: (before that) which scopes hold those grants, each then moved to a new revision",
    ),
    (
        r"^UPDATE memory_agent_document\w* SET actor=",
        "memory_agent_documents",
        "erase: the user's name leaves agents' docs",
    ),
    (
        r"^UPDATE memory_agent_document\w* SET actor=",
        "memory_agent_document_versions",
        "(the same, in the versions)",
    ),
    (
        r"GROUP BY memory_fact_embeddings\.model",
        "memory_fact_embeddings",
        "once per process: did the model change",
    ),
    (
        r"^SELECT count\(\*\) AS count_1 FROM memory_facts WHERE memory_facts\.deleted_revision IS NULL$",
        "memory_facts",
        "once per process, with the line above",
    ),
]
"""Statements of a per-user path that read or write other users' rows on purpose (docs/scale.md):
on Citus they run on every shard. The table they drive from may be unpinned; every other table
of the statement must join it on the distribution column, so the planner can push it down."""


def _joined_in_text(statement: str) -> set[str]:
    """Tables the SQL joins on their distribution column to a co-located one (a hashed subplan
    hides the correlation from the plan)."""
    joined: set[str] = set()
    for left, left_column, right, right_column in re.findall(r"(\w+)\.(\w+) = (\w+)\.(\w+)", statement):
        one, other = LAYOUT.get(left), LAYOUT.get(right)
        if (
            one
            and other
            and one.group == other.group
            and (one.column, other.column) == (left_column, right_column)
        ):
            joined |= {left, right}
    return joined


def _problem(path: str, verdict: Verdict) -> str | None:
    """What is wrong with one statement, if anything."""
    unpinned = set(verdict.unpinned)
    flat = " ".join(verdict.statement.split())
    drivers = {table for pattern, table, _ in CROSS_USER if re.search(pattern, flat)}
    if drivers:
        # A push-down: the driving table's shards, each joined with its co-located rows.
        unpinned -= drivers | verdict.joined | _joined_in_text(flat)
    if not unpinned:
        return None
    return f"{path}: {', '.join(sorted(unpinned))} not pinned to a shard by\n  {verdict.statement}"


def test_every_per_user_statement_filters_on_the_distribution_column(
    configured: MemoryConfig, postgres_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    recordings: dict[str, list[Sent]] = {}
    for path, run in PATHS.items():
        if path == "search":
            embed_facts(config=configured)  # an operator's run across scopes: not a per-user path
        with recorded() as sent:
            run(configured)
        recordings[path] = sent

    failures: list[str] = []
    summary: list[str] = []
    for path, sent in recordings.items():
        judged = verdicts(postgres_url, sent)
        touching = [verdict for verdict in judged if verdict.pinned or verdict.unpinned]
        assert touching, f"{path} sent no statement on a memory table: the recording is broken"
        failures += [problem for verdict in touching if (problem := _problem(path, verdict))]
        kinds = sorted({how for verdict in touching for how in verdict.pinned.values()})
        summary.append(f"{path}: {len(touching)} statements on memory tables ({', '.join(kinds)})")
    with capsys.disabled():
        print("\n" + "\n".join(summary))  # the figures docs/scale.md quotes
    assert not failures, "\n".join(failures)


CITUS_KEY_REWRITES = {
    ("memory_scopes", "uq_memory_scopes_scope"),
    ("memory_facts", "pk_memory_facts"),
    ("memory_history", "pk_memory_history"),
    ("memory_fact_embeddings", "pk_memory_fact_embeddings"),
    ("memory_fact_embeddings", "fk_memory_fact_embeddings_fact_row_id_memory_facts"),
    ("memory_fact_grants", "pk_memory_fact_grants"),
    ("memory_fact_tags", "pk_memory_fact_tags"),
}
"""Unique keys and foreign keys without the distribution column: Citus refuses them as they are;
docs/scale.md says what each becomes there. A new one fails the test until it is written down."""


def _column_names(columns: Any) -> set[str]:
    return {getattr(column, "name", str(column)) for column in columns}


def test_every_table_carries_its_distribution_column() -> None:
    tables = {table.name: table for table in Base.metadata.sorted_tables}
    assert set(tables) == set(LAYOUT), "a new table needs its place in the layout (docs/scale.md)"
    rewrites: set[tuple[str, str]] = set()
    for name, placement in LAYOUT.items():
        table = tables[name]
        if placement.column is None:
            assert placement.group == REFERENCE
            continue
        column = table.c[placement.column]
        assert not column.nullable, f"{name}.{placement.column} may be NULL: a NULL has no shard"
        if not placement.distributed:
            continue
        keys: list[tuple[str, set[str]]] = [
            (str(table.primary_key.name), _column_names(table.primary_key.columns))
        ]
        keys += [
            (str(index.name), _column_names(index.expressions)) for index in table.indexes if index.unique
        ]
        for foreign in table.foreign_key_constraints:
            target = LAYOUT[foreign.referred_table.name]
            assert target.group == placement.group, f"{foreign.name} crosses co-location groups"
            pairs = {(element.parent.name, element.column.name) for element in foreign.elements}
            if (placement.column, target.column) not in pairs:
                keys.append((str(foreign.name), set()))
        rewrites |= {(name, key) for key, columns in keys if placement.column not in columns}
    assert rewrites == CITUS_KEY_REWRITES
