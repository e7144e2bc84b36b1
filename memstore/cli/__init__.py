"""The ``memstore`` command line: one module per command group, registered here."""

from __future__ import annotations

import logging
import os
from typing import Any, NoReturn

import click
from sqlalchemy.exc import DBAPIError

from memstore import __name__ as _package
from memstore.cli.help import add_help
from memstore.cli.output import CliError
from memstore.config import CONFIG_PATH_ENV, set_memory_config
from memstore.errors import MemstoreError


class _MemstoreGroup(click.Group):
    """Turns memstore's own errors into one line on stderr and exit code 1, not a traceback.

    Every failure leaves as a ``CliError``, so it is shown one way (``output.echo_error``).

    A database error the storage layer did not map (a corrupt SQLite page met by a query, say)
    is one line too, without the SQL. Multi-line messages (a driver's hint, PyYAML's excerpt of
    the file) are cut to their first line; ``-v`` logs the whole message and the traceback.
    """

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except MemstoreError as exc:
            _fail(str(exc), exc)
        except DBAPIError as exc:
            _fail(f"database error: {str(exc.orig).strip() or type(exc.orig).__name__}", exc)
        except click.UsageError:
            raise
        except click.ClickException as exc:
            if isinstance(exc, CliError):
                raise
            raise CliError(exc.format_message()) from exc  # every ClickException exits 1


def _fail(message: str, exc: Exception) -> NoReturn:
    first, *rest = message.strip().splitlines() or [type(exc).__name__]
    logger = logging.getLogger(_package)
    if logger.isEnabledFor(logging.INFO):
        logger.info("%s", message, exc_info=exc)
    elif rest:
        first += " (run with -v for the details)"
    raise CliError(first) from exc


def _set_verbose(ctx: click.Context, _param: click.Parameter, verbose: bool) -> None:
    """Log memstore's own INFO messages to stderr; libraries (Alembic, SQLAlchemy) stay at WARNING."""
    if verbose:
        logging.getLogger(_package).setLevel(logging.INFO)


def _use_config(_ctx: click.Context, _param: click.Parameter, path: str | None) -> None:
    """Point the settings at ``path``; they load when a command first needs them, so a bad file is
    reported like any other memstore error (one line, exit 1)."""
    if path is not None:
        os.environ[CONFIG_PATH_ENV] = path
        set_memory_config(None)


CONFIG = click.Option(
    ["--config"],
    type=click.Path(exists=True, dir_okay=False),
    metavar="PATH",
    expose_value=False,
    is_eager=True,
    callback=_use_config,
    help="YAML settings file (instead of $MEMSTORE_CONFIG); MEMSTORE_* variables still win.",
)
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
@click.version_option(package_name="memstore", message="%(prog)s %(version)s")
def main() -> None:
    """memstore: long-term memory for LLM agent gateways, kept in SQL."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


def _register() -> None:
    """Attach each command module; imported here so ``memstore --help`` lists them all."""
    from memstore.cli.agent_doc_transfer import export_docs, import_docs
    from memstore.cli.agent_docs import agent_doc
    from memstore.cli.backup import backup, restore
    from memstore.cli.config_show import config
    from memstore.cli.db import db
    from memstore.cli.db_partition import partition_command
    from memstore.cli.demo import demo
    from memstore.cli.doctor import doctor
    from memstore.cli.embed import embed
    from memstore.cli.facts import facts
    from memstore.cli.history import history
    from memstore.cli.lifecycle import lifecycle
    from memstore.cli.maintenance import erase, vacuum
    from memstore.cli.mcp import mcp
    from memstore.cli.queue import queue, worker
    from memstore.cli.serve import serve
    from memstore.cli.sessions import sessions
    from memstore.cli.show import show
    from memstore.cli.stats import stats
    from memstore.cli.store_items import store
    from memstore.cli.transfer import export_command, import_command

    agent_doc.add_command(import_docs)
    agent_doc.add_command(export_docs)
    db.add_command(partition_command)
    main.add_command(agent_doc)
    main.add_command(backup)
    main.add_command(config)
    main.add_command(db)
    main.add_command(demo)
    main.add_command(doctor)
    main.add_command(embed)
    main.add_command(erase)
    main.add_command(export_command)
    main.add_command(facts)
    main.add_command(history)
    main.add_command(import_command)
    main.add_command(lifecycle)
    main.add_command(mcp)
    main.add_command(queue)
    main.add_command(restore)
    main.add_command(serve)
    main.add_command(sessions)
    main.add_command(show)
    main.add_command(stats)
    main.add_command(store)
    main.add_command(vacuum)
    main.add_command(worker)
    _add_common_options(main)
    add_help(main)


def _add_common_options(command: click.Command) -> None:
    """``--config`` and ``-v`` on the group and on every subcommand: before or after, both work."""
    command.params.extend((CONFIG, VERBOSE))
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _add_common_options(sub)


_register()
