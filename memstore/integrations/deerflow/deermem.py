"""DeerMem's storage contract (DeerFlow HEAD, ``memory.backend_config.storage_class``) over memstore.

``DeerMemStore`` is the logic; ``memstore.integrations.deerflow.DeerMemStorage`` mixes in DeerMem's
``MemoryStorage`` ABC and its conflict exceptions when DeerMem loads it.

Scopes. DeerMem keeps summaries per user and facts per (user, agent bucket). The summaries and the
``__default__`` bucket (DeerMem's name for "no agent") live in memstore's ``(user, None)`` scope,
the user's own memory, which is also where the seed adapter and ``memstore show --user`` find it;
a named agent's facts live in ``(user, agent)``, with the user's summaries shown alongside.

Revisions. A document's ``revision`` counts the writes to what it shows: memstore's revision of
the user scope for ``agent_name`` None or ``__default__``; for a named agent, the user scope's
plus the agent scope's, since its document shows the user's summaries too and DeerMem's updater
sends them back with the agent's facts. Both only grow, so the sum is unchanged exactly when
neither scope was written. A save or change set whose ``expected_revision`` /
``expected_manifest_revision`` differs from that count raises DeerMem's
``MemoryManifestRevisionConflict``; an upserted fact whose expected revision does not hold raises
``MemoryFactRevisionConflict``, and an upsert that names no revision (in ``upsertRevisions`` or
on the fact) is a create, refused when the id exists, as DeerMem does. Where memstore merges
instead: (1) an agent's count leaves out the other agents, so writers of different agents do not
conflict (DeerMem's single per-user revision would); (2) a writer that commits between the check
and the write is merged by memstore's rules (both sides' new facts kept, deletions honoured), not
refused; (3) a ``save`` without ``expected_revision`` merges from the revision its document
carries, where DeerMem's files would overwrite.

Hooks. ``record_fact_accesses`` (DeerMem calls it for the facts it injected) counts an access
in memstore's access tracking (``memstore.storage.sql.documents.access``: in memory, written in batches).
``get_fact_usage`` writes the pending batch and reads the same columns back (``accessHeat`` and
``accessCount`` are the access count; DeerMem decays the heat), so DeerMem's ``hybrid-v1``
capacity score sees every access, including one recorded a moment before. ``record_capacity_eviction``
puts DeerMem's score and its parts on the audit rows of the deletions its save made
(``memory_history.detail``). ``clear_fact_metadata`` does nothing: a deleted fact's signals go
with its row. ``search_facts`` (DeerMem's retrieval hook, behind its ``memory_search`` tool) ranks
each scope's facts with memstore's hybrid or semantic search when embeddings are configured, by
BM25 otherwise. DeerMem's injection (``get_context``) carries no query, so it stays in DeerMem's
confidence order.

Memory-record keys. Unless ``deerflow_record_fields`` is on, every fact DeerMem is handed leaves
out ``importance``, ``tags``...; a fact it writes back gets them back from the stored fact it was
read from (``record_view.py``), before DeerMem's revision rule compares it, so hiding them neither
drops them nor bumps a revision.
"""

from __future__ import annotations

import copy
import logging
import uuid
from typing import Any, cast

from memstore.document import MemoryDocument
from memstore.errors import RevisionConflictError, StorageWriteError
from memstore.integrations.deerflow.deermem_facts import (
    check_fact,
    fact_revision,
    next_version,
    to_deermem,
    to_memstore,
)
from memstore.integrations.deerflow.deermem_hooks import DEFAULT_AGENT_BUCKET, DeerMemHooks
from memstore.integrations.deerflow.opening import LazySql, logs_outage
from memstore.integrations.deerflow.record_view import (
    hidden_of,
    restored,
    same_content,
    shows_record_fields,
    without_record_keys,
)
from memstore.integrations.deerflow.users import DeerFlowUserError, memstore_user_id
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.documents.codec import INCARNATION_KEY

logger = logging.getLogger("memstore.integrations.deerflow")

DEERMEM_SETTING = "memory.backend_config.storage_class"
ORIGIN = "deermem"


class DeerMemStore(DeerMemHooks):
    """DeerMem's ``MemoryStorage`` methods over ``SqlMemoryStorage``; built from a ``DeerMemConfig``.

    ``manifest_conflict`` and ``fact_conflict`` are the exceptions raised on a revision mismatch;
    the DeerFlow-facing subclass sets them to types that are also DeerMem's own. Of the config it
    reads ``max_facts`` and ``strict_user_scope`` (every call must name a user, as in DeerMem);
    ``tenant_id`` (default: the default tenant) is the tenant every call acts in; ``record_fields``
    (default: memstore's ``deerflow_record_fields``) shows DeerMem the memory-record keys.
    """

    setting = DEERMEM_SETTING
    manifest_conflict: type[RevisionConflictError] = RevisionConflictError
    fact_conflict: type[RevisionConflictError] = RevisionConflictError

    def __init__(
        self,
        config: object = None,
        retrieval: object = None,
        *,
        database_url: str | None = None,
        tenant_id: str | None = None,
        record_fields: bool | None = None,
    ) -> None:
        self._record_fields = record_fields
        max_facts = getattr(config, "max_facts", None)
        self._strict_user_scope = getattr(config, "strict_user_scope", False) is True
        self._sql = LazySql(
            self.setting,
            database_url=database_url,
            max_facts=lambda: max_facts if isinstance(max_facts, int) else None,
            tenant_id=tenant_id,
        )

    # -- the abstract contract ------------------------------------------------------------------

    @logs_outage("load")
    def load(self, agent_name: str | None = None, *, user_id: str | None = None) -> dict[str, Any]:
        return self._document(agent_name, user_id, fresh=False)

    @logs_outage("reload")
    def reload(self, agent_name: str | None = None, *, user_id: str | None = None) -> dict[str, Any]:
        return self._document(agent_name, user_id, fresh=True)

    @logs_outage("save")
    def save(
        self,
        memory_data: dict[str, Any],
        agent_name: str | None = None,
        *,
        user_id: str | None = None,
        expected_revision: int | None = None,
    ) -> bool:
        """Update the summaries (``agent_name`` None) or replace one bucket's facts; ``False`` when refused.

        As in DeerMem: an agent's save must carry its ``facts`` (without them it would delete them
        all), and the summary groups it carries update the stored ones section by section.
        """
        user = self._user(user_id)
        if not isinstance(memory_data, dict):
            logger.error("DeerMem memory not saved: memory_data must be an object")
            return False
        if agent_name is not None and "facts" not in memory_data:
            logger.error("DeerMem memory not saved: an agent's save must carry its facts")
            return False
        facts = memory_data.get("facts", [])
        if not isinstance(facts, list) or any(not isinstance(fact, dict) for fact in facts):
            logger.error("DeerMem memory not saved: facts must be a list of objects")
            return False
        if agent_name is None and facts:
            logger.error("DeerMem memory not saved: agent_name is required to persist facts")
            return False
        try:
            for fact in facts:
                check_fact(fact)
        except ValueError as exc:
            logger.error("DeerMem memory not saved: %s", exc)
            return False
        agent = self._bucket(agent_name)
        sql = self._sql.get()
        own = sql.reload(None, user_id=user)
        current = own if agent is None else sql.reload(agent, user_id=user)
        self._check_manifest(self._revision(own, current, agent), expected_revision)
        loaded_at = (
            current.get("revision")
            if expected_revision is not None
            else self._scope_revision(memory_data.get("revision"), own, agent)
        )
        document = self._base(current, loaded_at)
        if agent_name is None:
            summaries: dict[str, Any] = {g: memory_data[g] for g in ("user", "history") if g in memory_data}
            try:
                self._apply_summaries(document, summaries)
            except ValueError as exc:
                logger.error("DeerMem memory not saved: %s", exc)
                return False
        else:
            existing = {str(f.get("id")): to_deermem(f, {}) for f in current.get("facts", [])}
            document["facts"] = []
            for fact in facts:
                stored = existing.get(str(fact.get("id")))
                # Read from ``stored``: DeerMem's per-fact revision says so, or the content is unchanged.
                read = stored is not None and (
                    fact_revision(fact) == fact_revision(stored) or same_content(fact, stored)
                )
                kept = self._restored(fact, stored) if read else fact
                document["facts"].append(to_memstore(next_version(kept, stored)))
        return sql.save(document, agent, user_id=user, origin=ORIGIN)

    # -- DeerMem's optional repository methods --------------------------------------------------

    @logs_outage("change set")
    def apply_changes(
        self,
        change_set: dict[str, Any],
        *,
        user_id: str | None = None,
        agent_name: str | None = None,
        expected_manifest_revision: int | None = None,
        allow_manifest_rebase: bool = False,
    ) -> dict[str, Any]:
        """Apply fact upserts and deletes (and summaries) as one memstore save per scope touched.

        The facts, and the summaries when the bucket is ``__default__``, commit in one transaction
        that writes only the changed rows; summaries sent with a named agent's facts are a second
        transaction on the user's scope, after the facts. ``expected_manifest_revision`` is checked
        against the document's count (see the module), so stale summaries sent with a named agent's
        facts are refused like stale facts.
        """
        upserts = change_set.get("upserts") or []
        deletes = [str(fact_id) for fact_id in change_set.get("deletes") or []]
        summaries = change_set.get("summaries")
        upsert_revisions = change_set.get("upsertRevisions") or {}
        delete_revisions = change_set.get("deleteRevisions") or {}
        if not isinstance(upserts, list) or any(not isinstance(fact, dict) for fact in upserts):
            raise ValueError("change_set.upserts must be a list of fact objects")
        if (upserts or deletes) and agent_name is None:
            raise ValueError("agent_name is required for fact repository changes")
        if summaries is not None and not isinstance(summaries, dict):
            raise ValueError("change_set.summaries must be an object")
        user = self._user(user_id)
        agent = self._bucket(agent_name)
        sql = self._sql.get()
        own = sql.reload(None, user_id=user)
        current = own if agent is None else sql.reload(agent, user_id=user)
        if not (allow_manifest_rebase and summaries is None and (upserts or deletes)):
            self._check_manifest(self._revision(own, current, agent), expected_manifest_revision)
        scope = self._scope(user_id, agent_name)
        facts = {str(f.get("id")): to_deermem(f, scope) for f in current.get("facts", [])}
        upserted = self._upserts(upserts, upsert_revisions, facts, scope)
        deleted = self._deletes(deletes, delete_revisions, facts, set(upserted))
        for fact_id in deleted:
            del facts[fact_id]
        facts.update(upserted)
        document = self._base(current, current.get("revision"))
        document["facts"] = [to_memstore(fact) for fact in facts.values()]
        own_summaries = summaries is not None and agent is None
        if own_summaries:
            self._apply_summaries(document, cast(dict[str, Any], summaries))
        if (upserted or deleted or own_summaries) and not sql.save(
            document, agent, user_id=user, origin=ORIGIN
        ):
            raise StorageWriteError(f"memstore refused the DeerMem change set for user {user_id!r}")
        if summaries is not None and not own_summaries:
            self._save_summaries(sql, user, own, cast(dict[str, Any], summaries))
        stored_own = sql.load(None, user_id=user)
        stored = stored_own if agent is None else sql.load(agent, user_id=user)
        return {
            "complete": False,
            "version": stored.get("version", "1.0"),
            "revision": self._revision(stored_own, stored, agent),
            "lastUpdated": stored.get("lastUpdated", ""),
            "upsertedFacts": [self._shown(fact) for fact in upserted.values()],
            "deletedFactIds": deleted,
        }

    @logs_outage("clear")
    def clear_all(self, *, user_id: str | None = None) -> dict[str, Any]:
        """memstore's clear of every scope of the user: summaries and every agent bucket."""
        user = self._user(user_id)
        sql = self._sql.get()
        scopes = {agent for scope_user, agent in sql.list_scopes(user) if scope_user == user} | {None}
        for agent in sorted(scopes, key=lambda name: name or ""):
            if not sql.clear(agent, user_id=user):
                raise StorageWriteError(f"memstore could not clear agent {agent!r} of user {user_id!r}")
        return self._document(DEFAULT_AGENT_BUCKET, user_id, fresh=True)

    @logs_outage("fact read")
    def get_fact(
        self, fact_id: str, *, user_id: str | None = None, agent_name: str | None = None
    ) -> dict[str, Any] | None:
        if agent_name is None:
            raise ValueError("agent_name is required to get a fact")
        facts = self._document(agent_name, user_id, fresh=True)["facts"]
        return next((fact for fact in facts if fact.get("id") == fact_id), None)

    def close(self) -> None:
        storage = self._sql.opened
        if storage is not None:
            storage.close()

    # -- internals ------------------------------------------------------------------------------

    def _user(self, user_id: str | None) -> str | None:
        """The memstore user of a DeerFlow user id (``users.py``); none at all is refused when strict."""
        if user_id is None and self._strict_user_scope:
            raise DeerFlowUserError("user_id is required when strict_user_scope is enabled")
        return memstore_user_id(user_id)

    @staticmethod
    def _bucket(agent_name: str | None) -> str | None:
        """memstore's agent for a DeerMem bucket: ``__default__`` (and None) is the user's own scope."""
        return None if agent_name in (None, DEFAULT_AGENT_BUCKET) else agent_name

    @staticmethod
    def _scope(user_id: str | None, agent_name: str | None) -> dict[str, str | None]:
        return {"userId": user_id, "agentName": agent_name}

    def _shown(self, fact: dict[str, Any]) -> dict[str, Any]:
        """A fact as DeerMem is handed it: without the memory-record keys unless they are shown."""
        return fact if shows_record_fields(self._record_fields) else without_record_keys(fact)

    def _restored(self, fact: dict[str, Any], stored: dict[str, Any] | None) -> dict[str, Any]:
        """``fact``, read from ``stored``, with the record keys DeerMem was not shown put back."""
        if stored is None or shows_record_fields(self._record_fields):
            return fact
        return restored(fact, hidden_of(stored))

    def _document(
        self, agent_name: str | None, user_id: str | None, *, fresh: bool, shown: bool = True
    ) -> dict[str, Any]:
        """The document DeerMem reads; ``shown=False`` keeps the record keys (for memstore's ranking)."""
        user = self._user(user_id)
        agent = self._bucket(agent_name)
        sql = self._sql.get()
        read = sql.reload if fresh else sql.load
        own = read(None, user_id=user)
        bucket = own if agent is None else read(agent, user_id=user)
        scope = self._scope(user_id, agent_name)
        facts = [] if agent_name is None else [to_deermem(f, scope) for f in bucket.get("facts", [])]
        if shown:
            facts = [self._shown(fact) for fact in facts]
        return {
            "version": own.get("version", "1.0"),
            "revision": self._revision(own, bucket, agent),
            "lastUpdated": bucket.get("lastUpdated") or own.get("lastUpdated") or "",
            "user": own["user"],
            "history": own["history"],
            "facts": facts,
        }

    @staticmethod
    def _revision(own: MemoryDocument, bucket: MemoryDocument, agent: str | None) -> int:
        """A document's revision: the user scope's, plus the agent scope's for a named agent."""
        revision = int(own.get("revision", 0))
        return revision if agent is None else revision + int(bucket.get("revision", 0))

    @staticmethod
    def _scope_revision(revision: object, own: MemoryDocument, agent: str | None) -> object:
        """The revision of the scope a save writes that a document's ``revision`` was read at.

        A named agent's count includes the user scope, taken as it is now: exact unless the
        summaries changed since, and then lower, so memstore keeps as concurrent the facts added
        in between rather than taking them as deleted by this save.
        """
        if agent is None or not isinstance(revision, int) or isinstance(revision, bool):
            return revision
        return max(0, revision - int(own.get("revision", 0)))

    def _check_manifest(self, stored: int, expected: int | None) -> None:
        if expected is not None and expected != stored:
            raise self.manifest_conflict(f"Expected user-memory revision {expected}, found {stored}")

    @staticmethod
    def _base(current: MemoryDocument, revision: object) -> dict[str, Any]:
        """``current`` as a memstore save of a document loaded at ``revision`` (a merge base)."""
        document: dict[str, Any] = copy.deepcopy(dict(current))
        if isinstance(revision, int) and not isinstance(revision, bool):
            document["revision"] = min(revision, int(current.get("revision", 0)))
        if document.get("revision") != current.get("revision"):
            document.pop(INCARNATION_KEY, None)
        return document

    def _upserts(
        self,
        upserts: list[dict[str, Any]],
        expected: dict[str, Any],
        facts: dict[str, dict[str, Any]],
        scope: dict[str, str | None],
    ) -> dict[str, dict[str, Any]]:
        upserted: dict[str, dict[str, Any]] = {}
        for incoming in upserts:
            fact_id = str(incoming.get("id") or f"fact_{uuid.uuid4().hex}")
            if fact_id in upserted:
                raise ValueError(f"Duplicate fact id {fact_id!r} in upserts")
            existing = facts.get(fact_id)
            want = expected[fact_id] if fact_id in expected else incoming.get("revision")
            if want is not None and (isinstance(want, bool) or not isinstance(want, int) or want < 1):
                raise ValueError("change_set.upsertRevisions values must be null or integers >= 1")
            found = fact_revision(existing)
            if want is None and found is not None:
                raise self.fact_conflict(f"Fact {fact_id!r} must not already exist")
            if want != found:
                raise self.fact_conflict(f"Expected fact {fact_id!r} revision {want}, found {found}")
            check_fact(incoming)
            candidate = {k: v for k, v in incoming.items() if k != "revision"} | {"id": fact_id}
            if existing is not None:
                candidate["revision"] = fact_revision(existing)
            fact = next_version(self._restored(candidate, existing), existing)
            fact["scope"] = dict(scope)
            if fact != existing:
                upserted[fact_id] = fact
        return upserted

    def _deletes(
        self,
        deletes: list[str],
        expected: dict[str, Any],
        facts: dict[str, dict[str, Any]],
        upserted: set[str],
    ) -> list[str]:
        deleted: list[str] = []
        for fact_id in deletes:
            if fact_id in upserted:
                raise ValueError(f"Fact {fact_id!r} cannot be upserted and deleted together")
            existing = facts.get(fact_id)
            if existing is None:
                continue
            if fact_id in expected and expected[fact_id] != fact_revision(existing):
                raise self.fact_conflict(
                    f"Expected fact {fact_id!r} revision {expected[fact_id]}, found {fact_revision(existing)}"
                )
            deleted.append(fact_id)
        return deleted

    @staticmethod
    def _apply_summaries(document: dict[str, Any], summaries: dict[str, Any]) -> None:
        for group in ("user", "history"):
            if group in summaries:
                if not isinstance(summaries[group], dict):
                    raise ValueError(f"change_set.summaries.{group} must be an object")
                document[group] = {**document[group], **copy.deepcopy(summaries[group])}

    def _save_summaries(
        self, sql: SqlMemoryStorage, user: str | None, own: MemoryDocument, summaries: dict[str, Any]
    ) -> None:
        """Summaries sent with a named agent's facts, onto the user scope as ``own`` was checked."""
        document = self._base(own, own.get("revision"))
        self._apply_summaries(document, summaries)
        if not sql.save(document, None, user_id=user, origin=ORIGIN):
            raise StorageWriteError(f"memstore refused the DeerMem summaries for user {user!r}")
