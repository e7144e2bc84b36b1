"""``memstore demo``: the quickstart's first command."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import click

from memstore.config import SQL_STORAGE_CLASS, get_memory_config, set_memory_config
from memstore.demo import demo_config, run_demo
from memstore.queue import reset_memory_queue
from memstore.storage import reset_memory_storage


@click.command()
@click.option(
    "--into-configured-database",
    is_flag=True,
    help="Write the sample users into the configured storage instead of a throwaway directory.",
)
def demo(into_configured_database: bool) -> None:
    """Run bundled sample conversations through the pipeline and show the stored memory."""
    if into_configured_database:
        run_demo(click.echo)
        click.echo("")
        click.echo("The sample users (alice, wei) were written to the configured storage.")
        return
    data_dir = Path(tempfile.mkdtemp(prefix="memstore-demo-"))
    set_memory_config(demo_config(get_memory_config(), data_dir))
    reset_memory_storage()
    reset_memory_queue()
    run_demo(click.echo)
    click.echo("")
    click.echo(f"The demo's memory is in {data_dir} (a throwaway SQLite database);")
    click.echo("your configured storage was not touched. To explore it:")
    click.echo(f"  export MEMSTORE_STORAGE_CLASS={SQL_STORAGE_CLASS}")
    click.echo(f"  export MEMSTORE_DATABASE_URL=sqlite:///{data_dir / 'memory.db'}")
    # `make demo` runs .venv/bin/memstore, which is not on PATH: show the command as it was run.
    program = "memstore" if shutil.which("memstore") else sys.argv[0]
    for command in ("show --user alice", "facts list", "facts search Python", "stats"):
        click.echo(f"  {program} {command}")
    click.echo(f"Delete the directory when you are done: rm -r {data_dir}")
