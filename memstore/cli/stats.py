"""``memstore stats``: how much memory is stored, and where."""

from __future__ import annotations

import click

from memstore.cli.output import echo_json, echo_table, human_bytes
from memstore.queries import memory_stats
from memstore.storage.loader import get_memory_storage


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def stats(as_json: bool) -> None:
    """Users, scopes, live facts by category, and the size of the store."""
    storage = get_memory_storage()
    figures = memory_stats(storage=storage)
    if as_json:
        echo_json(figures.to_json())
        return
    click.echo(f"storage: {type(storage).__name__} {getattr(storage, 'url', '')}".rstrip())
    click.echo(f"users: {figures.users}  scopes: {figures.scopes}  facts: {figures.facts}")
    size = "unknown" if figures.database_bytes is None else human_bytes(figures.database_bytes)
    click.echo(f"size on disk: {size}")
    if figures.facts_by_category:
        echo_table(("CATEGORY", "FACTS"), sorted(figures.facts_by_category.items()))
