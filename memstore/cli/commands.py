"""The ``memstore`` commands as a dispatch table: module names, imported only when a command runs.

``memstore --version`` used to import every command module, and with them SQLAlchemy, Alembic,
numpy, pydantic and the LLM clients, before it printed one line (1.2-3.0 s). Now the group holds
a ``LazyCommands`` mapping: ``memstore db upgrade`` imports ``memstore.cli.db`` and what it
uses, nothing else. ``--help`` lists each command with the one-line help kept in this table, so
it imports no command at all; ``tests/unit/test_cli_imports.py`` checks that each line is the
command's own, so the two cannot drift.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass

import click


@dataclass(frozen=True)
class LazyCommand:
    """Where a command lives, what ``memstore --help`` says of it, and subcommands kept elsewhere."""

    module: str
    attribute: str
    help: str
    # (module, attribute) of subcommands a group gets from other modules when it loads.
    subcommands: tuple[tuple[str, str], ...] = ()

    def load(self) -> click.Command:
        command = getattr(importlib.import_module(self.module), self.attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{self.module}.{self.attribute} is not a click command")
        if isinstance(command, click.Group):
            for module, attribute in self.subcommands:
                command.add_command(getattr(importlib.import_module(module), attribute))
        return command


def _cli(module: str) -> str:
    return f"memstore.cli.{module}"


COMMANDS: dict[str, LazyCommand] = {
    "agent-doc": LazyCommand(
        _cli("agent_docs"),
        "agent_doc",
        "List, show, edit, import, export, audit or erase the agents' own memory documents "
        "(/memories/agent.md and the others an agent keeps).",
        ((_cli("agent_doc_transfer"), "import_docs"), (_cli("agent_doc_transfer"), "export_docs")),
    ),
    "backup": LazyCommand(
        _cli("backup"),
        "backup",
        "Copy every memory row of the database into FILE (gzip-compressed JSON Lines).",
    ),
    "config": LazyCommand(_cli("config_show"), "config", "Inspect the settings memstore runs with."),
    "db": LazyCommand(
        _cli("db"),
        "db",
        "Create, migrate and check the memstore schema (upgrade, downgrade, current, check, stamp, ...).",
        ((_cli("db_partition"), "partition_command"),),
    ),
    "demo": LazyCommand(
        _cli("demo"),
        "demo",
        "Run bundled sample conversations through the pipeline and show the stored memory.",
    ),
    "doctor": LazyCommand(
        _cli("doctor"),
        "doctor",
        "Check the database URL, schema, queue, LLM and embeddings endpoints and token encoding.",
    ),
    "embed": LazyCommand(
        _cli("embed"),
        "embed",
        "Embed live facts with the configured embedding_provider, with a progress bar.",
    ),
    "erase": LazyCommand(
        _cli("maintenance"),
        "erase",
        "Delete every row of a user: all scopes, facts, summaries and audit history.",
    ),
    "export": LazyCommand(
        _cli("transfer"),
        "export_command",
        "Write stored memory to DESTINATION in the tree layout ``memstore import`` reads.",
    ),
    "facts": LazyCommand(_cli("facts"), "facts", "List, search or show facts across users and agents."),
    "history": LazyCommand(
        _cli("history"),
        "history",
        "Every change to the user's facts and summaries: when, which revision, by whom, before and after.",
    ),
    "import": LazyCommand(
        _cli("transfer"),
        "import_command",
        "Import PATH: a memory tree (users/<u>/[agents/<a>/]memory.json, legacy files) or one JSON file.",
    ),
    "lifecycle": LazyCommand(
        _cli("lifecycle"), "lifecycle", "Memory lifecycle: expiry by decay score (see docs/operations.md)."
    ),
    "mcp": LazyCommand(
        _cli("mcp"),
        "mcp",
        "Serve the memory tools over MCP (needs the 'mcp' extra): memory_search, memory_add, "
        "memory_update, memory_delete, memory_context, the session_* tools and the agent's memory "
        "files (memory_ls, memory_read_file, memory_write_file, memory_edit_file, memory_delete_file).",
    ),
    "queue": LazyCommand(_cli("queue"), "queue", "The durable update queue: status, and dead conversations."),
    "restore": LazyCommand(
        _cli("backup"),
        "restore",
        "Load a backup made by ``memstore backup`` into the database, exactly as it was.",
    ),
    "serve": LazyCommand(
        _cli("serve"), "serve", "Serve the /api/memory endpoints over HTTP (needs the 'server' extra)."
    ),
    "sessions": LazyCommand(
        _cli("sessions"),
        "sessions",
        "List, show or clear users' short-term session memory (the recent turns of a conversation).",
    ),
    "show": LazyCommand(_cli("show"), "show", "Show the memory document of one user (and agent)."),
    "stats": LazyCommand(
        _cli("stats"), "stats", "Users, scopes, live facts by category, and the size of the store."
    ),
    "store": LazyCommand(
        _cli("store_items"),
        "store",
        "List and show the items LangGraph graphs keep through MemstoreStore, and their history.",
    ),
    "vacuum": LazyCommand(
        _cli("maintenance"),
        "vacuum",
        "Purge old audit history, tombstones of deleted facts and erasure records.",
    ),
    "worker": LazyCommand(
        _cli("queue"), "worker", "Run queue workers without a gateway, until SIGTERM or Ctrl-C."
    ),
}


class LazyCommands(MutableMapping[str, click.Command]):
    """A group's commands: every name of ``table`` is listed, and loaded on first lookup.

    Click reads a group's commands through this mapping (``get_command``, ``list_commands``), so
    a lookup imports one module; iterating names imports none. ``prepare(name, command)`` runs
    once per loaded command (the shared options and the ``--help`` example go on there).
    """

    def __init__(self, table: dict[str, LazyCommand], prepare: Callable[[str, click.Command], None]) -> None:
        self._table = table
        self._prepare = prepare
        self._loaded: dict[str, click.Command] = {}

    def lazy_help(self, name: str) -> str | None:
        """The table's one-line help for a command not loaded yet (``None`` once it is)."""
        entry = self._table.get(name)
        return None if entry is None or name in self._loaded else entry.help

    def __getitem__(self, name: str) -> click.Command:
        command = self._loaded.get(name)
        if command is None:
            command = self._table[name].load()
            self._prepare(name, command)
            self._loaded[name] = command
        return command

    def __setitem__(self, name: str, command: click.Command) -> None:
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        if name not in self._loaded and name not in self._table:
            raise KeyError(name)
        self._loaded.pop(name, None)
        self._table = {key: value for key, value in self._table.items() if key != name}

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys([*self._table, *self._loaded]))

    def __len__(self) -> int:
        return len(set(self._table) | set(self._loaded))

    def __contains__(self, name: object) -> bool:
        return name in self._table or name in self._loaded
