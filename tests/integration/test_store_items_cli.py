"""``memstore store list|show|history`` on SQLite and PostgreSQL: items a LangGraph graph put
through ``MemstoreStore`` are listed, shown and audited by their user's identity, another user,
agent or tenant sees none of them, and a bad id, namespace or key is a usage error that does not
repeat the value. Through click's runner in process, then once through the console entry point
and, on PostgreSQL, as an application role that row-level security binds.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest
from click.testing import CliRunner, Result

from memstore.cli import main
from memstore.cli.exit_codes import EXIT_NOTHING_MATCHED, EXIT_USAGE
from memstore.config import MemoryConfig
from memstore.integrations.langgraph_store import MemstoreStore
from memstore.storage.sql.store_items.items import MAX_LIMIT, MAX_OFFSET
from tests.integration.conftest import Cli
from tests.support.app_role import app_role_url

Invoke = Callable[..., Result]
ALICE = "alice"


@pytest.fixture
def invoke(sql_url: str, isolated_config: MemoryConfig) -> Iterator[Invoke]:
    isolated_config.database_url = sql_url

    def run(*args: str) -> Result:
        return CliRunner().invoke(main, ["store", *args], prog_name="memstore", catch_exceptions=False)

    yield run


def _seed(store: MemstoreStore) -> None:
    store.put(("memories", ALICE), "prefs", {"theme": "dark"})
    store.put(("memories", ALICE), "prefs", {"theme": "light", "lang": "fr"})
    store.put(("memories", ALICE), "food", {"likes": ["tea", "数据"]})
    store.put(("memories", ALICE, "work"), "desk", {"floor": 3})
    store.put(("notes", ALICE), "todo", {"text": "call Bob"})
    store.delete(("notes", ALICE), "todo")


def _json(result: Result) -> dict[str, object]:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def test_list_show_history(invoke: Invoke) -> None:
    _seed(MemstoreStore(namespace_user_index=1))
    listed = _json(invoke("list", "--user", ALICE, "--json"))
    pairs = [(".".join(i["namespace"]), i["key"]) for i in listed["items"]]  # type: ignore[attr-defined]
    assert pairs == [("memories.alice.work", "desk"), ("memories.alice", "food"), ("memories.alice", "prefs")]
    assert listed["userId"] == ALICE and listed["tenantId"] == "default" and listed["agentName"] is None
    prefs = listed["items"][2]  # type: ignore[index]
    assert prefs["version"] == 2 and prefs["chars"] == len('{"theme":"light","lang":"fr"}')

    under = _json(invoke("list", "--user", ALICE, "--namespace", "memories.alice", "--limit", "1", "--json"))
    assert [i["key"] for i in under["items"]] == ["desk"]  # type: ignore[attr-defined]
    page = _json(invoke("list", "--user", ALICE, "--namespace", "memories", "--offset", "2", "--json"))
    assert [i["key"] for i in page["items"]] == ["prefs"]  # type: ignore[attr-defined]
    assert _json(invoke("list", "--user", ALICE, "--namespace", "memo", "--json"))["items"] == []

    table = invoke("list", "--user", ALICE)
    assert table.exit_code == 0
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["NAMESPACE", "KEY", "UPDATED", "CHARS", "VERSION"]
    assert lines[1].split()[:2] == ["memories.alice.work", "desk"]
    assert lines[-1] == "showing 1-3 of the store items of alice"

    shown = _json(
        invoke("show", "--namespace", "memories.alice", "--key", "prefs", "--user", ALICE, "--json")
    )
    assert shown["value"] == {"theme": "light", "lang": "fr"} and shown["version"] == 2
    assert shown["createdAt"] and shown["updatedAt"] and shown["namespace"] == ["memories", ALICE]
    plain = invoke("show", "--namespace", "memories.alice", "--key", "food", "--user", ALICE)
    assert plain.exit_code == 0
    assert json.loads(plain.stdout) == {"likes": ["tea", "数据"]}
    assert "version 1, created" in plain.stderr

    history = _json(
        invoke("history", "--namespace", "notes.alice", "--key", "todo", "--user", ALICE, "--json")
    )
    entries = history["history"]
    assert [(e["version"], e["op"]) for e in entries] == [(2, "delete"), (1, "put")]  # type: ignore[attr-defined]
    assert entries[1]["value"] == {"text": "call Bob"} and entries[0]["value"] is None  # type: ignore[index]
    puts = invoke("history", "--namespace", "memories.alice", "--key", "prefs", "--user", ALICE)
    assert puts.exit_code == 0
    rows = puts.stdout.splitlines()
    assert rows[0].split() == ["VERSION", "OP", "CHANGED", "VALUE"]
    assert rows[1].split()[:2] == ["2", "put"] and '"lang": "fr"' in rows[1]
    assert rows[2].split()[:2] == ["1", "put"] and '"theme": "dark"' in rows[2]

    # A deleted item is not shown, but its history is.
    gone = invoke("show", "--namespace", "notes.alice", "--key", "todo", "--user", ALICE)
    assert gone.exit_code == EXIT_NOTHING_MATCHED and "no store item" in gone.stderr


def test_another_user_agent_or_tenant_sees_nothing(invoke: Invoke) -> None:
    _seed(MemstoreStore(namespace_user_index=1))
    MemstoreStore(user_id="bob", agent_name="Coder", tenant_id="acme").put(("memories",), "k", {"x": 1})
    for args in (
        ("--user", "bob"),
        ("--user", ALICE, "--agent", "coder"),
        ("--user", ALICE, "--tenant", "acme"),
        ("--user", "bob", "--agent", "coder"),
    ):
        assert _json(invoke("list", *args, "--json"))["items"] == [], args
        for command in ("show", "history"):
            result = invoke(command, "--namespace", "memories.alice", "--key", "prefs", *args)
            assert result.exit_code == EXIT_NOTHING_MATCHED, (command, args, result.output)
            assert "check the ids" in result.stderr
    bob = _json(invoke("list", "--user", "bob", "--agent", "CODER", "--tenant", "acme", "--json"))
    assert [i["key"] for i in bob["items"]] == ["k"] and bob["agentName"] == "coder"  # type: ignore[attr-defined]
    empty = invoke("list", "--user", "carol")
    assert empty.exit_code == 0 and "showing none of the store items of carol" in empty.stdout


SECRET = "Sécret\x1b[31m"


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["list", "--user", ALICE, "--tenant", SECRET], "'--tenant'"),
        (["list", "--user", ALICE, "--agent", SECRET], "'--agent'"),
        (["list", "--user", ""], "'--user'"),
        (["list"], "'--user'"),
        (["list", "--user", ALICE, "--namespace", ""], "'--namespace'"),
        (["list", "--user", ALICE, "--namespace", "a..b" + SECRET], "'--namespace'"),
        (["list", "--user", ALICE, "--limit", "0"], "'--limit'"),
        (["list", "--user", ALICE, "--limit", str(MAX_LIMIT + 1)], "'--limit'"),
        (["list", "--user", ALICE, "--offset", str(MAX_OFFSET + 1)], "'--offset'"),
        (["show", "--key", "k", "--user", ALICE], "'--namespace'"),
        (["show", "--namespace", "a", "--key", "", "--user", ALICE], "'--key'"),
        (["show", "--namespace", "a", "--key", "x" * 600 + SECRET, "--user", ALICE], "'--key'"),
        (["history", "--namespace", "a." + "x" * 200, "--key", "k", "--user", ALICE], "'--namespace'"),
        (["history", "--namespace", "a", "--key", "k", "--user", ALICE, "--agent", "a/b"], "'--agent'"),
    ],
)
def test_a_bad_value_is_a_usage_error_that_does_not_repeat_it(
    invoke: Invoke, args: list[str], named: str
) -> None:
    result = invoke(*args)
    assert result.exit_code == EXIT_USAGE, (args, result.output)
    assert "Usage: memstore store" in result.stderr and named in result.stderr, result.stderr
    assert SECRET not in result.output and "x" * 100 not in result.output


def test_through_the_console_entry_point(cli: Cli) -> None:
    """The real process on both databases: the JSON parses, a missing item exits 4."""
    cli.env["MEMSTORE_DATABASE_URL"] = cli.url
    config = MemoryConfig(database_url=cli.url, data_dir=cli.env["MEMSTORE_DATA_DIR"])
    MemstoreStore(user_id=ALICE, config=config).put(("memories",), "k", {"v": "é"})
    assert [i["key"] for i in cli.json("store", "list", "--user", ALICE)["items"]] == ["k"]
    shown = cli.json("store", "show", "--namespace", "memories", "--key", "k", "--user", ALICE)
    assert shown["value"] == {"v": "é"}
    missing = cli("store", "history", "--namespace", "memories", "--key", "nope", "--user", ALICE)
    assert missing.returncode == EXIT_NOTHING_MATCHED and "Traceback" not in missing.stderr
    bad = cli("store", "list", "--user", ALICE, "--tenant", "bad id!")
    assert bad.returncode == EXIT_USAGE and "bad id!" not in bad.stderr


@pytest.mark.postgres
def test_under_row_level_security_the_reads_act_as_the_named_user(
    postgres_url: str, isolated_config: MemoryConfig
) -> None:
    with app_role_url(postgres_url) as app_url:
        isolated_config.database_url = app_url
        MemstoreStore(user_id=ALICE).put(("memories",), "k", {"v": 1})
        MemstoreStore(user_id="bob").put(("memories",), "b", {"v": 2})
        runner = CliRunner()
        listed = runner.invoke(main, ["store", "list", "--user", ALICE, "--json"], catch_exceptions=False)
        assert [i["key"] for i in json.loads(listed.stdout)["items"]] == ["k"]
        history = runner.invoke(
            main, ["store", "history", "--namespace", "memories", "--key", "b", "--user", "bob", "--json"]
        )
        assert history.exit_code == 0 and json.loads(history.stdout)["history"][0]["value"] == {"v": 2}
