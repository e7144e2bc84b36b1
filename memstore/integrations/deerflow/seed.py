"""DeerFlow's seed storage contract (``memory.storage_class``) kept in memstore's SQL provider.

``SeedStore`` is the logic; ``memstore.integrations.deerflow.MemstoreStorage`` is the same class
with DeerFlow's ``MemoryStorage`` ABC mixed in, built when DeerFlow looks it up. What it adds over
a bare ``SqlMemoryStorage``:

- **No bookkeeping in DeerFlow's view.** memstore's ``revision`` and scope incarnation would end
  up in DeerFlow's update prompt and API responses. A loaded document carries them out of sight,
  as an attribute of the returned dict and of its ``user`` section (DeerFlow's updater deep-copies
  the document; its fact endpoints shallow-copy it and keep ``user``), and ``save`` puts them back.
  So DeerFlow's saves still merge with concurrent writers instead of overwriting them. A document
  that arrives without them (an import) replaces the scope, as it does with DeerFlow's files.
- **Clear is memstore's clear.** DeerFlow clears by saving an empty document; that becomes
  ``SqlMemoryStorage.clear``: it stamps ``cleared_at``, so an update captured before the clear
  cannot refill the scope; the facts become audited tombstones, as any deletion does, until
  ``memstore vacuum`` purges them.
- **Ids.** DeerFlow's user ids, already normalised by DeerFlow, are stored as they are where
  memstore can hold them, so ``memstore show --user`` finds a user by DeerFlow's id or by the
  identity it came from; DeerFlow's fallback user ``default`` is memstore's fallback user. The
  mapping stays injective; see ``users.py``.
- **Caps.** ``max_facts`` is DeerFlow's ``memory.max_facts``, not memstore's default.
- **Duplicates.** A new manual fact that memstore's dedup drops makes ``save`` return ``False``,
  so DeerFlow does not report as created a fact that was not stored.
- **Outages.** A save that meets an outage returns ``False`` (it is not durable) and is kept in a
  bounded buffer (``replay.py``) that the next call replays, merged, once the database is back.
- **Memory-record keys.** Unless ``deerflow_record_fields`` is on, a fact's ``importance``,
  ``tags``... are left out of what DeerFlow sees; the token keeps them per fact id, and ``save``
  puts them back on each fact that still carries its id (``record_view.py``).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from memstore.document import HISTORY_SECTIONS, USER_SECTIONS, MemoryDocument
from memstore.errors import StaleDocumentError, StorageUnavailableError
from memstore.integrations.deerflow.opening import LazySql, logs_outage
from memstore.integrations.deerflow.record_view import (
    Hidden,
    hidden_by_unchanged_content,
    hidden_of,
    restore_facts,
    shows_record_fields,
    without_record_keys,
)
from memstore.integrations.deerflow.replay import DEFAULT_REPLAY_LIMIT, PendingSave, ReplayBuffer
from memstore.integrations.deerflow.users import memstore_user_id
from memstore.storage.sql.documents.codec import INCARNATION_KEY

logger = logging.getLogger("memstore.integrations.deerflow")

SEED_SETTING = "memory.storage_class"
ORIGIN = "deerflow"
HIDDEN_KEYS = ("revision", INCARNATION_KEY)
TOKEN_ATTRIBUTE = "memstore_token"


@dataclass(frozen=True)
class LoadToken:
    """What a loaded document was read at, kept out of DeerFlow's sight."""

    revision: int
    incarnation: str | None
    loaded_at: datetime
    fact_ids: frozenset[str]
    hidden: Mapping[str, Hidden] = field(default_factory=dict, hash=False)
    """The memory-record keys left out of each fact DeerFlow was shown, by fact id."""


class _Tracked(dict[str, Any]):
    """A plain dict to DeerFlow (JSON, pydantic, ``dict()``) that also carries a ``LoadToken``.

    ``copy.deepcopy`` keeps the attribute; ``dict(document)`` drops it on the copy, but that copy
    still holds this ``user`` section, which carries the token too.
    """

    memstore_token: LoadToken | None = None


def _tracked(value: dict[str, Any], token: LoadToken) -> _Tracked:
    tracked = _Tracked(value)
    tracked.memstore_token = token
    return tracked


def token_of(document: object) -> LoadToken | None:
    """The load token of a document DeerFlow hands back, from the dict or its ``user`` section."""
    if not isinstance(document, dict):
        return None
    token = getattr(document, TOKEN_ATTRIBUTE, None)
    if token is None:
        token = getattr(document.get("user"), TOKEN_ATTRIBUTE, None)
    return token if isinstance(token, LoadToken) else None


def _is_blank(document: dict[str, Any]) -> bool:
    """DeerFlow's ``create_empty_memory()``: no facts and no summary text anywhere."""
    if document.get("facts"):
        return False
    for group, names in (("user", USER_SECTIONS), ("history", HISTORY_SECTIONS)):
        sections = document.get(group)
        if not isinstance(sections, dict):
            continue
        for name in names:
            section = sections.get(name)
            if isinstance(section, dict) and section.get("summary"):
                return False
    return True


def _deerflow_max_facts() -> int | None:
    """DeerFlow's ``memory.max_facts`` where DeerFlow's config is importable, else memstore's own."""
    try:
        config_module = importlib.import_module("deerflow.config.memory_config")
    except ImportError:
        return None
    value = getattr(config_module.get_memory_config(), "max_facts", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class SeedStore:
    """``load``/``reload``/``save`` with DeerFlow's seed signatures, over ``SqlMemoryStorage``.

    The constructor never raises and never touches the database (DeerFlow would silently fall
    back to files); ``database_url`` and ``max_facts`` default to memstore's configured URL and
    DeerFlow's ``memory.max_facts``; ``tenant_id`` (default: the default tenant) is the tenant it serves.
    ``record_fields`` (default: memstore's ``deerflow_record_fields``) shows DeerFlow the
    memory-record keys.
    """

    setting = SEED_SETTING

    def __init__(
        self,
        *,
        database_url: str | None = None,
        max_facts: int | None = None,
        replay_limit: int = DEFAULT_REPLAY_LIMIT,
        tenant_id: str | None = None,
        record_fields: bool | None = None,
    ) -> None:
        self._record_fields = record_fields
        self._sql = LazySql(
            self.setting,
            database_url=database_url,
            max_facts=(lambda: max_facts) if max_facts is not None else _deerflow_max_facts,
            tenant_id=tenant_id,
        )
        self._replay = ReplayBuffer(replay_limit)

    @property
    def pending_replays(self) -> int:
        """Saves kept through an outage and not yet replayed."""
        return len(self._replay)

    def replay_pending(self, *, force: bool = True) -> int:
        """Replay kept saves now; returns how many are still pending (the database is still away)."""
        return self._replay.replay(self._replay_one, force=force)

    @logs_outage("load")
    def load(self, agent_name: str | None = None, *, user_id: str | None = None) -> dict[str, Any]:
        self._replay.replay(self._replay_one)
        return self._present(self._sql.get().load(agent_name, user_id=self._user(user_id)))

    @logs_outage("reload")
    def reload(self, agent_name: str | None = None, *, user_id: str | None = None) -> dict[str, Any]:
        self._replay.replay(self._replay_one)
        return self._present(self._sql.get().reload(agent_name, user_id=self._user(user_id)))

    @logs_outage("save")
    def save(
        self, memory_data: dict[str, Any], agent_name: str | None = None, *, user_id: str | None = None
    ) -> bool:
        """``True`` once durable; ``False`` when refused, a duplicate was dropped, or kept for replay.

        A clear (DeerFlow's empty save) is not kept: one that meets an outage raises.
        """
        user = self._user(user_id)
        token = token_of(memory_data)
        if token is None and _is_blank(memory_data):
            return self._clear(agent_name, user)
        document: dict[str, Any] = {k: v for k, v in memory_data.items() if k not in HIDDEN_KEYS}
        if token is not None:
            document["revision"] = token.revision
            if token.incarnation is not None:
                document[INCARNATION_KEY] = token.incarnation
            if "facts" in document:
                document["facts"] = restore_facts(document["facts"], token.hidden)
        pending = PendingSave(
            document,
            agent_name,
            user,
            token.loaded_at if token is not None else datetime.now(UTC),
            restore_stored=token is None and not shows_record_fields(self._record_fields),
        )
        self._replay.replay(self._replay_one)
        try:
            saved = self._save_now(pending)
        except StorageUnavailableError as exc:
            self._replay.keep(pending)
            logger.error(
                "memstore: database unreachable, memory update for user %s kept for replay (%d pending): %s",
                user,
                len(self._replay),
                exc,
            )
            return False
        return saved and not self._dropped_manual_facts(document, token, agent_name, user)

    def close(self) -> None:
        """Try once more to replay kept saves, then forget cached documents."""
        left = self._replay.replay(self._replay_one, force=True)
        if left:
            logger.error("memstore: %d memory updates kept through an outage are lost at close", left)
        storage = self._sql.opened
        if storage is not None:
            storage.close()

    # -- internals ----------------------------------------------------------------------------

    _user = staticmethod(memstore_user_id)

    def _present(self, stored: MemoryDocument) -> dict[str, Any]:
        """memstore's document as DeerFlow sees it: bookkeeping and record keys kept in a ``LoadToken``."""
        revision = stored.get("revision")
        incarnation = stored.get(INCARNATION_KEY)
        facts = list(stored.get("facts", []))
        hidden: dict[str, Hidden] = {}
        if not shows_record_fields(self._record_fields):
            for position, fact in enumerate(facts):
                keys = hidden_of(fact)
                if keys:
                    hidden[str(fact.get("id"))] = keys
                    facts[position] = without_record_keys(fact)
        token = LoadToken(
            revision=revision if isinstance(revision, int) else 0,
            incarnation=incarnation if isinstance(incarnation, str) else None,
            loaded_at=datetime.now(UTC),
            fact_ids=frozenset(str(fact.get("id")) for fact in facts),
            hidden=hidden,
        )
        visible = {k: v for k, v in stored.items() if k not in HIDDEN_KEYS}
        if "facts" in visible:
            visible["facts"] = facts
        if isinstance(visible.get("user"), dict):
            visible["user"] = _tracked(visible["user"], token)
        return _tracked(visible, token)

    def _save_now(self, pending: PendingSave) -> bool:
        if pending.restore_stored:
            pending = self._with_stored_record_keys(pending)
        try:
            return self._sql.get().save(
                pending.document,
                pending.agent_name,
                user_id=pending.user_id,
                origin=ORIGIN,
                captured_at=pending.captured_at,
            )
        except StaleDocumentError as exc:
            logger.warning("memstore: memory update for user %s not saved: %s", pending.user_id, exc)
            return False

    def _replay_one(self, pending: PendingSave) -> bool:
        return self._save_now(pending)

    def _with_stored_record_keys(self, pending: PendingSave) -> PendingSave:
        """A document without a token: its facts with the stored id and content get back their
        hidden record keys (read now, so a save kept through an outage reads them at its replay)."""
        facts = pending.document.get("facts")
        if not isinstance(facts, list) or not facts:
            return replace(pending, restore_stored=False)
        stored = self._sql.get().reload(pending.agent_name, user_id=pending.user_id).get("facts", [])
        document = dict(pending.document)
        document["facts"] = restore_facts(facts, hidden_by_unchanged_content(facts, stored))
        return replace(pending, document=document, restore_stored=False)

    def _clear(self, agent_name: str | None, user: str | None) -> bool:
        self._replay.replay(self._replay_one)
        return self._sql.get().clear(agent_name, user_id=user)

    def _dropped_manual_facts(
        self, document: dict[str, Any], token: LoadToken | None, agent_name: str | None, user: str | None
    ) -> bool:
        """Whether a new manual fact in ``document`` was dropped by memstore (a duplicate)."""
        known = token.fact_ids if token is not None else frozenset()
        new_manual = {
            str(fact.get("id"))
            for fact in document.get("facts", [])
            if isinstance(fact, dict) and fact.get("source") == "manual" and str(fact.get("id")) not in known
        }
        if not new_manual:
            return False
        stored = {
            str(fact.get("id")) for fact in self._sql.get().load(agent_name, user_id=user).get("facts", [])
        }
        dropped = new_manual - stored
        if dropped:
            logger.warning(
                "memstore: manual fact %s not stored for user %s: the same content is already stored",
                ", ".join(sorted(dropped)),
                user,
            )
        return bool(dropped)
