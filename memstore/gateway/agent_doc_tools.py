"""The agent's file tools over its own documents: ``ls``, ``read_file``, ``write_file``,
``edit_file`` and ``delete_file`` on the virtual ``/memories/`` folder.

They behave like the file tools agents already know (numbered lines from ``read_file``, an exact
single-match ``edit_file``), with one addition: ``read_file`` reports the document's version, and a
write passing ``version`` is refused if the document has moved on since, so an agent never
overwrites what another replica or an operator wrote meanwhile. Each returns text for the model
and never raises (an agent framework would abort the run): a failure is a line starting
``Error:``. The LangChain tools (``integrations/langchain_agent_doc.py``) and the MCP tools both
call these. The keywords ``agent_name``, ``user_id`` and ``tenant_id`` are the server's to set,
never the model's; the user defaults to the request's (``set_current_user``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from memstore.agent_doc import DOC_ROOT, DocScope
from memstore.config import get_memory_config
from memstore.errors import (
    STORAGE_UNAVAILABLE_MESSAGE,
    MemstoreError,
    StorageSetupError,
    StorageUnavailableError,
    StorageWriteError,
)
from memstore.gateway.deadline import DeadlineExceededError, within
from memstore.gateway.user_context import effective_tenant, get_effective_user_id
from memstore.ops import agent_docs

logger = logging.getLogger(__name__)

MAX_READ_LINES = 2000
UNCONFIRMED_WRITE_ERROR = (
    "Error: the memory store did not confirm this change in time; it may still have been saved: "
    "read the document before trying again"
)
READ_ONLY_ERROR = (
    "Error: the memory documents are read-only here (agent_doc_agent_writes is off); "
    "an operator maintains them"
)


def _failure(exc: Exception, actor: str) -> str:
    """The one place a tool failure becomes the text the model reads: a rule it broke, or the
    generic storage message (the cause names the database, so it is logged instead)."""
    if isinstance(exc, (StorageUnavailableError, StorageWriteError, StorageSetupError)):
        logger.warning("agent document tool of user %s failed, storage: %s", actor, exc)
        return f"Error: {STORAGE_UNAVAILABLE_MESSAGE}"
    if not isinstance(exc, MemstoreError | ValueError):
        logger.exception("agent document tool of user %s failed", actor)
        return "Error: the memory tool failed unexpectedly"
    return f"Error: {exc}"


def _run(
    action: Callable[[DocScope, str], str],
    *,
    agent_name: str | None,
    user_id: str | None,
    tenant_id: str | None,
    writes: bool = False,
) -> str:
    actor = user_id or get_effective_user_id()
    config = get_memory_config()
    if writes and not config.agent_doc_agent_writes:
        return READ_ONLY_ERROR
    try:
        scope = agent_docs.doc_scope(agent_name, actor, effective_tenant(tenant_id))
        # A write may wait for a lock and then run its statements: both bounded by the server,
        # unless it stops answering, which the deadline covers.
        deadline = config.write_lock_timeout_seconds + config.write_statement_timeout_seconds
        return within(deadline, lambda: action(scope, actor), doing="run a memory file tool")
    except DeadlineExceededError as exc:
        logger.warning("agent document tool of user %s: %s", actor, exc)
        # The write may still commit after the deadline: the model must look before trying again.
        return UNCONFIRMED_WRITE_ERROR if writes else f"Error: {STORAGE_UNAVAILABLE_MESSAGE}"
    except Exception as exc:
        return _failure(exc, actor)


def _version(version: object) -> int | None:
    if version is not None and (isinstance(version, bool) or not isinstance(version, int) or version < 1):
        raise ValueError("version must be a whole number from 1, as read_file reported it")
    return version


def ls(
    path: str = DOC_ROOT,
    *,
    agent_name: str | None = None,
    user_id: str | None = None,
    tenant_id: str | None = None,
) -> str:
    """List your memory documents under a folder of /memories/ (all of them by default).

    Args:
        path: The folder, such as /memories/ or /memories/projects/.
    """

    def run(scope: DocScope, actor: str) -> str:
        found = agent_docs.list_docs(scope, path, actor=actor)
        if not found:
            return f"No memory documents under {path if path.endswith('/') else path + '/'}"
        return "\n".join(f"{doc.path} (version {doc.version}, {doc.chars} characters)" for doc in found)

    return _run(run, agent_name=agent_name, user_id=user_id, tenant_id=tenant_id)


def read_file(
    file_path: str,
    offset: int = 0,
    limit: int = MAX_READ_LINES,
    *,
    agent_name: str | None = None,
    user_id: str | None = None,
    tenant_id: str | None = None,
) -> str:
    """Read one of your memory documents, its lines numbered from 1, and its current version.

    Args:
        file_path: The document, such as /memories/agent.md.
        offset: Lines to skip from the start.
        limit: The most lines to return (up to 2000).
    """

    def run(scope: DocScope, actor: str) -> str:
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError("offset must be a whole number from 0")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_READ_LINES:
            raise ValueError(f"limit must be a whole number from 1 to {MAX_READ_LINES}")
        doc = agent_docs.read_doc(scope, file_path, actor=actor)
        lines = (doc.content or "").splitlines()
        shown = lines[offset : offset + limit]
        header = f"{doc.path}, version {doc.version}: "
        if not lines:
            return header + "empty"
        if not shown:
            return header + f"{len(lines)} lines, none after line {offset}"
        header += f"lines {offset + 1}-{offset + len(shown)} of {len(lines)}"
        return "\n".join([header, *(f"{offset + number:6d}\t{line}" for number, line in enumerate(shown, 1))])

    return _run(run, agent_name=agent_name, user_id=user_id, tenant_id=tenant_id)


def write_file(
    file_path: str,
    content: str,
    version: int | None = None,
    *,
    agent_name: str | None = None,
    user_id: str | None = None,
    tenant_id: str | None = None,
) -> str:
    """Write a whole memory document. Without version it creates a new document only; to replace
    an existing one, pass the version read_file reported (prefer edit_file for small changes).

    Args:
        file_path: The document, such as /memories/projects/notes.md.
        content: The whole new text (Markdown).
        version: The version you read, to overwrite it; refused if it has changed since.
    """

    def run(scope: DocScope, actor: str) -> str:
        expected = _version(version) or 0
        doc = agent_docs.write_doc(
            scope, file_path, content, expected_version=expected, author="agent", actor=actor
        )
        return f"Wrote {doc.path}: now version {doc.version}, {doc.chars} characters"

    return _run(run, agent_name=agent_name, user_id=user_id, tenant_id=tenant_id, writes=True)


def edit_file(
    file_path: str,
    old_string: str,
    new_string: str,
    version: int | None = None,
    *,
    agent_name: str | None = None,
    user_id: str | None = None,
    tenant_id: str | None = None,
) -> str:
    """Replace one exact piece of a memory document. old_string must occur exactly once in it:
    copy it from read_file (without the line numbers) with enough text around it to be unique.

    Args:
        file_path: The document, such as /memories/agent.md.
        old_string: The exact text to replace.
        new_string: The text to put in its place (may be empty, to remove old_string).
        version: The version you read; refused if the document has changed since.
    """

    def run(scope: DocScope, actor: str) -> str:
        doc = agent_docs.edit_doc(
            scope,
            file_path,
            old_string,
            new_string,
            expected_version=_version(version),
            author="agent",
            actor=actor,
        )
        return f"Edited {doc.path}: now version {doc.version}, {doc.chars} characters"

    return _run(run, agent_name=agent_name, user_id=user_id, tenant_id=tenant_id, writes=True)


def delete_file(
    file_path: str,
    version: int | None = None,
    *,
    agent_name: str | None = None,
    user_id: str | None = None,
    tenant_id: str | None = None,
) -> str:
    """Delete one of your memory documents (its history is kept for operators).

    Args:
        file_path: The document, such as /memories/projects/old.md.
        version: The version you read; refused if the document has changed since.
    """

    def run(scope: DocScope, actor: str) -> str:
        deleted = agent_docs.delete_doc(
            scope, file_path, expected_version=_version(version), author="agent", actor=actor
        )
        return f"Deleted {file_path} (the delete is version {deleted})"

    return _run(run, agent_name=agent_name, user_id=user_id, tenant_id=tenant_id, writes=True)


FILE_TOOLS = (ls, read_file, write_file, edit_file, delete_file)
