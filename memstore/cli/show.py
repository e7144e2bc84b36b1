"""``memstore show``: one scope's memory, readable or as JSON."""

from __future__ import annotations

import json

import click

from memstore.cli.exit_codes import EXIT_NOTHING_MATCHED
from memstore.cli.output import user_id_option
from memstore.cli.params import TENANT_OPTION, agent_name_option
from memstore.ops.view import memory_lines
from memstore.queries import operations_of
from memstore.scope import resolve_scope
from memstore.storage.loader import get_memory_storage


@click.command()
@click.option("--user", "user_id", callback=user_id_option, required=True, help="User id.")
@click.option(
    "--agent", "agent_name", callback=agent_name_option, help="Agent name (default: the user's own memory)."
)
@TENANT_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print the memory document as JSON.")
def show(user_id: str, agent_name: str | None, tenant_id: str | None, as_json: bool) -> None:
    """Show the memory document of one user (and agent).

    Exits with 4 and a message on stderr when nothing is stored for that scope, so a mistyped id
    is not mistaken for a user whose memory is empty.
    """
    storage = get_memory_storage().for_identity(tenant_id)
    scope = resolve_scope(agent_name, user_id)
    if scope not in operations_of(storage).list_scopes(scope[0]):
        label = user_id if agent_name is None else f"{user_id} / agent {scope[1]}"
        click.echo(f"nothing is stored for {label}", err=True)
        raise SystemExit(EXIT_NOTHING_MATCHED)
    memory = storage.load(agent_name, user_id=user_id)
    if as_json:
        click.echo(json.dumps(memory, ensure_ascii=False, indent=2))
        return
    label = user_id if agent_name is None else f"{user_id} / {agent_name}"
    click.echo(f"memory of {label} (last updated {memory.get('lastUpdated', '?')})")
    for line in memory_lines(memory):
        click.echo(line)
