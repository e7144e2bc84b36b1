"""The agent-document settings (``memstore/agent_doc.py``), a part of ``MemoryConfig``."""

from __future__ import annotations

from pydantic import BaseModel, Field, model_validator

from memstore.agent_doc import LARGEST_DOC_CHARS


class AgentDocSettings(BaseModel):
    agent_doc_per_user: bool = False
    """Each user of an agent has documents of their own instead of sharing the agent's: what one
    user's conversation writes then never reaches another user's prompt."""
    agent_doc_agent_writes: bool = True
    """The agent's file tools may write, edit and delete; off, they only list and read, and
    operators curate the documents (CLI, HTTP)."""
    agent_doc_max_chars: int = Field(default=20_000, ge=1000, le=LARGEST_DOC_CHARS)
    """Characters one document may hold (``/memories/agent.md`` is injected whole into every prompt)."""
    agent_doc_max_docs: int = Field(default=100, ge=1, le=10_000)
    """Live documents one agent (or one user of it) may hold."""
    agent_doc_max_total_chars: int = Field(default=200_000, ge=1000, le=100_000_000)
    """Characters of all live documents of one agent (or one user of it)."""
    agent_doc_history_keep: int = Field(default=100, ge=1, le=100_000)
    """Versions of each document kept in its history; older ones are pruned by the write after."""

    @model_validator(mode="after")
    def _agent_doc_bounds(self) -> AgentDocSettings:
        if self.agent_doc_max_chars > self.agent_doc_max_total_chars:
            raise ValueError(
                f"agent_doc_max_chars ({self.agent_doc_max_chars}) is above agent_doc_max_total_chars "
                f"({self.agent_doc_max_total_chars})"
            )
        return self
