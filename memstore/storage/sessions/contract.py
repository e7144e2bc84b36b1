"""``SessionStore``: what every session backend (database, Redis, process memory) provides.

Each write is atomic in its backend: an append allocates its turns' ``seq`` numbers and checks
the caps in the same step as it stores them, and a compression replaces the turns it summarised
by the summary in one step, so turns appended meanwhile (by another replica) are neither lost
nor summarised. A store knows nothing of tokens, LLMs or queues: ``ops/sessions.py`` counts the
tokens, decides when a session is due for compression and hands it to the queue.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from datetime import datetime

from memstore.errors import SessionLimitError
from memstore.session import AppendResult, SessionInfo, SessionKey, SessionLimits, SessionTurn


class SessionStore(ABC):
    """Sessions of every tenant; each call names its session's tenant and user in the key."""

    @abstractmethod
    def append(
        self, key: SessionKey, turns: Sequence[SessionTurn], *, now: datetime, limits: SessionLimits
    ) -> AppendResult:
        """Store ``turns`` after the session's last, creating the session (and starting it afresh
        if it had expired); refused whole with ``SessionLimitError`` past a cap."""

    @abstractmethod
    def read(self, key: SessionKey, *, now: datetime) -> tuple[SessionInfo | None, list[SessionTurn]]:
        """The session's bookkeeping and its turns in order (a summary first, if any); ``(None, [])``
        for a session that does not exist or has expired."""

    @abstractmethod
    def compress(
        self, key: SessionKey, *, epoch: str, upto_seq: int, summary: SessionTurn, now: datetime
    ) -> bool:
        """Replace every turn up to ``upto_seq`` (an earlier summary included) by ``summary``,
        numbered ``upto_seq``; ``False`` (nothing changed) when the session is gone, was started
        again (another ``epoch``) or was compressed past ``upto_seq`` already."""

    @abstractmethod
    def clear(self, key: SessionKey) -> bool:
        """Delete the session; ``False`` when there was none."""

    @abstractmethod
    def list_sessions(
        self,
        tenant_id: str,
        user_id: str | None,
        *,
        now: datetime,
        limit: int = 100,
        offset: int = 0,
    ) -> list[SessionInfo]:
        """The user's live sessions with every agent, the most recently active first."""

    @abstractmethod
    def erase_user(self, tenant_id: str, user_id: str) -> int:
        """Delete every session of the user in the tenant; returns how many."""

    @abstractmethod
    def expire(self, now: datetime) -> int:
        """Delete the sessions past their ``expires_at``; returns how many (Redis expires its own)."""

    @abstractmethod
    def close(self) -> None:
        """Release the store's connections."""


def too_many_turns(limits: SessionLimits) -> SessionLimitError:
    return SessionLimitError(
        f"the session holds {limits.max_stored_turns} turns waiting for compression "
        "(session_max_stored_turns); try again once it has been compressed",
        kind="turns",
    )


def too_many_sessions(limits: SessionLimits) -> SessionLimitError:
    return SessionLimitError(
        f"the user has {limits.max_sessions_per_user} live sessions (session_max_per_user); "
        "clear one or wait for them to expire",
        kind="sessions",
    )
