"""DeerMem's storage contract (DeerFlow HEAD, ``memory.backend_config.storage_class``) over memstore.

``DeerMemStore`` is the logic; ``memstore.integrations.deerflow.DeerMemStorage`` mixes in DeerMem's
``MemoryStorage`` ABC and its conflict exceptions when DeerMem loads it.

Scopes. DeerMem keeps summaries per user and facts per (user, agent bucket). The summaries and the
``__default__`` bucket (DeerMem's name for "no agent") live in memstore's ``(user, None)`` scope,
the user's own memory, which is also where the seed adapter and ``memstore show --user`` find it;
a named agent's facts live in ``(user, agent)``, with the user's summaries shown alongside.

Revisions. A document's ``revision`` is memstore's revision of the scope its save writes: the
user scope for ``agent_name`` None or ``__default__``, the agent's scope otherwise. A save or
change set whose ``expected_revision`` / ``expected_manifest_revision`` differs from the stored
one raises DeerMem's ``MemoryManifestRevisionConflict``; a fact whose expected revision (or
expected absence) does not hold raises ``MemoryFactRevisionConflict``. Where memstore merges
instead: (1) revisions are per scope, so a write to one agent's facts does not conflict with a
writer of another agent or of the summaries (DeerMem's single per-user revision would); (2) a
writer that commits between the check and the write is merged by memstore's rules (both sides'
new facts kept, deletions honoured), not refused; (3) a ``save`` without ``expected_revision``
merges from the revision its document carries, where DeerMem's files would overwrite.

Hooks. ``record_fact_accesses`` (DeerMem calls it for the facts it injected) counts an access
in memstore's access tracking (``memstore.storage.sql.access``: in memory, written in batches).
``get_fact_usage`` reads the same columns back (``accessHeat`` is the access count; DeerMem decays
it), so DeerMem's ``hybrid-v1`` capacity score sees real accesses. ``record_capacity_eviction``
puts DeerMem's score and its parts on the audit rows of the deletions its save made
(``memory_history.detail``). ``clear_fact_metadata`` does nothing: a deleted fact's signals go
with its row. ``search_facts`` (DeerMem's retrieval hook, behind its ``memory_search`` tool) ranks
each scope's facts with memstore's hybrid or semantic search when embeddings are configured, by
BM25 otherwise. DeerMem's injection (``get_context``) carries no query, so it stays in DeerMem's
confidence order.
"""

from __future__ import annotations

import copy
import logging
import math
from datetime import datetime
from typing import Any, cast

from memstore.config import get_memory_config
from memstore.document import MemoryDocument, format_timestamp
from memstore.errors import RevisionConflictError, StorageWriteError
from memstore.inject.relevance import bm25_scores, ranked_order
from memstore.integrations.deerflow.deermem_facts import fact_revision, next_version, to_deermem, to_memstore
from memstore.integrations.deerflow.opening import LazySql
from memstore.integrations.deerflow.users import memstore_user_id
from memstore.ops.facts import rank_by_meaning
from memstore.scope import resolve_scope
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.codec import INCARNATION_KEY

logger = logging.getLogger("memstore.integrations.deerflow")

DEERMEM_SETTING = "memory.backend_config.storage_class"
DEFAULT_AGENT_BUCKET = "__default__"
ORIGIN = "deermem"


class DeerMemStore:
    """DeerMem's ``MemoryStorage`` methods over ``SqlMemoryStorage``; built from a ``DeerMemConfig``.

    ``manifest_conflict`` and ``fact_conflict`` are the exceptions raised on a revision mismatch;
    the DeerFlow-facing subclass sets them to types that are also DeerMem's own.
    """

    setting = DEERMEM_SETTING
    manifest_conflict: type[RevisionConflictError] = RevisionConflictError
    fact_conflict: type[RevisionConflictError] = RevisionConflictError

    def __init__(
        self, config: object = None, retrieval: object = None, *, database_url: str | None = None
    ) -> None:
        max_facts = getattr(config, "max_facts", None)
        self._sql = LazySql(
            self.setting,
            database_url=database_url,
            max_facts=lambda: max_facts if isinstance(max_facts, int) else None,
        )

    # -- the abstract contract ------------------------------------------------------------------

    def load(self, agent_name: str | None = None, *, user_id: str | None = None) -> dict[str, Any]:
        return self._document(agent_name, user_id, fresh=False)

    def reload(self, agent_name: str | None = None, *, user_id: str | None = None) -> dict[str, Any]:
        return self._document(agent_name, user_id, fresh=True)

    def save(
        self,
        memory_data: dict[str, Any],
        agent_name: str | None = None,
        *,
        user_id: str | None = None,
        expected_revision: int | None = None,
    ) -> bool:
        """Replace the summaries (``agent_name`` None) or one bucket's facts; ``False`` when refused."""
        facts = memory_data.get("facts", []) if isinstance(memory_data, dict) else None
        if not isinstance(facts, list) or any(not isinstance(fact, dict) for fact in facts):
            logger.error("DeerMem memory not saved: facts must be a list of objects")
            return False
        if agent_name is None and facts:
            logger.error("DeerMem memory not saved: agent_name is required to persist facts")
            return False
        user = self._user(user_id)
        agent = self._bucket(agent_name)
        sql = self._sql.get()
        current = sql.reload(agent, user_id=user)
        self._check_manifest(current, expected_revision)
        base = current if expected_revision is not None else memory_data
        document = self._base(current, base.get("revision"))
        if agent_name is None:
            document["user"] = copy.deepcopy(memory_data.get("user", current["user"]))
            document["history"] = copy.deepcopy(memory_data.get("history", current["history"]))
        if agent_name is not None:
            existing = {str(f.get("id")): to_deermem(f, {}) for f in current.get("facts", [])}
            document["facts"] = [
                to_memstore(next_version(fact, existing.get(str(fact.get("id"))))) for fact in facts
            ]
        return sql.save(document, agent, user_id=user, origin=ORIGIN)

    # -- DeerMem's optional repository methods --------------------------------------------------

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
        transaction on the user's scope, after the facts.
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
        current = sql.reload(agent, user_id=user)
        if not (allow_manifest_rebase and summaries is None and (upserts or deletes)):
            self._check_manifest(current, expected_manifest_revision)
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
            self._save_summaries(sql, user, cast(dict[str, Any], summaries))
        stored = sql.load(agent, user_id=user)
        return {
            "complete": False,
            "version": stored.get("version", "1.0"),
            "revision": stored.get("revision", 0),
            "lastUpdated": stored.get("lastUpdated", ""),
            "upsertedFacts": list(upserted.values()),
            "deletedFactIds": deleted,
        }

    def clear_all(self, *, user_id: str | None = None) -> dict[str, Any]:
        """memstore's clear of every scope of the user: summaries and every agent bucket."""
        user = self._user(user_id)
        sql = self._sql.get()
        scopes = {agent for scope_user, agent in sql.list_scopes(user) if scope_user == user} | {None}
        for agent in sorted(scopes, key=lambda name: name or ""):
            if not sql.clear(agent, user_id=user):
                raise StorageWriteError(f"memstore could not clear agent {agent!r} of user {user_id!r}")
        return self.reload(DEFAULT_AGENT_BUCKET, user_id=user_id)

    def get_fact(
        self, fact_id: str, *, user_id: str | None = None, agent_name: str | None = None
    ) -> dict[str, Any] | None:
        if agent_name is None:
            raise ValueError("agent_name is required to get a fact")
        facts = self.reload(agent_name, user_id=user_id)["facts"]
        return next((fact for fact in facts if fact.get("id") == fact_id), None)

    def get_fact_usage(self, *, agent_name: str, user_id: str | None = None) -> dict[str, dict[str, Any]]:
        """DeerMem's usage entries from memstore's access columns, for its hybrid capacity score.

        ``accessHeat`` is the access count: DeerMem decays it from ``lastAccessedAt`` itself.
        """
        signals = self._sql.get().fact_signals(self._bucket(agent_name), user_id=self._user(user_id))
        return {
            fact_id: {
                "lastAccessedAt": format_timestamp(signal.last_accessed_at),
                "accessHeat": float(signal.access_count),
            }
            for fact_id, signal in signals.items()
            if signal.last_accessed_at is not None and signal.access_count > 0
        }

    def record_fact_accesses(
        self,
        fact_ids: list[str],
        *,
        agent_name: str,
        user_id: str | None = None,
        accessed_at: datetime | None = None,
    ) -> None:
        """Count an access of the facts; ``accessed_at`` is ignored (the count is stamped on arrival)."""
        if fact_ids:
            self._sql.get().record_access(
                self._bucket(agent_name), user_id=self._user(user_id), fact_ids=[str(f) for f in fact_ids]
            )

    def record_capacity_eviction(
        self,
        decision: Any,
        *,
        max_facts: int,
        agent_name: str,
        user_id: str | None = None,
        occurred_at: datetime | None = None,
        shadow_decision: Any = None,
    ) -> None:
        """Put DeerMem's eviction scores on the audit rows of the deletions its save just made."""
        details = {
            str(evicted.fact_id): {
                "reason": "evicted",
                "policy": str(getattr(decision, "policy", "")),
                "max_facts": max_facts,
                "score": _finite(evicted.score),
                **{str(name): _finite(value) for name, value in dict(evicted.components).items()},
            }
            for evicted in getattr(decision, "evicted", ())
        }
        self._sql.get().annotate_removals(
            self._bucket(agent_name), user_id=self._user(user_id), details=details
        )

    def search_facts(
        self,
        query: str,
        *,
        scopes: list[dict[str, str | None]],
        top_k: int = 10,
        mode: str = "hybrid",
        filters: dict[str, Any] | None = None,
    ) -> list[dict[str, Any]]:
        """DeerMem's retrieval hook (its ``memory_search`` tool): memstore's ranking in each scope.

        ``hybrid`` and ``semantic`` rank by meaning with the configured ``embedding_provider``;
        with none (or ``mode`` ``fulltext``), by BM25 over the scope's facts. Results are
        DeerMem's ``{"fact", "score", "matchType"}``, best first; DeerMem counts their access.
        """
        text = query.strip() if isinstance(query, str) else ""
        if not text or top_k <= 0:
            return []
        category = (filters or {}).get("category")
        sql = self._sql.get()
        meaning = mode in ("hybrid", "semantic") and get_memory_config().embedding_provider != "none"
        found: list[dict[str, Any]] = []
        for scope in scopes:
            user, agent = scope.get("userId"), scope.get("agentName")
            facts = [
                fact
                for fact in self.reload(agent or DEFAULT_AGENT_BUCKET, user_id=user)["facts"]
                if category is None or fact.get("category") == category
            ]
            if meaning:
                where = resolve_scope(self._bucket(agent), self._user(user))
                ranked = rank_by_meaning(
                    sql, facts, text, "semantic" if mode == "semantic" else "hybrid", where
                )
            else:
                scores = bm25_scores(text, [str(fact.get("content", "")) for fact in facts])
                ranked = [(facts[i], scores[i]) for i in ranked_order([s if s > 0 else None for s in scores])]
            kind = mode if meaning else "fulltext"
            found += [{"fact": fact, "score": float(score), "matchType": kind} for fact, score in ranked]
        found.sort(key=lambda result: result["score"], reverse=True)
        return found[:top_k]

    def clear_fact_metadata(
        self, *, agent_name: str, user_id: str | None = None, fact_ids: list[str] | None = None
    ) -> None:
        """Documented no-op: there is no per-fact sidecar to clear."""

    def close(self) -> None:
        storage = self._sql.opened
        if storage is not None:
            storage.close()

    # -- internals ------------------------------------------------------------------------------

    _user = staticmethod(memstore_user_id)

    @staticmethod
    def _bucket(agent_name: str | None) -> str | None:
        """memstore's agent for a DeerMem bucket: ``__default__`` (and None) is the user's own scope."""
        return None if agent_name in (None, DEFAULT_AGENT_BUCKET) else agent_name

    @staticmethod
    def _scope(user_id: str | None, agent_name: str | None) -> dict[str, str | None]:
        return {"userId": user_id, "agentName": agent_name}

    def _document(self, agent_name: str | None, user_id: str | None, *, fresh: bool) -> dict[str, Any]:
        user = self._user(user_id)
        agent = self._bucket(agent_name)
        sql = self._sql.get()
        read = sql.reload if fresh else sql.load
        own = read(None, user_id=user)
        bucket = own if agent is None else read(agent, user_id=user)
        scope = self._scope(user_id, agent_name)
        facts = [] if agent_name is None else [to_deermem(f, scope) for f in bucket.get("facts", [])]
        return {
            "version": own.get("version", "1.0"),
            "revision": bucket.get("revision", 0),
            "lastUpdated": bucket.get("lastUpdated") or own.get("lastUpdated") or "",
            "user": own["user"],
            "history": own["history"],
            "facts": facts,
        }

    def _check_manifest(self, current: MemoryDocument, expected: int | None) -> None:
        stored = current.get("revision", 0)
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
            fact_id = str(incoming.get("id") or "")
            if not fact_id or fact_id in upserted:
                raise ValueError(f"change_set.upserts needs distinct fact ids, got {fact_id!r}")
            existing = facts.get(fact_id)
            want = expected[fact_id] if fact_id in expected else incoming.get("revision")
            if fact_id in expected and want is None and existing is not None:
                raise self.fact_conflict(f"Fact {fact_id!r} must not already exist")
            if want is not None and existing is not None and want != fact_revision(existing):
                raise self.fact_conflict(
                    f"Expected fact {fact_id!r} revision {want}, found {fact_revision(existing)}"
                )
            if fact_id in expected and want is not None and existing is None:
                raise self.fact_conflict(f"Expected fact {fact_id!r} revision {want}, found none")
            candidate = {k: v for k, v in incoming.items() if k != "revision"}
            if existing is not None:
                candidate["revision"] = fact_revision(existing)
            fact = next_version(candidate, existing)
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

    def _save_summaries(self, sql: SqlMemoryStorage, user: str | None, summaries: dict[str, Any]) -> None:
        own = sql.reload(None, user_id=user)
        document = self._base(own, own.get("revision"))
        self._apply_summaries(document, summaries)
        if not sql.save(document, None, user_id=user, origin=ORIGIN):
            raise StorageWriteError(f"memstore refused the DeerMem summaries for user {user!r}")


def _finite(value: Any) -> float | None:
    """A number for the audit JSON: NaN and infinities (which JSON cannot hold) become null."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None
