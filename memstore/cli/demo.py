"""``memstore demo``: the quickstart's first command."""

from __future__ import annotations

import click

from memstore.demo import run_demo


@click.command()
def demo() -> None:
    """Run bundled sample conversations through the pipeline and show the stored memory."""
    run_demo(click.echo)
