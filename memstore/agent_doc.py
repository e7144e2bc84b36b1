"""The agent's own memory documents: virtual paths, shapes and the rules every entry point shares.

An agent keeps curated Markdown notes about its own work (``/memories/agent.md`` is the main one,
injected at the top of its system prompt; others such as ``/memories/projects/x.md`` are read on
demand). They live in the database per ``(tenant_id, agent_name)``, or per user of an agent when
``agent_doc_per_user`` is on, each with a version that every write bumps and a history of every
version. The agent reaches them through file tools whose paths are *virtual*: a path is a key,
never a file-system location, and ``checked_path`` refuses anything that is not a plain
``/memories/...`` name, so no input can name another scope, another file or a parent folder.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from datetime import datetime

from memstore.document import unstorable
from memstore.errors import AgentDocEditError, AgentDocPathError
from memstore.scope import DEFAULT_TENANT_ID, normalize_agent_name, validate_tenant_id, validate_user_id

DOC_ROOT = "/memories/"
MAIN_DOC_PATH = "/memories/agent.md"
MAX_PATH_CHARS = 256
MAX_PATH_DEPTH = 8
"""Segments below ``/memories/``: ``/memories/a/b.md`` has two."""
_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
"""A file or folder name: ASCII letters, digits, ``_ . -``, not starting with ``.`` or ``-`` (so
never ``.`` or ``..``, never a hidden file or an option when exported to a folder)."""
LARGEST_DOC_CHARS = 1_000_000
"""The highest ``agent_doc_max_chars`` may be set: the cap on any text a tool takes."""
AUTHORS = ("agent", "user", "operator", "import")
ACTIONS = ("write", "edit", "delete")


def checked_path(path: object) -> str:
    """``path`` if it names a document under ``/memories/``, else ``AgentDocPathError`` with the rule.

    The message names the rule it breaks and never quotes the path (it may be huge or hostile).
    """
    if not isinstance(path, str):
        raise AgentDocPathError("a path must be a string")
    if len(path) > MAX_PATH_CHARS:
        raise AgentDocPathError(f"a path is at most {MAX_PATH_CHARS} characters")
    if any(unicodedata.category(char) in ("Cc", "Cf", "Cs", "Zl", "Zp") for char in path):
        raise AgentDocPathError("a path may not contain control, format or line-break characters")
    if "\\" in path:
        raise AgentDocPathError("a path uses / between names, never a backslash")
    if not path.startswith(DOC_ROOT):
        raise AgentDocPathError(f"a path must start with {DOC_ROOT} (for example {MAIN_DOC_PATH})")
    segments = path[len(DOC_ROOT) :].split("/")
    if len(segments) > MAX_PATH_DEPTH:
        raise AgentDocPathError(f"a path is at most {MAX_PATH_DEPTH} names deep below {DOC_ROOT}")
    for segment in segments:
        _check_segment(segment)
    return path


def checked_folder(path: object) -> str:
    """A folder to list: ``/memories`` or ``/memories/...`` with or without the final ``/``,
    returned with it (``/memories/projects/``), so it is a prefix of exactly its documents."""
    if path is None or path in ("/memories", DOC_ROOT):
        return DOC_ROOT
    if not isinstance(path, str):
        raise AgentDocPathError("a folder must be a string")
    folder = path if path.endswith("/") else f"{path}/"
    checked_path(folder[:-1])
    return folder


def _check_segment(segment: str) -> None:
    if not segment:
        raise AgentDocPathError("a path has no empty names (no // and no / at the end)")
    if set(segment) == {"."}:
        raise AgentDocPathError("a path may not contain . or .. names")
    if not _SEGMENT.fullmatch(segment):
        raise AgentDocPathError(
            "each name in a path is 1-128 of A-Z a-z 0-9 _ . - and starts with a letter, digit or _"
        )


@dataclass(frozen=True)
class DocScope:
    """Whose documents: an agent's in a tenant (``user_id`` ``None``) or one user's of that agent.

    ``agent_name`` ``None`` is the gateway's unnamed agent, as in the memory scopes.
    """

    agent_name: str | None
    user_id: str | None = None
    tenant_id: str = DEFAULT_TENANT_ID

    def __post_init__(self) -> None:
        validate_tenant_id(self.tenant_id)
        validate_user_id(self.user_id)
        object.__setattr__(self, "agent_name", normalize_agent_name(self.agent_name))

    @property
    def label(self) -> str:
        agent = self.agent_name or "(no agent)"
        return agent if self.user_id is None else f"{agent} for user {self.user_id}"


@dataclass(frozen=True)
class AgentDocument:
    """A live document; ``content`` is ``None`` in listings, which read no text."""

    path: str
    version: int
    chars: int
    author: str
    actor: str | None
    updated_at: datetime
    content: str | None = None


@dataclass(frozen=True)
class DocVersion:
    """One entry of a document's history: the text a write left (``None`` for a delete)."""

    path: str
    version: int
    action: str
    author: str
    actor: str | None
    created_at: datetime
    content: str | None


@dataclass(frozen=True)
class DocAgentSummary:
    """An operator's line of ``agent-doc list``: one scope's live documents."""

    tenant_id: str
    agent_name: str | None
    user_id: str | None
    documents: int
    chars: int
    updated_at: datetime


@dataclass(frozen=True)
class DocLimits:
    """The caps a write is checked against, in the transaction that stores it."""

    max_doc_chars: int
    max_docs: int
    max_total_chars: int
    history_keep: int


def _unix_lines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def checked_content(content: object, *, max_chars: int) -> str:
    """``content`` with its line endings as ``\n``, so an edit spanning lines matches what
    ``read_file`` shows whatever system wrote the text; refused when it cannot be stored."""
    if not isinstance(content, str):
        raise AgentDocEditError("a document's content must be a string")
    content = _unix_lines(content)
    if len(content) > max_chars:
        raise AgentDocEditError(
            f"the document would be {len(content)} characters, "
            f"over the {max_chars} allowed (agent_doc_max_chars)"
        )
    problem = unstorable(content)
    if problem is not None:
        raise AgentDocEditError(f"the document {problem}")
    return content


def replaced_once(content: str, old: object, new: object, *, path: str) -> str:
    """``content`` with ``old`` replaced by ``new``, where ``old`` occurs exactly once."""
    if not isinstance(old, str) or not isinstance(new, str):
        raise AgentDocEditError("old_string and new_string must be strings")
    if not old:
        raise AgentDocEditError("old_string may not be empty: use write_file to write a whole document")
    old, new = _unix_lines(old), _unix_lines(new)
    count = content.count(old)
    if count == 0:
        raise AgentDocEditError(
            f"old_string does not occur in {path}; read the file again and copy it exactly"
        )
    if count > 1:
        raise AgentDocEditError(
            f"old_string occurs {count} times in {path}; include more of the text around it so it occurs once"
        )
    return content.replace(old, new, 1)
