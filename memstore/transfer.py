"""Import and export of DeerFlow-style memory trees, through any storage provider.

Tree layout (the file provider's own): ``memory.json`` (legacy global),
``agents/<agent>/memory.json``, ``users/<user>/memory.json`` and
``users/<user>/agents/<agent>/memory.json``. Import is idempotent: a document whose
sections and facts already equal the stored ones is reported unchanged and not written.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memstore.document import SECTION_GROUPS, MemoryDocument
from memstore.errors import InvalidScopeError, MemstoreError
from memstore.scope import Scope, resolve_scope
from memstore.storage.base import MemoryStorage

FILE_NAME = "memory.json"


class InvalidDocumentError(MemstoreError, ValueError):
    """A file that cannot be imported; the message is the reason shown to the operator."""


@dataclass(frozen=True)
class TreeEntry:
    path: Path
    user_id: str | None
    agent_name: str | None


@dataclass
class ImportReport:
    imported: list[TreeEntry] = field(default_factory=list)
    unchanged: list[TreeEntry] = field(default_factory=list)
    invalid: list[tuple[Path, str]] = field(default_factory=list)


def scope_path(root: Path, user_id: str | None, agent_name: str | None) -> Path:
    if user_id is None:
        return root / FILE_NAME if agent_name is None else root / "agents" / agent_name / FILE_NAME
    base = root / "users" / user_id
    return base / FILE_NAME if agent_name is None else base / "agents" / agent_name / FILE_NAME


def discover_tree(root: Path) -> tuple[list[TreeEntry], list[tuple[Path, str]]]:
    """Every ``memory.json`` under ``root`` mapped to its scope, plus files in unexpected places."""
    entries: list[TreeEntry] = []
    invalid: list[tuple[Path, str]] = []
    for path in sorted(root.rglob(FILE_NAME)):
        parts = path.relative_to(root).parts[:-1]
        user: str | None = None
        agent: str | None = None
        if len(parts) == 2 and parts[0] == "agents":
            agent = parts[1]
        elif len(parts) == 2 and parts[0] == "users":
            user = parts[1]
        elif len(parts) == 4 and parts[0] == "users" and parts[2] == "agents":
            user, agent = parts[1], parts[3]
        elif parts:
            invalid.append((path, "not in a users/<user>/[agents/<agent>/] or agents/<agent>/ folder"))
            continue
        try:
            user, agent = resolve_scope(agent, user)
        except InvalidScopeError as exc:
            invalid.append((path, str(exc)))
            continue
        entries.append(TreeEntry(path, user, agent))
    return entries, invalid


def read_document(path: Path) -> MemoryDocument:
    """Parse and shape-check one document file; raise ``InvalidDocumentError`` with the reason."""
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidDocumentError(f"cannot read: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise InvalidDocumentError(f"not valid JSON: {exc}") from exc
    if not isinstance(loaded, dict):
        raise InvalidDocumentError(f"expected a JSON object, found {type(loaded).__name__}")
    for group in ("user", "history"):
        if not isinstance(loaded.get(group, {}), dict):
            raise InvalidDocumentError(f"'{group}' must be an object")
    facts = loaded.get("facts", [])
    if not isinstance(facts, list) or not all(isinstance(f, dict) for f in facts):
        raise InvalidDocumentError("'facts' must be a list of objects")
    for index, fact in enumerate(facts):
        if not isinstance(fact.get("content"), str) or not fact["content"].strip():
            raise InvalidDocumentError(f"fact {index} has no text content")
    return loaded


def same_memory(left: MemoryDocument, right: MemoryDocument) -> bool:
    """Equal for everything a user would call memory: the six sections and the facts.

    Save timestamps, revisions and other provider bookkeeping are ignored, and a missing
    section equals an empty one, so a re-import of an exported tree is a no-op.
    """
    return _canonical(left) == _canonical(right)


def _canonical(document: MemoryDocument) -> dict[str, Any]:
    sections: dict[str, Any] = {}
    for group, names in SECTION_GROUPS.items():
        raw_group = document.get(group)
        group_value = raw_group if isinstance(raw_group, dict) else {}
        for name in names:
            section = group_value.get(name)
            section = section if isinstance(section, dict) else {}
            sections[name] = {"summary": "", "updatedAt": "", **section}
    return {"sections": sections, "facts": document.get("facts", [])}


def import_entries(
    storage: MemoryStorage,
    entries: Iterable[TreeEntry],
    *,
    dry_run: bool = False,
    on_item: Callable[[TreeEntry], None] | None = None,
) -> ImportReport:
    """Import each entry unless storage already holds the same memory; nothing is written on dry runs."""
    report = ImportReport()
    for entry in entries:
        try:
            document = read_document(entry.path)
        except InvalidDocumentError as exc:
            report.invalid.append((entry.path, str(exc)))
        else:
            stored = storage.load(entry.agent_name, user_id=entry.user_id)
            # Without a revision the save replaces the scope, which is what an import means.
            incoming = {key: value for key, value in document.items() if key != "revision"}
            if same_memory(stored, incoming):
                report.unchanged.append(entry)
            elif dry_run or storage.save(incoming, entry.agent_name, user_id=entry.user_id, origin="import"):
                report.imported.append(entry)
            else:
                report.invalid.append((entry.path, "the storage refused the save (see the log)"))
        if on_item is not None:
            on_item(entry)
    return report


def export_scopes(storage: MemoryStorage, scopes: Iterable[Scope], destination: Path) -> list[Path]:
    """Write each scope's document into ``destination`` in the tree layout."""
    written: list[Path] = []
    for user_id, agent_name in scopes:
        document = storage.load(agent_name, user_id=user_id)
        document.pop("revision", None)
        path = scope_path(destination, user_id, agent_name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(document, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
        written.append(path)
    return written
