"""The ``memstore`` command line: one module per command group, registered here."""

from __future__ import annotations

import logging
from typing import Any

import click
from sqlalchemy.exc import DBAPIError

from memstore import __name__ as _package
from memstore.errors import MemstoreError


class _MemstoreGroup(click.Group):
    """Turns memstore's own errors into a one-line message and exit code 1, not a traceback.

    A database error the storage layer did not map (a corrupt SQLite page met by a query, say)
    is one line too: the driver's first line, without the SQL.
    """

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except MemstoreError as exc:
            raise click.ClickException(str(exc)) from exc
        except DBAPIError as exc:
            reason = str(exc.orig).strip().splitlines() or [type(exc.orig).__name__]
            raise click.ClickException(f"database error: {reason[0]}") from exc


def _set_verbose(ctx: click.Context, _param: click.Parameter, verbose: bool) -> None:
    """Log memstore's own INFO messages to stderr; libraries (Alembic, SQLAlchemy) stay at WARNING."""
    if verbose:
        logging.getLogger(_package).setLevel(logging.INFO)


# One option object shared by the group and every subcommand, so -v works before or after them.
VERBOSE = click.Option(
    ["-v", "--verbose"],
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_set_verbose,
    help="Log memstore's INFO messages to stderr.",
)


@click.group(cls=_MemstoreGroup, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """memstore: long-term memory for LLM agent gateways, kept in SQL."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


def _register() -> None:
    """Attach each command module; imported here so ``memstore --help`` lists them all."""
    from memstore.cli.db import db
    from memstore.cli.demo import demo
    from memstore.cli.facts import facts
    from memstore.cli.history import history
    from memstore.cli.maintenance import erase, vacuum
    from memstore.cli.serve import serve
    from memstore.cli.show import show
    from memstore.cli.stats import stats
    from memstore.cli.transfer import export_command, import_command

    main.add_command(db)
    main.add_command(demo)
    main.add_command(erase)
    main.add_command(export_command)
    main.add_command(facts)
    main.add_command(history)
    main.add_command(import_command)
    main.add_command(serve)
    main.add_command(show)
    main.add_command(stats)
    main.add_command(vacuum)
    _add_verbose(main)


def _add_verbose(command: click.Command) -> None:
    command.params.append(VERBOSE)
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _add_verbose(sub)


_register()
