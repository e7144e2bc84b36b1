"""The reference's directory layout: one ``memory.json`` per scope.

``memory.json`` (legacy global), ``agents/<agent>/memory.json``, ``users/<user>/memory.json`` and
``users/<user>/agents/<agent>/memory.json``. The file provider stores in it, and import/export
read and write DeerFlow trees in it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from memstore.errors import InvalidScopeError
from memstore.scope import resolve_scope

FILE_NAME = "memory.json"


@dataclass(frozen=True)
class TreeEntry:
    path: Path
    user_id: str | None
    agent_name: str | None


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


def other_json_files(root: Path) -> list[tuple[Path, str]]:
    """JSON files under ``root`` that the layout does not read (``users/alice.json``, ``notes.json``),
    each with the reason: an import reports them rather than leaving them out without a word."""
    return [
        (path, f"not named {FILE_NAME}, so no scope is read from it")
        for path in sorted(root.rglob("*"))
        if path.suffix.lower() == ".json" and path.name != FILE_NAME and path.is_file()
    ]
