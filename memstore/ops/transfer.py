"""Import and export of DeerFlow-style memory trees, through any storage provider.

The tree layout is the file provider's own (``memstore.storage.file.layout``). Import is
idempotent: a document whose sections and facts already equal the stored ones is reported
unchanged and not written.

A document file is refused before it is parsed when it is over ``MAX_DOCUMENT_BYTES``, and
after parsing when it breaks the caps of ``memstore.ops.validation.check_document`` (fact and
summary sizes, fact count, nesting depth): an import reads one whole file into memory, and a
document the provider cannot copy or store must be reported, not crash the command.

Then, unless told not to, the facts of every scope the import holds that lack a vector under
the configured model are embedded (``embed_imported``): until then semantic search and
query-aware injection cannot find them. The embedder is resolved before anything is written, so
a setting that cannot work fails the import whole; an embedding that fails later (the endpoint
down) leaves the import committed and is reported, and ``memstore embed`` finishes it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memstore.config import MemoryConfig, get_memory_config
from memstore.document import MAX_DOCUMENT_BYTES, SECTION_GROUPS, MemoryDocument, fact_content_key
from memstore.errors import InvalidDocumentError, InvalidFactError, MemstoreError
from memstore.ops.embeddings import embed_facts
from memstore.ops.validation import check_document
from memstore.record import RELATIONS_KEY, TAGS_KEY, checked_relations, checked_tags
from memstore.scope import Scope
from memstore.storage.base import MemoryStorage
from memstore.storage.file.layout import TreeEntry, scope_path
from memstore.storage.vectors import semantic_parts


@dataclass(frozen=True)
class ImportEmbedding:
    """What embedding an import's facts did."""

    model: str | None
    """The configured model; ``None`` with ``embedding_provider: none`` (nothing is embedded)."""
    embedded: int = 0
    error: str | None = None
    """Why embedding stopped (the endpoint down...): the import itself is committed and whole."""

    def to_json(self) -> dict[str, object]:
        return {"model": self.model, "embedded": self.embedded, "error": self.error}


@dataclass
class ImportReport:
    imported: list[TreeEntry] = field(default_factory=list)
    unchanged: list[TreeEntry] = field(default_factory=list)
    invalid: list[tuple[Path, str]] = field(default_factory=list)
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    """Files of a tree that are no document of it (not named ``memory.json``): not read, not an error."""
    embedding: ImportEmbedding | None = None
    """``None`` when no embedding was asked for (``embed=False``, a dry run)."""

    @property
    def scopes(self) -> list[Scope]:
        """The scopes the import left holding the files' memory (imported or unchanged), once each.

        Unchanged ones count: importing a tree again embeds what an earlier run could not.
        """
        entries = [*self.imported, *self.unchanged]
        return list(dict.fromkeys((entry.user_id, entry.agent_name) for entry in entries))


def read_document(path: Path) -> MemoryDocument:
    """Parse and check one document file; raise ``InvalidDocumentError`` with the reason."""
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_DOCUMENT_BYTES + 1)
        if len(raw) > MAX_DOCUMENT_BYTES:
            raise InvalidDocumentError(f"larger than the {MAX_DOCUMENT_BYTES} bytes accepted")
        loaded = json.loads(raw.decode("utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidDocumentError(f"cannot read: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise InvalidDocumentError(f"not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise InvalidDocumentError("not valid JSON: nested too deeply to parse") from exc
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
    check_document(loaded)
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
    return {"sections": sections, "facts": [_as_stored(fact) for fact in document.get("facts", [])]}


def _as_stored(fact: object) -> object:
    """``fact`` with its tags and relations as the SQL provider keeps them: sets, sorted."""
    if not isinstance(fact, dict):
        return fact
    sets = {}
    for key, check in ((TAGS_KEY, checked_tags), (RELATIONS_KEY, checked_relations)):
        if key in fact:
            with suppress(InvalidFactError):  # an invalid value is kept, and compared, verbatim
                sets[key] = check(fact[key])
    return {**fact, **sets}


def import_entries(
    storage: MemoryStorage,
    entries: Iterable[TreeEntry],
    *,
    dry_run: bool = False,
    on_item: Callable[[TreeEntry], None] | None = None,
    embed: bool = True,
    on_embedded: Callable[[int], None] | None = None,
    config: MemoryConfig | None = None,
) -> ImportReport:
    """Import each entry unless storage already holds the same memory; nothing is written on dry runs.

    Then, with ``embed`` (and not on a dry run), embed what the imported scopes lack
    (``embed_imported``; ``on_embedded`` gets each batch's count). A setting that cannot embed
    raises ``ConfigError`` before anything is written.
    """
    config = config or get_memory_config()
    embedding = embed and not dry_run
    if embedding:
        import_model(storage, config)
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
            incoming["facts"] = _with_stored_ids(incoming.get("facts", []), stored)
            if same_memory(stored, incoming):
                report.unchanged.append(entry)
            elif dry_run or storage.save(incoming, entry.agent_name, user_id=entry.user_id, origin="import"):
                report.imported.append(entry)
            else:
                report.invalid.append((entry.path, "the storage refused the save (see the log)"))
        if on_item is not None:
            on_item(entry)
    if embedding:
        report.embedding = embed_imported(storage, report.scopes, config=config, progress=on_embedded)
    return report


def import_model(storage: MemoryStorage, config: MemoryConfig | None = None) -> str | None:
    """The model an import's facts are embedded with; ``None`` with ``embedding_provider: none``.

    Call it before importing: it builds the embedder (loads the local model) and raises
    ``ConfigError`` for a setting that cannot work (a provider that keeps no vectors, the local
    model not installed), so such an import fails before it writes.
    """
    parts = semantic_parts(config or get_memory_config(), storage)
    return None if parts is None else parts[0].model


def embed_imported(
    storage: MemoryStorage,
    scopes: Iterable[Scope],
    *,
    config: MemoryConfig | None = None,
    progress: Callable[[int], None] | None = None,
) -> ImportEmbedding:
    """Embed the live facts of ``scopes`` (in ``storage``'s tenant) that lack a vector, in batches.

    A failure is returned, not raised: what was imported stays committed and whole, the vectors
    already written stay, and ``memstore embed`` (or the same import again) embeds the rest.
    """
    config = config or get_memory_config()
    done = 0

    def counted(count: int) -> None:
        nonlocal done
        done += count
        if progress is not None:
            progress(count)

    model: str | None = None
    try:
        model = import_model(storage, config)
        if model is not None:
            embed_facts(config=config, storage=storage, scopes=scopes, progress=counted)
    except MemstoreError as exc:
        return ImportEmbedding(model, done, str(exc) or type(exc).__name__)
    return ImportEmbedding(model, done)


def _with_stored_ids(facts: list[dict[str, Any]], stored: MemoryDocument) -> list[dict[str, Any]]:
    """Facts without an ``id`` take the id of the stored fact with the same content key.

    Otherwise every run would give them fresh ids, tombstone the rows of the last run and bump
    the revision: a re-import must find them unchanged. Facts that have an id keep it.
    """
    stored_facts = stored.get("facts")
    owners = {
        fact_content_key(fact["content"]): fact["id"]
        for fact in (stored_facts if isinstance(stored_facts, list) else [])
        if isinstance(fact, dict) and isinstance(fact.get("content"), str) and isinstance(fact.get("id"), str)
    }
    explicit = {fact["id"] for fact in facts if "id" in fact}
    adopted: list[dict[str, Any]] = []
    for fact in facts:
        owner = owners.get(fact_content_key(fact["content"])) if "id" not in fact else None
        adopted.append({"id": owner, **fact} if owner is not None and owner not in explicit else fact)
    return adopted


def export_scopes(storage: MemoryStorage, scopes: Iterable[Scope], destination: Path) -> list[Path]:
    """Write each scope's document into ``destination`` in the tree layout."""
    written: list[Path] = []
    for user_id, agent_name in scopes:
        document = storage.load(agent_name, user_id=user_id)
        for bookkeeping in ("revision", "incarnation"):  # the SQL provider's, meaningless elsewhere
            document.pop(bookkeeping, None)
        path = scope_path(destination, user_id, agent_name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(document, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
        written.append(path)
    return written
