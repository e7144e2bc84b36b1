"""The ``memstore`` command line: one module per command group, imported when its command runs.

``memstore.cli.commands`` names each command's module; this module imports click and nothing
else heavy, so ``memstore --version`` and ``memstore --help`` start in a few hundredths of a second.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, NoReturn

import click

from memstore.cli.commands import COMMANDS, LazyCommands
from memstore.cli.help import add_help
from memstore.errors import MemstoreError

_PACKAGE = "memstore"


class _MemstoreGroup(click.Group):
    """Turns memstore's own errors into one line on stderr and exit code 1, not a traceback.

    Every failure leaves as a ``CliError``, so it is shown one way (``output.echo_error``).

    A database error the storage layer did not map (a corrupt SQLite page met by a query, say)
    is one line too, without the SQL. Multi-line messages (a driver's hint, PyYAML's excerpt of
    the file) are cut to their first line; ``-v`` logs the whole message and the traceback.
    """

    def invoke(self, ctx: click.Context) -> Any:
        from memstore.cli.output import CliError

        try:
            return super().invoke(ctx)
        except MemstoreError as exc:
            _fail(str(exc), exc)
        except click.UsageError:
            raise
        except click.ClickException as exc:
            if isinstance(exc, CliError):
                raise
            raise CliError(exc.format_message()) from exc  # every ClickException exits 1
        except Exception as exc:
            message = _database_error(exc)
            if message is None:
                raise
            _fail(message, exc)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Click's list of commands, taking an unloaded command's line from the dispatch table."""
        commands = self.commands
        if not isinstance(commands, LazyCommands):
            super().format_commands(ctx, formatter)
            return
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(map(len, names), default=0)
        rows = []
        for name in names:
            text = commands.lazy_help(name)
            command = self.get_command(ctx, name) if text is None else click.Command(name, help=text)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _database_error(exc: Exception) -> str | None:
    """The one line for a database error the storage layer did not map, or ``None``.

    Without SQLAlchemy imported (``memstore config show``, say) no database was touched, so the
    check imports nothing.
    """
    if "sqlalchemy" not in sys.modules:
        return None
    from sqlalchemy.exc import DBAPIError

    if not isinstance(exc, DBAPIError):
        return None
    return f"database error: {str(exc.orig).strip() or type(exc.orig).__name__}"


def _fail(message: str, exc: Exception) -> NoReturn:
    from memstore.cli.output import CliError

    first, *rest = message.strip().splitlines() or [type(exc).__name__]
    logger = logging.getLogger(_PACKAGE)
    if logger.isEnabledFor(logging.INFO):
        logger.info("%s", message, exc_info=exc)
    elif rest:
        first += " (run with -v for the details)"
    raise CliError(first) from exc


def _set_verbose(ctx: click.Context, _param: click.Parameter, verbose: bool) -> None:
    """Log memstore's own INFO messages to stderr; libraries (Alembic, SQLAlchemy) stay at WARNING."""
    if verbose:
        logging.getLogger(_PACKAGE).setLevel(logging.INFO)


def _use_config(_ctx: click.Context, _param: click.Parameter, path: str | None) -> None:
    """Point the settings at ``path``; they load when a command first needs them, so a bad file is
    reported like any other memstore error (one line, exit 1)."""
    if path is not None:
        from memstore.config import CONFIG_PATH_ENV, set_memory_config

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


def _prepare(name: str, command: click.Command) -> None:
    """Ready a command as it loads: ``--config`` and ``-v`` on it (and its subcommands), and its
    ``--help`` example and metavars."""
    _add_common_options(command)
    add_help(command, name)


@click.group(
    cls=_MemstoreGroup,
    commands=LazyCommands(COMMANDS, _prepare),
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(package_name="memstore", message="%(prog)s %(version)s")
def main() -> None:
    """memstore: long-term memory for LLM agent gateways, kept in SQL."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


def _add_common_options(command: click.Command) -> None:
    """``--config`` and ``-v`` on the group and on every subcommand: before or after, both work."""
    command.params.extend((CONFIG, VERBOSE))
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _add_common_options(sub)


main.params.extend((CONFIG, VERBOSE))
