"""``memstore agent-doc``: an operator's view and care of the agents' own memory documents (issue 34).

The commands act as the operator, not as an agent serving a user: ``AGENT`` (``''`` for the unnamed
agent of a gateway that names none), ``--user`` and ``--tenant`` name the documents exactly, whatever
``agent_doc_per_user`` says, and no user is recorded as the actor. Whatever an operator writes is
checked like an agent's write (paths, caps), and ``edit`` writes only over the version it opened:
if an agent or another operator changed the document meanwhile, nothing is written and the edited
text is kept in a file the error names. ``import`` and ``export`` (``agent_doc_transfer.py``) move
documents in and out of a folder in the deepagents layout.
"""

from __future__ import annotations

import os
import sys
import tempfile
import unicodedata
from datetime import datetime
from pathlib import Path

import click

from memstore.agent_doc import (
    DOC_ROOT,
    MAIN_DOC_PATH,
    AgentDocument,
    DocAgentSummary,
    DocScope,
    DocVersion,
    checked_path,
)
from memstore.cli.confirm import confirm_deletion, yes_option
from memstore.cli.exit_codes import EXIT_CONFLICT, EXIT_NOTHING_MATCHED
from memstore.cli.output import CliError, echo_counts, echo_json, echo_table, user_id_option
from memstore.cli.params import OFFSET, TENANT_OPTION, agent_name_option, strict_user_id
from memstore.errors import AgentDocConflictError, AgentDocNotFoundError, AgentDocPathError, MemstoreError
from memstore.ops.agent_docs import (
    MAX_HISTORY_LIMIT,
    doc_history,
    doc_summaries,
    document_fields,
    erase_agent_docs,
    list_docs,
    read_doc,
    version_fields,
    write_doc,
)
from memstore.ops.view import one_line
from memstore.scope import DEFAULT_TENANT_ID
from memstore.storage.records import iso

NONE = "(none)"
"""An absent agent or user in a table: ``-`` is a valid name of both."""


class NothingThere(CliError):
    """No such document or version: usually a mistyped agent, user or path (exit 4)."""

    exit_code = EXIT_NOTHING_MATCHED


class Conflict(CliError):
    """Another writer changed the document first; nothing was written (exit 7)."""

    exit_code = EXIT_CONFLICT


def agent_argument(ctx: click.Context, param: click.Parameter, value: str) -> str | None:
    """``AGENT`` as a valid agent name, or ``''`` for the unnamed agent (``None``)."""
    return None if value == "" else agent_name_option(ctx, param, value)


def path_argument(_ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    try:
        return None if value is None else checked_path(value)
    except AgentDocPathError as exc:
        raise click.BadParameter(str(exc), param=param) from exc


agent_arg = click.argument("agent_name", metavar="AGENT", callback=agent_argument)
path_arg = click.argument("path", default=MAIN_DOC_PATH, callback=path_argument)
json_option = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
read_user = click.option(
    "--user",
    "user_id",
    callback=user_id_option,
    help="A user's own documents of the agent (agent_doc_per_user); default: the agent's own.",
)
write_user = click.option(
    "--user",
    "user_id",
    callback=strict_user_id,
    help="A user's own documents of the agent (agent_doc_per_user); default: the agent's own.",
)


def scope_of(agent_name: str | None, user_id: str | None, tenant_id: str | None) -> DocScope:
    return DocScope(agent_name, user_id, tenant_id or DEFAULT_TENANT_ID)


def document_dict(doc: AgentDocument, scope: DocScope) -> dict[str, object]:
    return {
        "agentName": scope.agent_name,
        "userId": scope.user_id,
        "tenantId": scope.tenant_id,
        **document_fields(doc),
    }


def summary_dict(summary: DocAgentSummary) -> dict[str, object]:
    return {
        "tenantId": summary.tenant_id,
        "agentName": summary.agent_name,
        "userId": summary.user_id,
        "documents": summary.documents,
        "chars": summary.chars,
        "updatedAt": iso(summary.updated_at),
    }


def _when(value: datetime) -> str:
    return (iso(value) or "")[:19]


@click.group("agent-doc")
def agent_doc() -> None:
    """List, show, edit, import, export, audit or erase the agents' own memory documents
    (/memories/agent.md and the others an agent keeps)."""


@agent_doc.command("list")
@TENANT_OPTION
@click.option(
    "--agent",
    "agent_name",
    callback=agent_name_option,
    help="List this agent's documents instead of the agents that have some.",
)
@read_user
@json_option
def list_command(tenant_id: str | None, agent_name: str | None, user_id: str | None, as_json: bool) -> None:
    """Every agent (and user of an agent) with documents, and how many and how large; every tenant's
    unless --tenant. With --agent, that agent's documents (or, with --user, that user's of it)."""
    if agent_name is None:
        if user_id is not None:
            raise click.UsageError("--user needs --agent")
        summaries = doc_summaries(tenant_id)
        if as_json:
            echo_json({"agents": [summary_dict(summary) for summary in summaries]})
            return
        rows = [
            (s.tenant_id, s.agent_name or NONE, s.user_id or NONE, s.documents, s.chars, _when(s.updated_at))
            for s in summaries
        ]
        echo_table(("TENANT", "AGENT", "USER", "DOCUMENTS", "CHARS", "UPDATED"), rows)
        return
    scope = scope_of(agent_name, user_id, tenant_id)
    found = list_docs(scope)
    if as_json:
        echo_json({"documents": [document_dict(doc, scope) for doc in found]})
        return
    echo_table(
        ("PATH", "VERSION", "CHARS", "AUTHOR", "ACTOR", "UPDATED"),
        [(d.path, d.version, d.chars, d.author, d.actor or NONE, _when(d.updated_at)) for d in found],
    )
    click.echo(f"{len(found)} document(s) of {scope.label}")


@agent_doc.command("show")
@agent_arg
@path_arg
@read_user
@TENANT_OPTION
@click.option("--version", "version", type=click.IntRange(1), help="Show this version from the history.")
@json_option
def show_command(
    agent_name: str | None,
    path: str,
    user_id: str | None,
    tenant_id: str | None,
    version: int | None,
    as_json: bool,
) -> None:
    """Print a document (PATH, default /memories/agent.md) exactly as stored, so `> FILE` keeps it;
    its version and author go to stderr. Exits 4 when there is no such document or version.

    On a terminal, control and format characters other than tab and newline are left out.
    """
    scope = scope_of(agent_name, user_id, tenant_id)
    if version is None:
        try:
            doc = read_doc(scope, path)
        except AgentDocNotFoundError as exc:
            raise NothingThere(
                f"{exc} of {scope.label} (check the agent, --user, --tenant and the path)"
            ) from exc
        shown = document_dict(doc, scope)
        about = f"version {doc.version} by {doc.author}, updated {_when(doc.updated_at)}"
    else:
        entry = _version_of(scope, path, version)
        shown = {"agentName": scope.agent_name, "userId": scope.user_id, "tenantId": scope.tenant_id}
        shown.update(version_fields(entry))
        about = f"version {version}, {entry.action} by {entry.author} {_when(entry.created_at)}"
    if as_json:
        echo_json(shown)
        return
    click.echo(f"{path} of {scope.label}: {about}", err=True)
    _write_raw(str(shown["content"]))


def _version_of(scope: DocScope, path: str, version: int) -> DocVersion:
    """Version ``version`` of ``path``, looked up by its number (a history may be long)."""
    found = doc_history(scope, path, limit=1, version=version)
    if not found:
        raise NothingThere(
            f"no version {version} of {path} of {scope.label} in the history "
            "(it keeps the last agent_doc_history_keep versions)"
        )
    if found[0].content is None:
        raise NothingThere(f"version {version} of {path} is its deletion: it has no text")
    return found[0]


def _write_raw(content: str) -> None:
    """``content`` as UTF-8, byte for byte; on a terminal without control and format characters
    (but tab and newline), so a stored text cannot move the cursor, restyle or reorder the screen."""
    if sys.stdout.isatty():
        content = "".join(c for c in content if c in "\t\n" or unicodedata.category(c) not in ("Cc", "Cf"))
    sys.stdout.flush()
    sys.stdout.buffer.write(content.encode("utf-8"))
    sys.stdout.buffer.flush()


@agent_doc.command("edit")
@agent_arg
@path_arg
@write_user
@TENANT_OPTION
def edit_command(agent_name: str | None, path: str, user_id: str | None, tenant_id: str | None) -> None:
    """Open a document (PATH, default /memories/agent.md; a new one if missing) in $VISUAL or $EDITOR
    and write what you save as its next version, by the operator.

    If the document changed while you edited it, nothing is written: the command exits 7 and names
    the file your text is kept in. Any other refusal (a cap, the database) keeps it the same way.
    """
    scope = scope_of(agent_name, user_id, tenant_id)
    try:
        doc = read_doc(scope, path)
        text, opened = doc.content or "", doc.version
    except AgentDocNotFoundError:
        text, opened = "", 0
    original = text.encode("utf-8")
    edited = click.edit(original, extension=".md")  # bytes: no newline added, no encoding guessed
    if edited is None or edited == original:
        click.echo(f"no change to {path} of {scope.label}")
        return
    try:
        written = write_doc(scope, path, edited.decode("utf-8"), expected_version=opened, author="operator")
    except UnicodeDecodeError as exc:
        raise CliError(f"the saved text is not UTF-8, so nothing was written; {_kept(edited)}") from exc
    except AgentDocConflictError as exc:
        now = "deleted" if exc.current == 0 else f"now version {exc.current}"
        since = "you opened it" if opened else "you started it (it was new)"
        raise Conflict(
            f"{path} of {scope.label} changed since {since} ({now}), so nothing was written; "
            f"{_kept(edited)}; merge it with `memstore agent-doc edit` again"
        ) from exc
    except MemstoreError as exc:
        raise CliError(f"{exc}; nothing was written; {_kept(edited)}") from exc
    click.echo(f"wrote {path} of {scope.label}: version {written.version}, {written.chars} characters")


def _kept(text: bytes) -> str:
    """Save the operator's edited text where the error can name it (readable by them only)."""
    handle, name = tempfile.mkstemp(prefix="memstore-agent-doc-", suffix=".md")
    with os.fdopen(handle, "wb") as kept:
        kept.write(text)
    return f"your text is saved in {Path(name)}"


@agent_doc.command("history")
@agent_arg
@click.argument("path", required=False, callback=path_argument)
@read_user
@TENANT_OPTION
@click.option(
    "--limit", type=click.IntRange(1, MAX_HISTORY_LIMIT), default=20, show_default=True, help="Page size."
)
@click.option("--offset", type=OFFSET, default=0, show_default=True, help="Versions to skip, for paging.")
@click.option("--json", "as_json", is_flag=True, help="Print the versions, with their text, as JSON.")
def history_command(
    agent_name: str | None,
    path: str | None,
    user_id: str | None,
    tenant_id: str | None,
    limit: int,
    offset: int,
    as_json: bool,
) -> None:
    """The versions of a document (PATH), or of every document of the agent, newest first: who
    wrote, edited or deleted each (author agent, operator or import; the user it served)."""
    scope = scope_of(agent_name, user_id, tenant_id)
    versions = doc_history(scope, path, limit=limit, offset=offset)
    if as_json:
        echo_json(
            {"versions": [version_fields(entry) for entry in versions], "limit": limit, "offset": offset}
        )
        return
    rows = [
        (
            _when(entry.created_at),
            entry.path,
            entry.version,
            entry.action,
            entry.author,
            entry.actor or NONE,
            "" if entry.content is None else len(entry.content),
        )
        for entry in versions
    ]
    echo_table(("CREATED", "PATH", "VERSION", "ACTION", "AUTHOR", "ACTOR", "CHARS"), rows)
    shown = f"{offset + 1}-{offset + len(versions)}" if versions else "none"
    click.echo(f"showing {shown} of the versions of {one_line(path or DOC_ROOT)} of {scope.label}")


@agent_doc.command("erase")
@agent_arg
@TENANT_OPTION
@yes_option
@json_option
def erase_command(agent_name: str | None, tenant_id: str | None, yes: bool, as_json: bool) -> None:
    """Delete every document of an agent in the tenant, its users' own too, with their history.

    Exits with 4 when the agent had none (usually a mistyped name).
    """
    scope = scope_of(agent_name, None, tenant_id)
    question = (
        f"Erase every document of agent {scope.label} in tenant {scope.tenant_id}, its users' too, "
        "and their history? This cannot be undone"
    )
    confirm_deletion("erase an agent's documents", question, yes=yes)
    counts = erase_agent_docs(scope.agent_name, scope.tenant_id)
    if not any(counts.values()):
        raise NothingThere(
            f"agent {scope.label} has no documents in tenant {scope.tenant_id} (check the name)"
        )
    if as_json:
        echo_json({"agentName": scope.agent_name, "tenantId": scope.tenant_id, "deleted": counts})
    else:
        echo_counts(f"erased the documents of agent {scope.label}; rows deleted:", counts)
