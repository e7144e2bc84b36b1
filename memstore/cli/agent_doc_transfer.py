"""``memstore agent-doc import`` and ``export``: agents' documents in and out of a folder.

The folder has the deepagents layout: ``FOLDER/<agent>/agent.md`` is the agent's
``/memories/agent.md``, and every other file under ``FOLDER/<agent>/`` is the document at the same
relative path (``FOLDER/coder/projects/x.md`` is ``/memories/projects/x.md``). With ``--agent``,
FOLDER is that one agent's folder. Export writes the same layout and import takes every file whose
relative path is a valid document path, so an exported folder imports back unchanged.

An import replaces what is stored (it is the operator's copy, recorded with the author ``import``)
but only over the version it compared with, and checks each file as a write from any other entry
point is checked; it never follows a symbolic link out of FOLDER, descends into hidden folders, or
reads more than a document may hold. An export checks every file it will write before writing
any, and never writes through a symbolic link.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path

import click

from memstore.agent_doc import DOC_ROOT, DocScope, checked_content, checked_path
from memstore.cli.agent_docs import NONE, json_option, scope_of, write_user
from memstore.cli.exit_codes import EXIT_INVALID_ITEMS
from memstore.cli.output import CliError, echo_json, user_id_option
from memstore.cli.params import TENANT_OPTION, agent_name_option
from memstore.config import get_memory_config
from memstore.errors import (
    AgentDocConflictError,
    AgentDocLimitError,
    AgentDocNotFoundError,
    InvalidScopeError,
)
from memstore.ops.agent_docs import doc_summaries, list_docs, read_doc, write_doc
from memstore.ops.view import one_line
from memstore.scope import DEFAULT_TENANT_ID, normalize_agent_name

UNNAMED = ""
"""``--agent ''``: the unnamed agent of a gateway that names none (no ``--agent``: every agent)."""
MAX_BYTES_PER_CHAR = 4
"""UTF-8's widest character: a file larger than this many bytes per allowed character is refused unread."""
BOM = "\ufeff"
"""A byte order mark some editors put at the top of a UTF-8 file: not part of the text."""


def agent_folder_option(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A valid agent name, ``''`` (the unnamed agent), or ``None`` (no ``--agent``)."""
    return value if value in (None, UNNAMED) else agent_name_option(ctx, param, value)


@dataclass
class Report:
    imported: list[tuple[Path, str]] = field(default_factory=list)
    unchanged: list[Path] = field(default_factory=list)
    invalid: list[tuple[Path, str]] = field(default_factory=list)
    skipped: list[tuple[Path, str]] = field(default_factory=list)


@dataclass(frozen=True)
class Source:
    """A file found for an agent: where it is read from, and the document it becomes."""

    file: Path
    agent_name: str | None
    relative: tuple[str, ...]


def discover(folder: Path, agent_name: str | None, *, one_agent: bool, report: Report) -> list[Source]:
    """The files to import, by agent; what is not one goes to ``report``.

    Two folders that name one agent (``Coder`` and ``coder``: agent names ignore case) would
    overwrite each other's documents, so only the first (in code-point order) is imported."""
    if one_agent:
        return _agent_files(folder, agent_name, report)
    found: list[Source] = []
    agents: dict[str | None, Path] = {}
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_symlink() or not entry.is_dir():
            report.skipped.append((entry, "not an agent's folder (FOLDER/<agent>/agent.md)"))
            continue
        try:
            name = normalize_agent_name(entry.name)
        except InvalidScopeError as exc:
            report.invalid.append((entry, str(exc)))
            continue
        if name in agents:
            report.invalid.append(
                (
                    entry,
                    f"the folder {agents[name].name} is agent {name} too (agent names ignore case): "
                    "nothing in this one was imported",
                )
            )
            continue
        agents[name] = entry
        found.extend(_agent_files(entry, name, report))
    return found


def _agent_files(top: Path, agent_name: str | None, report: Report) -> list[Source]:
    found: list[Source] = []
    for here, folders, files in os.walk(top):  # symbolic links to folders are listed, never entered
        base = Path(here)
        for name in sorted(folders):
            if name.startswith(".") or (base / name).is_symlink():
                folders.remove(name)
                if not name.startswith("."):
                    report.skipped.append((base / name, "a symbolic link to a folder (not followed)"))
        folders.sort()
        for name in sorted(files):
            path = base / name
            if not name.startswith("."):  # hidden files are never documents: no path starts with "."
                found.append(Source(path, agent_name, path.relative_to(top).parts))
    return found


def _read(source: Source, root: Path, max_chars: int) -> str:
    """The file's text as it would be stored (without a byte order mark, line endings as ``\n``),
    so a file equal to the stored text is found unchanged; else ``ValueError`` with the reason."""
    target = source.file.resolve()
    if not target.is_relative_to(root.resolve()):
        raise ValueError("a symbolic link out of the folder (not followed)")
    info = target.stat()
    if not stat.S_ISREG(info.st_mode):
        raise ValueError("not a regular file")
    if info.st_size > MAX_BYTES_PER_CHAR * max_chars:
        raise ValueError(f"{info.st_size} bytes: more than a document may hold (agent_doc_max_chars)")
    try:
        text = target.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text (byte {exc.start} is not valid)") from exc
    return checked_content(text.removeprefix(BOM), max_chars=max_chars)


def import_sources(
    sources: list[Source], root: Path, user_id: str | None, tenant_id: str, report: Report
) -> None:
    """Write each file over the version it was compared with (0: none), so a write by an agent
    between the comparison and the import's write is never overwritten unseen."""
    max_chars = get_memory_config().agent_doc_max_chars
    for source in sources:
        scope = DocScope(source.agent_name, user_id, tenant_id)
        try:
            path = checked_path(DOC_ROOT + "/".join(source.relative))
            content = _read(source, root, max_chars)
            try:
                stored = read_doc(scope, path)
            except AgentDocNotFoundError:
                compared = 0
            else:
                if stored.content == content:
                    report.unchanged.append(source.file)
                    continue
                compared = stored.version
            write_doc(scope, path, content, expected_version=compared, author="import")
        except AgentDocConflictError as exc:
            now = "deleted" if exc.current == 0 else f"now version {exc.current}"
            why = f"{exc.path} of {scope.label} changed during the import ({now}): not overwritten"
            report.invalid.append((source.file, why))
            continue
        except (OSError, ValueError, AgentDocLimitError) as exc:  # ValueError: the path and edit errors too
            report.invalid.append((source.file, str(exc)))
            continue
        report.imported.append((source.file, f"{scope.label} {path}"))


@click.command("import")
@click.argument("folder", type=click.Path(exists=True, file_okay=False, path_type=Path))
@TENANT_OPTION
@click.option(
    "--agent",
    "agent_name",
    callback=agent_folder_option,
    help="FOLDER is this agent's own folder (its agent.md at the top), not a folder of agents; "
    "'' is the unnamed agent.",
)
@write_user
@json_option
def import_docs(
    folder: Path, tenant_id: str | None, agent_name: str | None, user_id: str | None, as_json: bool
) -> None:
    """Import FOLDER/<agent>/agent.md and the other files under FOLDER/<agent>/ as each agent's
    /memories/... documents, replacing what is stored (a file equal to it is left unchanged).

    Exits 3 when some files could not be imported (each is listed with the reason; the others
    are imported). Hidden files and folders are ignored; linked folders are skipped.
    """
    report = Report()
    sources = discover(folder, agent_name or None, one_agent=agent_name is not None, report=report)
    import_sources(sources, folder, user_id, tenant_id or DEFAULT_TENANT_ID, report)
    if as_json:
        echo_json(
            {
                "imported": [{"file": str(path), "document": doc} for path, doc in report.imported],
                "unchanged": [str(path) for path in report.unchanged],
                "invalid": [{"file": str(path), "reason": reason} for path, reason in report.invalid],
                "skipped": [{"file": str(path), "reason": reason} for path, reason in report.skipped],
            }
        )
    else:
        click.echo(
            f"imported: {len(report.imported)}  unchanged: {len(report.unchanged)}  "
            f"invalid: {len(report.invalid)}  skipped: {len(report.skipped)}"
        )
        for kind, items in (("invalid", report.invalid), ("skipped", report.skipped)):
            for path, reason in items:
                click.echo(f"  {kind} {one_line(str(path))}: {one_line(reason)}")
    if report.invalid:
        sys.exit(EXIT_INVALID_ITEMS)


@dataclass(frozen=True)
class Target:
    """A document to export and the file it becomes, as names below FOLDER."""

    scope: DocScope
    path: str
    relative: tuple[str, ...]


def _refused(why: str) -> CliError:
    return CliError(f"{why}: nothing was written")


def _check_names(folder: Path, targets: list[Target]) -> None:
    """Refuse targets one folder cannot hold apart: the same name but for case (a case-insensitive
    file system makes them one file), or a file where another needs a folder."""
    files: dict[tuple[str, ...], Target] = {}
    for target in targets:
        key = tuple(name.casefold() for name in target.relative)
        if key in files:
            first = folder.joinpath(*files[key].relative)
            raise _refused(
                f"{one_line(str(first))} and {one_line(str(folder.joinpath(*target.relative)))} differ "
                "only in case (one file where case is ignored)"
            )
        files[key] = target
    for key, target in files.items():
        for depth in range(1, len(key)):
            if key[:depth] in files:
                file = folder.joinpath(*files[key[:depth]].relative)
                raise _refused(
                    f"{one_line(str(file))} would be a file and the folder of "
                    f"{one_line(str(folder.joinpath(*target.relative)))}"
                )


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return path.lstat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CliError(f"cannot check {one_line(str(path))}: {exc.strerror or exc}") from exc


def _check_disk(folder: Path, targets: list[Target], *, force: bool) -> None:
    """Refuse a symbolic link or a file where a folder below FOLDER must be, a folder where a file
    must be, and (unless ``force``) any file already there."""
    there: list[Path] = []
    for target in targets:
        place = folder
        for name in target.relative[:-1]:
            place = place / name
            info = _lstat(place)
            if info is None:
                break
            if stat.S_ISLNK(info.st_mode):
                raise _refused(f"{one_line(str(place))} is a symbolic link (export never writes through one)")
            if not stat.S_ISDIR(info.st_mode):
                raise _refused(f"{one_line(str(place))} is there and is not a folder")
        else:
            place = place / target.relative[-1]
            info = _lstat(place)
            if info is not None and stat.S_ISDIR(info.st_mode):
                raise _refused(f"{one_line(str(place))} is a folder")
            if info is not None:
                there.append(place)
    if there and not force:
        raise _refused(
            f"{len(there)} file(s) to export are already there, the first {one_line(str(there[0]))} "
            "(pass --force to overwrite them)"
        )


def _write(folder: Path, relative: tuple[str, ...], content: str) -> None:
    """Write the file whole or not at all: a private temporary file beside it, renamed over it (a
    symbolic link there is replaced, never written through). Each folder below FOLDER is opened
    without following links, so one swapped in after the checks is refused too."""
    here = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in relative[:-1]:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o700, dir_fd=here)
            inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=here)
            os.close(here)
            here = inner
        temporary = f".{relative[-1]}.{secrets.token_hex(6)}.tmp"  # hidden: no document's name
        handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=here)
        try:
            with os.fdopen(handle, "wb") as file:
                file.write(content.encode("utf-8"))
            os.replace(temporary, relative[-1], src_dir_fd=here, dst_dir_fd=here)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=here)
            raise
    finally:
        os.close(here)


@click.command("export")
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path))
@TENANT_OPTION
@click.option(
    "--agent",
    "agent_name",
    callback=agent_folder_option,
    help="Export only this agent, into FOLDER itself (its agent.md at the top); '' is the unnamed agent.",
)
@click.option(
    "--user",
    "user_id",
    callback=user_id_option,
    help="Export this user's own documents of the agents instead of the agents' own.",
)
@click.option("--force", is_flag=True, help="Overwrite files that are already there.")
@json_option
def export_docs(
    folder: Path,
    tenant_id: str | None,
    agent_name: str | None,
    user_id: str | None,
    force: bool,
    as_json: bool,
) -> None:
    """Write the agents' documents to FOLDER/<agent>/... in the layout `agent-doc import` reads.

    Checks every file first and writes nothing when one is already there (unless --force), when a
    symbolic link or a file is where a folder must be, or when two documents would be one file
    (names that differ only in case, a document named like another's folder). Each file is
    written whole, readable by you only. The unnamed agent (of a gateway that names none) has no
    folder name: export it with --agent '' (FOLDER is then its folder).
    """
    tenant = tenant_id or DEFAULT_TENANT_ID
    agents: list[tuple[DocScope, tuple[str, ...]]]
    if agent_name is not None:
        agents = [(scope_of(agent_name or None, user_id, tenant), ())]
    else:
        agents = []
        for summary in doc_summaries(tenant):
            if summary.user_id != user_id:
                continue
            if summary.agent_name is None:
                click.echo(f"not exported: the unnamed agent {NONE} (export it with --agent '')", err=True)
                continue
            agents.append((scope_of(summary.agent_name, user_id, tenant), (summary.agent_name,)))
    targets = [
        Target(scope, doc.path, (*base, *doc.path.removeprefix(DOC_ROOT).split("/")))
        for scope, base in agents
        for doc in list_docs(scope)
    ]
    _check_names(folder, targets)
    _check_disk(folder, targets, force=force)
    written: list[Path] = []
    if targets:
        try:
            folder.mkdir(0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise CliError(f"cannot create {one_line(str(folder))}: {exc.strerror or exc}") from exc
    for target in targets:  # one document's text in memory at a time
        try:
            content = read_doc(target.scope, target.path).content or ""
        except AgentDocNotFoundError:
            click.echo(f"not exported: {target.path} of {target.scope.label} was deleted meanwhile", err=True)
            continue
        file = folder.joinpath(*target.relative)
        try:
            _write(folder, target.relative, content)
        except OSError as exc:
            raise CliError(
                f"cannot write {one_line(str(file))}: {exc.strerror or exc} "
                f"({len(written)} file(s) were written before it)"
            ) from exc
        written.append(file)
    if as_json:
        echo_json({"folder": str(folder), "files": [str(path) for path in written]})
    else:
        click.echo(f"exported {len(written)} document(s) of {len(agents)} agent(s) to {folder}")
