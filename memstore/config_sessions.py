"""The session-memory settings, a part of ``MemoryConfig`` kept in their own module.

``session_backend`` picks where sessions live: ``database`` (the memory database; the default
with the SQL provider), ``redis`` (``session_redis_url``) or ``memory`` (this process; the
default with any other provider).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, SecretStr, model_validator


class SessionSettings(BaseModel):
    session_backend: Literal["database", "redis", "memory"] | None = None
    session_redis_url: SecretStr | None = None
    """``redis://[:password@]host:port/db`` (or ``rediss://``); a secret because it may hold a password."""
    session_max_turns: int = Field(default=10, ge=2, le=1000)
    """A session holding this many raw turns is due for compression."""
    session_max_tokens: int = Field(default=4000, ge=100, le=200_000)
    """...or this many tokens of raw turns, whichever comes first."""
    session_max_stored_turns: int = Field(default=100, ge=3, le=10_000)
    """Raw turns a session may hold while its compression is pending; an append past it is refused."""
    session_max_turn_chars: int = Field(default=32_000, ge=100, le=1_000_000)
    session_max_per_user: int = Field(default=1000, ge=1, le=1_000_000)
    session_ttl_seconds: float = Field(default=7 * 86_400.0, ge=60, le=366 * 86_400)
    """A session not appended to for this long expires (Redis ``EXPIRE``; the lifecycle run)."""
    session_context_max_tokens: int = Field(default=2000, ge=100, le=100_000)
    session_summary_max_chars: int = Field(default=4000, ge=200, le=32_000)
    session_extract_long_term: bool = True
    """Hand each compressed summary to the long-term updater as a conversation."""

    @model_validator(mode="after")
    def _session_bounds(self) -> SessionSettings:
        if self.session_max_stored_turns <= self.session_max_turns:
            raise ValueError(
                f"session_max_stored_turns ({self.session_max_stored_turns}) must be above "
                f"session_max_turns ({self.session_max_turns}): appends go on while a compression is pending"
            )
        if self.session_backend == "redis" and self.session_redis_url is None:
            raise ValueError("session_backend 'redis' needs session_redis_url")
        return self
