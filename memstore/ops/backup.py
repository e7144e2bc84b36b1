"""Lossless backup and restore of a whole SQL database, across dialects (``memstore backup``/``restore``).

Unlike export/import (DeerFlow documents, one per scope, re-saved through the storage, so
revisions, ``lastUpdated``, retention signals, vectors and audit history start afresh), a backup
copies the rows of every memory table with their ids (``memstore.storage.sql.maintenance.backup``).

The file is gzip-compressed JSON Lines: a header line (format, schema revision, each table's
columns and row count), then each table's rows in backup order, one JSON array a line. Backup
reads one consistent snapshot and streams it; restore streams the file into one transaction, so
memory use is bounded by a batch of rows whatever the database's size, and a restore that fails
(a truncated file, a refused row) leaves the target as it was.
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import IO, Any

from memstore.config import get_memory_config
from memstore.errors import BackupError
from memstore.storage.loader import load_storage_class
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import get_engine, mask_url, operator_url_from_config
from memstore.storage.sql.maintenance.backup import (
    BACKUP_TABLES,
    BATCH_ROWS,
    column_names,
    count_rows,
    delete_all,
    dump_rows,
    insert_rows,
    queued_conversations,
    read_snapshot,
    reset_sequences,
    write_transaction,
)
from memstore.storage.sql.schema import migrate

FORMAT = "memstore-backup"
FORMAT_VERSION = 1
COMPRESS_LEVEL = 6
"""gzip's default 9 takes twice the time for a file a few per cent smaller."""

Progress = Callable[[int], None]
"""Told how many rows were just written."""
Start = Callable[[int], Progress]
"""Told how many rows there are in all, once known; returns what follows the progress."""


@dataclass(frozen=True)
class BackupHeader:
    """What the first line of a backup says about the rest."""

    schema_revision: str
    source_dialect: str
    created_at: str
    memstore_version: str
    columns: dict[str, list[str]]
    rows: dict[str, int]

    def as_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "schema_revision": self.schema_revision,
            "source_dialect": self.source_dialect,
            "created_at": self.created_at,
            "memstore_version": self.memstore_version,
            "tables": {name: {"columns": self.columns[name], "rows": self.rows[name]} for name in self.rows},
        }


@dataclass(frozen=True)
class BackupReport:
    header: BackupHeader
    queued: int
    """Conversations still in the durable queue (pending, leased or dead): not in the backup."""


@dataclass(frozen=True)
class RestoreReport:
    header: BackupHeader
    replaced: dict[str, int]
    """Rows the target held and the restore deleted first (empty unless it held memory)."""


def database_url(url: str | None) -> str:
    """``url``, else the configured provider's database as the operator reaches it (every tenant's
    rows: ``operator_database_url`` when set); the file provider keeps none to back up."""
    if url:
        return url
    config = get_memory_config()
    if not issubclass(load_storage_class(config.storage_class), SqlMemoryStorage):
        raise BackupError(
            f"the configured storage_class {config.storage_class} keeps no database: copy its "
            "data_dir instead (or pass --url to back up a database)"
        )
    return operator_url_from_config(config)


def backup_database(url: str, path: Path, *, on_start: Start | None = None) -> BackupReport:
    """Write every memory row of ``url`` to ``path``; the file appears only once it is complete."""
    _require_head(url)
    engine = get_engine(url)
    with read_snapshot(engine) as conn:
        header = BackupHeader(
            schema_revision=migrate.head(),
            source_dialect=engine.dialect.name,
            created_at=datetime.now(UTC).isoformat(),
            memstore_version=version("memstore"),
            columns={table.name: column_names(table) for table in BACKUP_TABLES},
            rows=count_rows(conn),
        )
        queued = queued_conversations(conn)
        on_rows = on_start(sum(header.rows.values())) if on_start is not None else None
        with _replacing(path) as out:
            out.write(json.dumps(header.as_json()) + "\n")
            for table in BACKUP_TABLES:
                for row in _counted(dump_rows(conn, table), on_rows):
                    out.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")
    return BackupReport(header, queued)


def read_header(path: Path) -> BackupHeader:
    """The backup's header, checked against this memstore; nothing else of the file is read."""
    with _reading(path) as lines:
        return _header(next(lines, ""), path)


def held_rows(url: str) -> dict[str, int]:
    """Rows per memory table in ``url``, migrating an embedded SQLite file (as the storage would)."""
    engine = get_engine(url)
    migrate.prepare_database(engine, auto_migrate=get_memory_config().auto_migrate)
    with read_snapshot(engine) as conn:
        return count_rows(conn)


def restore_database(
    url: str, path: Path, *, replace: bool = False, on_start: Start | None = None
) -> RestoreReport:
    """Load ``path`` into ``url`` in one transaction; a database holding memory needs ``replace``."""
    engine = get_engine(url)
    migrate.prepare_database(engine, auto_migrate=get_memory_config().auto_migrate)
    with _reading(path) as lines:
        header = _header(next(lines, ""), path)
        with write_transaction(engine) as conn:
            held = count_rows(conn)
            if any(held.values()) and not replace:
                raise BackupError(not_empty_message(url, held))
            if any(held.values()):
                delete_all(conn)
            on_rows = on_start(sum(header.rows.values())) if on_start is not None else None
            for table in BACKUP_TABLES:
                rows = _rows(lines, table.name, header.rows[table.name])
                insert_rows(conn, table, header.columns[table.name], _counted(rows, on_rows))
            if next(lines, None) is not None:
                raise BackupError(f"{path} has data after its last table: it is not a memstore backup")
            reset_sequences(conn)
    return RestoreReport(header, held if any(held.values()) else {})


def not_empty_message(url: str, held: dict[str, int]) -> str:
    listed = ", ".join(f"{name}: {count}" for name, count in held.items() if count)
    return (
        f"{mask_url(url)} already holds memory ({listed}): restore into an empty database, "
        "or pass --replace to delete what it holds first"
    )


def _require_head(url: str) -> None:
    found, head = migrate.current(url), migrate.head()
    where = mask_url(url)
    if found is None:
        raise BackupError(f"{where} holds no memstore schema: nothing to back up")
    if found not in {script.revision for script in migrate.history()}:
        raise BackupError(f"{where} is at schema revision {found}, newer than this memstore's {head}")
    if found != head:
        raise BackupError(f"{where} is at schema revision {found}, head is {head}: run `memstore db upgrade`")


def _header(line: str, path: Path) -> BackupHeader:
    try:
        raw = json.loads(line)
    except json.JSONDecodeError:
        raw = None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise BackupError(f"{path} is not a memstore backup")
    if raw.get("format_version") != FORMAT_VERSION:
        raise BackupError(f"{path} is in backup format {raw.get('format_version')}; this memstore reads 1")
    head = migrate.head()
    if raw.get("schema_revision") != head:
        raise BackupError(
            f"{path} holds schema revision {raw.get('schema_revision')} and this memstore restores "
            f"{head}: restore it with memstore {raw.get('memstore_version')}, which made it"
        )
    try:
        tables = raw["tables"]
        return BackupHeader(
            schema_revision=head,
            source_dialect=str(raw["source_dialect"]),
            created_at=str(raw["created_at"]),
            memstore_version=str(raw["memstore_version"]),
            columns={table.name: list(tables[table.name]["columns"]) for table in BACKUP_TABLES},
            rows={table.name: int(tables[table.name]["rows"]) for table in BACKUP_TABLES},
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise BackupError(f"{path} has a malformed header ({exc!r})") from exc


def _rows(lines: Iterator[str], table: str, expected: int) -> Iterator[list[Any]]:
    """Exactly ``expected`` rows of ``table``; a file that ends sooner is truncated."""
    for index in range(1, expected + 1):
        line = next(lines, None)
        if line is None:
            raise BackupError(
                f"the backup ends after {index - 1} of {expected} rows of {table}: it is truncated"
            )
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BackupError(f"row {index} of {table} in the backup is not valid JSON: {exc}") from exc
        if not isinstance(row, list):
            raise BackupError(f"row {index} of {table} in the backup is not a list of values")
        yield row


def _counted(rows: Iterator[list[Any]], on_rows: Progress | None) -> Iterator[list[Any]]:
    """``rows``, reporting progress once a batch rather than once a row (a bar redraw costs)."""
    count = 0
    for row in rows:
        yield row
        count += 1
        if on_rows is not None and count % BATCH_ROWS == 0:
            on_rows(BATCH_ROWS)
    if on_rows is not None and count % BATCH_ROWS:
        on_rows(count % BATCH_ROWS)


@contextmanager
def _reading(path: Path) -> Iterator[Iterator[str]]:
    """The backup's lines, decompressed as they are read; a damaged file is a ``BackupError``."""
    try:
        raw = path.open("rb")
    except OSError as exc:
        raise BackupError(f"cannot read {path}: {exc.strerror or exc}") from exc
    with raw, gzip.open(raw, "rt", encoding="utf-8") as file:
        yield _lines(file, path)


def _lines(file: IO[str], path: Path) -> Iterator[str]:
    try:
        yield from file
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as exc:  # BadGzipFile is an OSError
        raise BackupError(f"{path} is damaged or not a memstore backup: {exc}") from exc


@contextmanager
def _replacing(path: Path) -> Iterator[IO[str]]:
    """A gzip text stream that becomes ``path`` only when complete; readable by the owner alone
    (it holds every user's memory). A failed backup leaves ``path`` as it was."""
    directory = path.resolve().parent
    try:
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=directory)
    except OSError as exc:
        raise BackupError(f"cannot write in {directory}: {exc.strerror or exc}") from exc
    try:
        with (
            os.fdopen(handle, "wb") as raw,
            gzip.open(raw, "wt", encoding="utf-8", compresslevel=COMPRESS_LEVEL) as out,
        ):
            yield out
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
