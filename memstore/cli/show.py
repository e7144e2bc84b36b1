"""``memstore show``: one scope's memory, readable or as JSON."""

from __future__ import annotations

import json

import click

from memstore.ops.view import memory_lines
from memstore.storage.loader import get_memory_storage


@click.command()
@click.option("--user", "user_id", required=True, help="User id.")
@click.option("--agent", "agent_name", help="Agent name (default: the user's own memory).")
@click.option("--json", "as_json", is_flag=True, help="Print the memory document as JSON.")
def show(user_id: str, agent_name: str | None, as_json: bool) -> None:
    """Show the memory document of one user (and agent)."""
    memory = get_memory_storage().load(agent_name, user_id=user_id)
    if as_json:
        click.echo(json.dumps(memory, ensure_ascii=False, indent=2))
        return
    scope = user_id if agent_name is None else f"{user_id} / {agent_name}"
    click.echo(f"memory of {scope} (last updated {memory.get('lastUpdated', '?')})")
    for line in memory_lines(memory):
        click.echo(line)
