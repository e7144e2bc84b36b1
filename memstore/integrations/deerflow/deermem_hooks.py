"""DeerMem's optional hooks over memstore: usage for its capacity score, access counts, eviction
audit and retrieval (see ``deermem.py``'s docstring for what each maps to).

A mixin of ``DeerMemStore``, which provides the scope helpers and the lazily opened store.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import TYPE_CHECKING, Any

from memstore.config import get_memory_config
from memstore.document import format_timestamp
from memstore.inject.relevance import bm25_scores, ranked_order
from memstore.integrations.deerflow.opening import LazySql, logs_outage
from memstore.ops.facts import rank_by_meaning
from memstore.scope import resolve_scope

DEFAULT_AGENT_BUCKET = "__default__"
"""DeerMem's name for "no agent"; its facts live in the user's own scope."""


class DeerMemHooks:
    """The hook methods; ``DeerMemStore`` supplies what the block under ``TYPE_CHECKING`` names."""

    if TYPE_CHECKING:
        _sql: LazySql

        def _user(self, user_id: str | None) -> str | None: ...

        @staticmethod
        def _bucket(agent_name: str | None) -> str | None: ...

        def _document(
            self, agent_name: str | None, user_id: str | None, *, fresh: bool, shown: bool = True
        ) -> dict[str, Any]: ...

        def _shown(self, fact: dict[str, Any]) -> dict[str, Any]: ...

    @logs_outage("usage read")
    def get_fact_usage(self, *, agent_name: str, user_id: str | None = None) -> dict[str, dict[str, Any]]:
        """DeerMem's usage entries from memstore's access columns, for its hybrid capacity score.

        The accesses still pending in memory are written first: DeerMem reads usage right before
        it evicts, and an access it recorded a moment ago must count. ``accessHeat`` is the access
        count (DeerMem decays it from ``lastAccessedAt`` itself), ``accessCount`` too.
        """
        sql = self._sql.get()
        sql.flush_access()
        signals = sql.fact_signals(self._bucket(agent_name), user_id=self._user(user_id))
        return {
            fact_id: {
                "lastAccessedAt": format_timestamp(signal.last_accessed_at),
                "accessHeat": float(signal.access_count),
                "accessCount": signal.access_count,
            }
            for fact_id, signal in signals.items()
            if signal.last_accessed_at is not None and signal.access_count > 0
        }

    @logs_outage("access count")
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

    @logs_outage("eviction audit")
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

    @logs_outage("search")
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
        The ranking sees the memory-record keys (importance); the facts returned show them only
        when ``deerflow_record_fields`` is on.
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
                for fact in self._document(agent or DEFAULT_AGENT_BUCKET, user, fresh=True, shown=False)[
                    "facts"
                ]
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
            found += [
                {"fact": self._shown(fact), "score": float(score), "matchType": kind}
                for fact, score in ranked
            ]
        found.sort(key=lambda result: result["score"], reverse=True)
        return found[:top_k]

    def clear_fact_metadata(
        self, *, agent_name: str, user_id: str | None = None, fact_ids: list[str] | None = None
    ) -> None:
        """Documented no-op: there is no per-fact sidecar to clear."""


def _finite(value: Any) -> float | None:
    """A number for the audit JSON: NaN and infinities (which JSON cannot hold) become null."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None
