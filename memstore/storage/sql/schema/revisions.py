"""The shipped head revision and a database's revision, known without importing Alembic.

Every storage start asks whether its database is at head. Alembic's answer (``ScriptDirectory``,
``MigrationContext``) cost about 0.2 s of imports per process (Mako, Pygments, every DDL dialect),
paid by each CLI command and subprocess although a database at head runs no migration. The
revision scripts are plain files of one linear chain, so reading their ``revision`` and
``down_revision`` lines finds the head; anything this reading does not understand (a merge, a
branch, a file without those lines) answers ``None`` and the caller asks Alembic, whose errors
then name the problem. ``tests/integration/test_migrations.py`` holds the two answers equal.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from sqlalchemy import Connection, String, column, inspect, select, table

from memstore.errors import MigrationError

VERSION_TABLE = "alembic_version"
"""Alembic's default version table; ``alembic/env.py`` keeps the default name and schema."""

_REVISION = re.compile(r"""^revision\s*(?::[^=]*)?=\s*["']([^"']+)["']\s*$""", re.MULTILINE)
_DOWN_REVISION = re.compile(
    r"""^down_revision\s*(?::[^=]*)?=\s*(?:["']([^"']+)["']|None)\s*$""", re.MULTILINE
)
_SCRIPT = re.compile(r"^(?!\.#|__init__).*\.py$")
"""The files Alembic loads as revisions (its ``_only_source_rev_file``, without compiled ones)."""


@functools.cache
def scanned_head(versions: Path) -> str | None:
    """The head of the linear chain in ``versions``, or ``None`` when only Alembic can tell.

    Each script must hold exactly one ``revision = "..."`` line and one ``down_revision`` line
    naming a string or ``None``, every ``down_revision`` a revision of the chain, and exactly one
    revision no script names as its ``down_revision``.
    """
    if not versions.is_dir():
        return None
    parents: dict[str, str | None] = {}
    for script in versions.iterdir():
        if not _SCRIPT.match(script.name) or not script.is_file():
            continue
        source = script.read_text(encoding="utf-8")
        revisions, downs = _REVISION.findall(source), list(_DOWN_REVISION.finditer(source))
        if len(revisions) != 1 or len(downs) != 1 or revisions[0] in parents:
            return None
        parents[revisions[0]] = downs[0].group(1)
    named = {parent for parent in parents.values() if parent is not None}
    if not named <= parents.keys() or list(parents.values()).count(None) != 1:
        return None
    heads = parents.keys() - named
    return next(iter(heads)) if len(heads) == 1 else None


def stored_revision(connection: Connection) -> str | None:
    """The revision recorded in the database's version table; ``None`` when it has none.

    What ``MigrationContext.get_current_revision`` reads, by the same two questions: is the
    table there (the inspector, so a failing statement never aborts a PostgreSQL transaction),
    and what does its one row say.
    """
    if not inspect(connection).has_table(VERSION_TABLE):
        return None
    query = select(column("version_num", String)).select_from(table(VERSION_TABLE))
    found = list(connection.execute(query).scalars())
    if len(found) > 1:
        raise MigrationError(f"version table {VERSION_TABLE!r} has more than one revision: {sorted(found)}")
    return found[0] if found else None
