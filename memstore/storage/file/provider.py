"""``FileMemoryStorage``: one JSON file per scope, in the reference's directory layout."""

from __future__ import annotations

import copy
import json
import logging
import os
import tempfile
import threading
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from memstore.config import FILE_MAX_FACTS, get_memory_config
from memstore.document import MemoryDocument, create_empty_memory, unstored_memory, utc_now_iso_z
from memstore.errors import ConfigError
from memstore.metrics import timed_storage
from memstore.scope import Scope, resolve_scope
from memstore.storage.data_dir import data_dir_of
from memstore.storage.file.layout import FILE_NAME, scope_path
from memstore.storage.file.operations import FileOperations
from memstore.storage.limits import MAX_NESTING, document_too_deep

logger = logging.getLogger(__name__)

# (inode, mtime_ns, size): an atomic rename always brings a new inode, so a replaced file
# is noticed even when mtime granularity is coarse and the size happens to match.
_FileStamp = tuple[int, int, int]


class FileMemoryStorage(FileOperations):
    """Documents under ``base_dir`` (default: ``data_dir``), written atomically.

    Layout: the reference's tree (``memstore.storage.file.layout``). Refuses to start (``ConfigError``)
    with ``max_facts`` above ``FILE_MAX_FACTS`` (which ``MemoryConfig`` also refuses when
    ``storage_class`` names this provider; a subclass or direct construction is checked here).
    """

    def __init__(self, base_dir: str | os.PathLike[str] | None = None) -> None:
        config = get_memory_config()
        if config.max_facts > FILE_MAX_FACTS:
            raise ConfigError(
                f"max_facts is {config.max_facts}, but the file provider keeps at most {FILE_MAX_FACTS} "
                "facts per scope (it rewrites a scope's whole JSON file on every save): lower max_facts "
                "or use the SQL provider (storage_class: memstore.storage.sql.SqlMemoryStorage)"
            )
        self._base_dir = Path(base_dir) if base_dir is not None else data_dir_of(config)
        self._global_path = self._base_dir / (config.storage_path or FILE_NAME)
        self._cache: dict[Scope, tuple[_FileStamp, MemoryDocument]] = {}
        self._lock = threading.Lock()

    @property
    def base_dir(self) -> Path:
        return self._base_dir

    def path_for(self, agent_name: str | None = None, *, user_id: str | None = None) -> Path:
        user, agent = resolve_scope(agent_name, user_id)
        if user is None and agent is None:
            return self._global_path  # ``storage_path`` may rename the legacy global file
        return scope_path(self._base_dir, user, agent)

    @timed_storage("load")
    def load(self, agent_name: str | None = None, *, user_id: str | None = None) -> MemoryDocument:
        return self._read(resolve_scope(agent_name, user_id), use_cache=True)

    @timed_storage("load")
    def reload(self, agent_name: str | None = None, *, user_id: str | None = None) -> MemoryDocument:
        return self._read(resolve_scope(agent_name, user_id), use_cache=False)

    @timed_storage("save")
    def save(
        self,
        memory: MemoryDocument,
        agent_name: str | None = None,
        *,
        user_id: str | None = None,
        origin: str | None = None,
        captured_at: datetime | None = None,
        removals: Mapping[str, Mapping[str, Any]] | None = None,
        confirmed: Collection[str] = (),
        folded: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    ) -> bool:
        """Write the document atomically; files keep no audit trail or signals (``removals``,
        ``confirmed``, ``folded`` and ``origin`` are ignored)."""
        scope = resolve_scope(agent_name, user_id)
        path = self.path_for(scope[1], user_id=scope[0])
        if document_too_deep(memory):
            logger.error("memory for scope %s nests deeper than %d levels, not saved", scope, MAX_NESTING)
            return False
        document = dict(memory)
        document["lastUpdated"] = utc_now_iso_z()
        try:
            text = json.dumps(document, ensure_ascii=False, indent=2)
            data = text.encode("utf-8")  # a lone surrogate fails here, before anything is written
        except (TypeError, ValueError) as exc:
            logger.error("memory for scope %s is not JSON-serialisable, not saved: %s", scope, exc)
            return False
        try:
            stamp = _write_atomically(path, data)
        except OSError as exc:
            logger.error("failed to save memory to %s: %s", path, exc)
            return False
        with self._lock:
            self._cache[scope] = (stamp, json.loads(text))
        return True

    def _read(self, scope: Scope, *, use_cache: bool) -> MemoryDocument:
        path = self.path_for(scope[1], user_id=scope[0])
        try:
            stat = path.stat()
        except FileNotFoundError:
            with self._lock:
                self._cache.pop(scope, None)
            return unstored_memory()
        stamp = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        if use_cache:
            with self._lock:
                cached = self._cache.get(scope)
            if cached is not None and cached[0] == stamp:
                return copy.deepcopy(cached[1])
        document = _parse_file(path)
        with self._lock:
            self._cache[scope] = (stamp, document)
        return copy.deepcopy(document)


def _parse_file(path: Path) -> MemoryDocument:
    """Parse a document file; a corrupt one reads as empty and stays on disk for inspection."""
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        logger.warning(
            "memory file %s is unreadable (%s); treating it as empty until the next save", path, exc
        )
        return create_empty_memory()
    if not isinstance(loaded, dict):
        logger.warning(
            "memory file %s holds a %s, not a document; treating it as empty until the next save",
            path,
            type(loaded).__name__,
        )
        return create_empty_memory()
    return loaded


def _write_atomically(path: Path, data: bytes) -> _FileStamp:
    """Write via a unique temp file, fsync, rename, fsync the directory; readers never see a torn file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=".memory.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
            # Stat the file we wrote, not the path: another writer may replace it right after.
            stat = os.fstat(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return (stat.st_ino, stat.st_mtime_ns, stat.st_size)
