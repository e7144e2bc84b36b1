"""``memstore agent-doc import`` and ``export``: agents' documents in and out of a folder.

The folder has the deepagents layout: ``FOLDER/<agent>/agent.md`` is the agent's
``/memories/agent.md``, and every other ``.md`` file under ``FOLDER/<agent>/`` is the document at
the same relative path (``FOLDER/coder/projects/x.md`` is ``/memories/projects/x.md``). With
``--agent``, FOLDER is that one agent's folder. Export writes the same layout, so an exported
folder imports back unchanged.

An import overwrites what is stored (it is the operator's copy, recorded with the author
``import``) and checks each file as a write from any other entry point is checked; it never
follows a symbolic link out of FOLDER, descends into hidden folders, or reads more than a document
may hold.
"""

from __future__ import annotations

import os
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path

import click

from memstore.agent_doc import DOC_ROOT, DocScope, checked_path
from memstore.cli.agent_docs import NONE, json_option, scope_of, write_user
from memstore.cli.exit_codes import EXIT_INVALID_ITEMS
from memstore.cli.output import CliError, echo_json, user_id_option
from memstore.cli.params import TENANT_OPTION, agent_name_option
from memstore.config import get_memory_config
from memstore.errors import AgentDocLimitError, AgentDocNotFoundError, InvalidScopeError
from memstore.ops.agent_docs import doc_summaries, list_docs, read_doc, write_doc
from memstore.ops.view import one_line
from memstore.scope import DEFAULT_TENANT_ID, normalize_agent_name

MARKDOWN = ".md"
UNNAMED = ""
"""``--agent ''``: the unnamed agent of a gateway that names none (no ``--agent``: every agent)."""
MAX_BYTES_PER_CHAR = 4
"""UTF-8's widest character: a file larger than this many bytes per allowed character is refused unread."""


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
    """A Markdown file found for an agent: where it is read from, and the document it becomes."""

    file: Path
    agent_name: str | None
    relative: tuple[str, ...]


def discover(folder: Path, agent_name: str | None, *, one_agent: bool, report: Report) -> list[Source]:
    """The Markdown files to import, by agent; what is not one goes to ``report``."""
    if one_agent:
        return _agent_files(folder, agent_name, report)
    found: list[Source] = []
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
            if name.startswith("."):
                continue
            if not name.endswith(MARKDOWN):
                report.skipped.append((path, "not a Markdown (.md) file"))
                continue
            found.append(Source(path, agent_name, path.relative_to(top).parts))
    return found


def _read(source: Source, root: Path, max_chars: int) -> str:
    """The file's text, or ``ValueError`` with the reason it cannot be a document."""
    target = source.file.resolve()
    if not target.is_relative_to(root.resolve()):
        raise ValueError("a symbolic link out of the folder (not followed)")
    info = target.stat()
    if not stat.S_ISREG(info.st_mode):
        raise ValueError("not a regular file")
    if info.st_size > MAX_BYTES_PER_CHAR * max_chars:
        raise ValueError(f"{info.st_size} bytes: more than a document may hold (agent_doc_max_chars)")
    try:
        return target.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text (byte {exc.start} is not valid)") from exc


def import_sources(
    sources: list[Source], root: Path, user_id: str | None, tenant_id: str, report: Report
) -> None:
    max_chars = get_memory_config().agent_doc_max_chars
    for source in sources:
        scope = DocScope(source.agent_name, user_id, tenant_id)
        try:
            path = checked_path(DOC_ROOT + "/".join(source.relative))
            content = _read(source, root, max_chars)
            try:
                if read_doc(scope, path).content == content:
                    report.unchanged.append(source.file)
                    continue
            except AgentDocNotFoundError:
                pass
            write_doc(scope, path, content, expected_version=None, author="import")
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
    """Import FOLDER/<agent>/agent.md and the other .md files under FOLDER/<agent>/ as each agent's
    /memories/... documents, replacing what is stored (a file equal to it is left unchanged).

    Exits 3 when some files could not be imported (each is listed with the reason; the others
    are imported). Files that are not Markdown are listed as skipped; hidden ones are ignored.
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

    Refuses, writing nothing, when a file to write is already there, unless --force. The unnamed
    agent (of a gateway that names none) has no folder name: export it with --agent '' (FOLDER is
    then its folder).
    """
    tenant = tenant_id or DEFAULT_TENANT_ID
    if agent_name is not None:
        targets = [(scope_of(agent_name or None, user_id, tenant), folder)]
    else:
        targets = []
        for summary in doc_summaries(tenant):
            if summary.user_id != user_id:
                continue
            if summary.agent_name is None:
                click.echo(f"not exported: the unnamed agent {NONE} (export it with --agent '')", err=True)
                continue
            targets.append((scope_of(summary.agent_name, user_id, tenant), folder / summary.agent_name))
    files = [
        (base / doc.path.removeprefix(DOC_ROOT), read_doc(scope, doc.path).content or "")
        for scope, base in targets
        for doc in list_docs(scope)
    ]
    there = [path for path, _content in files if path.exists() or path.is_symlink()]
    if there and not force:
        raise CliError(
            f"{len(there)} file(s) to export are already there, the first {one_line(str(there[0]))}: "
            "nothing was written (pass --force to overwrite them)"
        )
    for path, content in files:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.is_symlink():  # replaced, never written through
                path.unlink()
            path.write_bytes(content.encode("utf-8"))
        except OSError as exc:
            raise CliError(f"cannot write {one_line(str(path))}: {exc.strerror or exc}") from exc
    if as_json:
        echo_json({"folder": str(folder), "files": [str(path) for path, _content in files]})
    else:
        click.echo(f"exported {len(files)} document(s) of {len(targets)} agent(s) to {folder}")
