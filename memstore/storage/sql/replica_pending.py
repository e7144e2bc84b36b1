"""What a process waits for before its read replica may serve a read (``replica.py``'s state).

One ``Pending`` per process and ``(database_url, database_read_url)`` pair, shared by every
storage on those URLs (a host's adapter that builds its own storage included). It remembers:

- each scope this process saved, ``(row id, revision)``, or erased (the row id, ``ERASED``),
  until a read sees the replica holding it: at most ``MAX_PENDING_SCOPES``;
- per tenant, the primary's WAL position after a write that moves no revision (vectors stored, a
  save that only confirms facts, the clear of an empty scope), until the replica has replayed it;
- tenants whose pending write the bound made it forget: their reads go to the primary for
  ``HOLD_SECONDS`` (read-your-writes survives unless the replica lags longer than that).
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping

ScopeKey = tuple[str, str | None, str | None]
"""``(tenant_id, user_id, agent_name)``, as the provider's cache keys a scope."""
State = tuple[int, int]
"""A scope's ``(row id, revision)``: a row id is never reused on PostgreSQL, so a re-created scope
compares newer than the one erased before it."""

ERASED = -1
"""The revision a process waits for after an erase: the replica no longer holding the scope's row."""
MAX_PENDING_SCOPES = 10_000
"""Scopes (and tenants' WAL positions) a process remembers until the replica shows them (about 1 MB)."""
MAX_CHECKED_SCOPES = 500
"""Pending scopes one read asks the replica about; with more, the rest wait for the next read."""
HOLD_SECONDS = 300.0
MAX_HELD_TENANTS = 10_000
"""Beyond this many held tenants, every tenant is held (the bound on the holds themselves)."""


class Pending:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._scopes: OrderedDict[ScopeKey, State] = OrderedDict()
        self._positions: OrderedDict[str, int] = OrderedDict()
        self._held: dict[str, float] = {}
        self._all_held_until = 0.0
        self.refused: str | None = None
        """Why the replica may not serve reads at all (row-level security differs), once checked."""
        self.checked = False

    def wait(self, key: ScopeKey, state: State) -> None:
        with self._lock:
            waiting = self._scopes.pop(key, None)
            if waiting is not None and waiting[0] == state[0] and ERASED not in (state[1], waiting[1]):
                state = (state[0], max(state[1], waiting[1]))
            self._scopes[key] = state
            while len(self._scopes) > MAX_PENDING_SCOPES:
                self._hold(self._scopes.popitem(last=False)[0][0])

    def wait_position(self, tenant_id: str, position: int) -> None:
        with self._lock:
            self._positions[tenant_id] = max(position, self._positions.pop(tenant_id, 0))
            while len(self._positions) > MAX_PENDING_SCOPES:
                self._hold(self._positions.popitem(last=False)[0])

    def hold(self, tenant_id: str) -> None:
        """Send the tenant's reads to the primary for ``HOLD_SECONDS``."""
        with self._lock:
            self._hold(tenant_id)

    def _hold(self, tenant_id: str) -> None:
        now = time.monotonic()
        for expired in [tenant for tenant, until in self._held.items() if until <= now]:
            del self._held[expired]
        self._held[tenant_id] = now + HOLD_SECONDS
        if len(self._held) > MAX_HELD_TENANTS:
            self._held.clear()
            self._all_held_until = now + HOLD_SECONDS

    def held(self, tenant_id: str) -> bool:
        now = time.monotonic()
        with self._lock:
            return now < self._all_held_until or now < self._held.get(tenant_id, 0.0)

    def scopes(
        self, tenant_id: str, user_id: str | None, *, every_user: bool
    ) -> list[tuple[ScopeKey, State]]:
        """The tenant's pending scopes (the user's only unless ``every_user``), oldest first."""
        with self._lock:
            return [
                (key, state)
                for key, state in self._scopes.items()
                if key[0] == tenant_id and (every_user or key[1] == user_id)
            ]

    def position(self, tenant_id: str) -> int | None:
        with self._lock:
            return self._positions.get(tenant_id)

    def replayed(self, tenant_id: str, position: int) -> None:
        with self._lock:
            if self._positions.get(tenant_id, position + 1) <= position:
                del self._positions[tenant_id]

    def settle(self, key: ScopeKey, rows: Mapping[int, int]) -> bool:
        """Whether the replica's scope rows (``{row id: revision}``; it holds no other row of the
        scope) include this process's writes of it; once they do they are forgotten (a replica
        never goes back)."""
        with self._lock:
            waiting = self._scopes.get(key)
            if waiting is None:
                return True
            scope_id, revision = waiting
            done = scope_id not in rows if revision == ERASED else rows.get(scope_id, ERASED) >= revision
            if done:
                del self._scopes[key]
            return done


_shared: dict[tuple[int, str, str], Pending] = {}
_shared_lock = threading.Lock()


def pending_for(primary: str, replica: str) -> Pending:
    """The process's state for this pair of URLs (a forked child starts its own)."""
    key = (os.getpid(), primary, replica)
    with _shared_lock:
        state = _shared.get(key)
        if state is None:
            state = _shared[key] = Pending()
        return state
