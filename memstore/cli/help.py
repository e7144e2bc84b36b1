"""``--help`` that reads like the docs: human metavars, and one worked example per command.

Kept in one table rather than in each command so that every command has one (the tests check
that each example parses with its command), and so that a new option gets a readable metavar
without anyone remembering to write one.
"""

from __future__ import annotations

import click

EXAMPLES = {
    "agent-doc edit": "memstore agent-doc edit coder   # /memories/agent.md in $EDITOR",
    "agent-doc erase": "memstore agent-doc erase coder   # asks first; --yes in scripts",
    "agent-doc export": "memstore agent-doc export agents/ --tenant acme",
    "agent-doc history": "memstore agent-doc history coder /memories/agent.md --limit 10",
    "agent-doc import": "memstore agent-doc import .   # in ~/.deepagents: <agent>/agent.md",
    "agent-doc list": "memstore agent-doc list --agent coder",
    "agent-doc show": "memstore agent-doc show coder /memories/agent.md --version 3   # the text on stdout",
    "backup": "memstore backup memstore-2026-11-21.jsonl.gz",
    "config show": "memstore config show --json",
    "db check": "memstore db check --url postgresql://memstore@db.internal/memstore",
    "db current": "memstore db current --url postgresql://memstore@db.internal/memstore",
    "db downgrade": "memstore db downgrade 0005   # lists what it drops; asks if that holds data",
    "db grant-app-role": "memstore db grant-app-role memstore_app --create --password-env APP_DB_PASSWORD",
    "db partition": "memstore db partition --partitions 32 --sql   # the SQL for a DBA (no --sql: runs it)",
    "db heads": "memstore db heads",
    "db history": "memstore db history",
    "db sql": "memstore db sql --dialect postgresql --from 0005 --to head",
    "db stamp": "memstore db stamp head   # the tables are there; their revision was never recorded",
    "db upgrade": "memstore db upgrade",
    "demo": "memstore demo",
    "doctor": "memstore doctor --json",
    "embed": "memstore embed --status",
    "erase": "memstore erase --user alice@example.com   # asks first; --yes in scripts",
    "export": "memstore export backup/ --user alice",
    "facts list": "memstore facts list --user alice --category preference --limit 20",
    "facts search": "memstore facts search 'green tea' --user alice --mode fulltext",
    "facts show": "memstore facts show fact_1a2b3c4d --user alice   # fields, scores, relations both ways",
    "history": "memstore history --user alice --fact fact_1a2b3c4d",
    "import": "memstore import deerflow-memory/ --dry-run",
    "lifecycle run": "memstore lifecycle run --dry-run --below 0.2",
    "mcp": "memstore mcp --user alice   # an MCP client starts this and talks over stdin/stdout",
    "queue purge": "memstore queue purge 12 13   # asks first; --yes in scripts",
    "queue retry": "memstore queue retry 12 13",
    "queue status": "memstore queue status --json",
    "restore": "memstore restore memstore-2026-11-21.jsonl.gz --url postgresql://memstore@db.internal/memstore",
    "serve": "memstore serve --user-header X-Forwarded-User --port 8000",
    "sessions clear": "memstore sessions clear support-42 --user alice   # asks first; --yes in scripts",
    "sessions list": "memstore sessions list --user alice --limit 20",
    "sessions show": "memstore sessions show support-42 --user alice --context --max-tokens 500",
    "store history": "memstore store history --namespace memories.alice --key prefs --user alice",
    "store list": "memstore store list --user alice --namespace memories --limit 20",
    "store show": "memstore store show --namespace memories.alice --key prefs --user alice",
    "show": "memstore show --user alice --agent coder",
    "stats": "memstore stats --json",
    "vacuum": "memstore vacuum --older-than 90   # lists what it purges, asks; --yes in scripts",
    "worker": "memstore worker --workers 4 --metrics-port 9464",
}

# What a string option holds, by its parameter name; any other string option shows its name.
_NAMED = {
    "user_id": "USER",
    "agent_name": "AGENT",
    "fact_id": "FACT_ID",
    "host": "ADDRESS",
    "port": "PORT",
    "metrics_port": "PORT",
    "metrics_host": "ADDRESS",
    "user_header": "HEADER",
    "text": "SUBSTRING",
}


def metavar_for(param: click.Option) -> str | None:
    """A readable placeholder for ``param``'s value, or ``None`` where click's own is already one."""
    name = param.name or ""
    if name in _NAMED:
        return _NAMED[name]
    kind = param.type
    if isinstance(kind, click.Choice | click.Path):
        return None  # [a|b|c] and PATH/DIRECTORY already say what goes there
    if isinstance(kind, click.DateTime):
        return "YYYY-MM-DD[THH:MM:SS[+HHMM]]"  # the formats it accepts, without strftime codes
    if isinstance(kind, click.IntRange) or kind is click.INT:
        return "N"
    if isinstance(kind, click.FloatRange) or kind is click.FLOAT:
        return "NUMBER"
    return name.upper()


def add_help(command: click.Command, path: str = "") -> None:
    """Give ``command`` (and every subcommand) its example and human metavars."""
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            add_help(sub, f"{path} {name}".strip())
        return
    command.epilog = f"\b\nExample:\n  {EXAMPLES[path]}"
    for param in command.params:
        if isinstance(param, click.Option) and not param.is_flag and param.metavar is None:
            param.metavar = metavar_for(param)
