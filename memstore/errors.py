"""Every exception memstore raises on purpose, in one place, grouped by the stage that raises it.

Callers catch them by type, never by message text or ``args``: the HTTP router, the agent tools
and the CLI each map them in a single function. Where an error used to be a builtin
(``KeyError``, ``ValueError``, ``OSError``), it still subclasses that builtin so existing
``except`` clauses keep working.
"""

from __future__ import annotations

STORAGE_UNAVAILABLE_MESSAGE = "Memory storage is unavailable; try again later."
EMBEDDINGS_FAILED_MESSAGE = "The embeddings endpoint failed; try again later."
"""What a remote caller (HTTP client, agent tool, MCP client) is told when the store or the
embeddings endpoint fails; the cause, which names the database, goes to the server's log."""


class MemstoreError(Exception):
    """Base class so a gateway can catch every memstore failure in one clause."""


# -- configuration and scope ---------------------------------------------------------------


class ConfigError(MemstoreError, ValueError):
    """Raised at startup for configuration that cannot work; the message names the field."""


class InvalidScopeError(MemstoreError):
    """A user id or agent name that could escape its scope (path traversal, bad characters).

    Deliberately not a ``ValueError``: hosts map ``ValueError`` to "bad content" (DeerFlow's router
    reported a long user id as "Memory fact content cannot be empty"). Catch it by type.
    """


class AccessDeniedError(MemstoreError, PermissionError):
    """The identity may not do this (share a fact without the ``editor`` or ``admin`` role, ...).

    The message says which role or rule is missing; it never names another user's data.
    """


# -- storage -------------------------------------------------------------------------------


class TenantQuotaError(AccessDeniedError):
    """A save would take its tenant past ``tenant_max_facts``: refused, nothing written."""


class StorageUnavailableError(MemstoreError):
    """The backing store cannot be reached (database down, disk gone); retrying later may succeed."""


class StorageSetupError(MemstoreError):
    """A storage that cannot start: no database URL, a database not migrated, a host setting wrong.

    Retrying does not help; the message names the setting or the command that fixes it.
    """


class RevisionConflictError(MemstoreError):
    """The caller expected the scope at one revision and the store is at another; nothing was saved."""


class StorageWriteError(MemstoreError, OSError):
    """The provider refused to persist a document (it returned ``False``); nothing was changed."""


class StaleDocumentError(MemstoreError):
    """The scope was erased, cleared or vacuumed since the document was read; the save is refused.

    The document was loaded (or its conversation captured) before that, so saving it would bring
    erased memory back. Nothing was changed: reload the scope and redo the edit.
    """


class FoldTargetGoneError(MemstoreError):
    """A save found deleted, by another writer, a fact that new facts of it were folded into as
    paraphrases; nothing was saved, so the caller can save those facts after all."""


class LeaseLostError(MemstoreError):
    """The queue lease on a conversation expired and another worker took it over.

    Raised inside the save transaction, which is rolled back: the other worker's result lands,
    this one's never does, so a conversation claimed twice is applied once.
    """


class QueueFullError(MemstoreError):
    """The durable queue refused a new conversation because it would pass a bound.

    ``kind`` is ``full`` (``max_queue_depth`` or ``max_queue_chars``), ``user_share`` (the
    user's share of them, ``queue_user_share``) or ``tenant_share`` (the tenant's,
    ``queue_tenant_share``): one user's or one tenant's flood is refused before it can fill the
    queue for everyone else.
    """

    def __init__(self, message: str, *, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


class MalformedDocumentError(MemstoreError, ValueError):
    """A document whose shape cannot be stored without guessing; the save is refused."""


class MigrationError(MemstoreError):
    """A migration could not run: unknown revision, broken revision chain, integrity check failed."""


class SchemaNotReadyError(MigrationError):
    """The database is not at the schema revision this memstore needs; the message says what to run."""


class QueryError(MemstoreError, ValueError):
    """A query the caller can fix: bad filter values, paging out of range."""


class BackupError(MemstoreError):
    """A backup that cannot be made or restored (not a backup, another schema revision, truncated,
    a target that already holds memory); a failed restore leaves the target as it was."""


# -- update --------------------------------------------------------------------------------


class LLMError(MemstoreError):
    """The endpoint could not produce a reply (network, HTTP status, timeout)."""


class LLMUnavailableError(LLMError):
    """A failure that may pass (timeout, connection, 408, 409, 429, 5xx): the queue retries it.

    ``retry_after`` is the endpoint's ``Retry-After`` in seconds, when it sent one.
    """

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class EmbeddingError(MemstoreError):
    """The embeddings endpoint or model failed, or returned something that is not one vector per text."""


class EmbeddingUnavailableError(EmbeddingError):
    """The embeddings endpoint did not answer, or answered 408/409/429/5xx: trying later may work."""


class MemoryUpdateParseError(MemstoreError, ValueError):
    """The extractor's reply holds no usable memory update; nothing is saved."""


class UnsafeMemoryUpdateError(MemoryUpdateParseError):
    """The reply removes facts while some of its new facts are malformed; nothing is saved."""


class MalformedMemoryError(MemstoreError, ValueError):
    """The stored document does not have the shape an update needs; nothing is saved."""


# -- explicit fact edits and import ----------------------------------------------------------


class FactNotFoundError(MemstoreError, KeyError):
    """No fact with this id in the scope."""

    def __init__(self, fact_id: str) -> None:
        super().__init__(fact_id)
        self.fact_id = fact_id

    def __str__(self) -> str:
        return f"Fact not found: {self.fact_id}"


class DuplicateFactError(MemstoreError, ValueError):
    """A fact with the same content key (``strip().casefold()``) already exists in the scope."""

    def __init__(self, existing_id: object) -> None:
        super().__init__(f"Duplicate fact: the same content is already stored as {existing_id}")
        self.existing_id = existing_id


class SimilarFactError(DuplicateFactError):
    """A manual fact means what a live fact says: cosine similarity at or above ``dedup_similarity``."""

    def __init__(self, existing_id: str, similarity: float, threshold: float) -> None:
        MemstoreError.__init__(
            self,
            f"Similar fact: {existing_id} already says this (similarity {similarity:.3f}, "
            f"dedup_similarity {threshold})",
        )
        self.existing_id = existing_id
        self.similarity = similarity


class FactEditConflictError(MemstoreError):
    """Another writer changed the fact between this edit's load and its save, and kept its version.

    Concurrent saves merge with "first committer wins" per fact, so nothing of this edit was
    stored; reload the fact and edit it again.
    """

    def __init__(self, fact_id: str) -> None:
        super().__init__(fact_id)
        self.fact_id = fact_id

    def __str__(self) -> str:
        return f"Fact {self.fact_id} was changed by another writer first; this edit was not stored"


class InvalidFactError(MemstoreError, ValueError):
    """A manual fact field that cannot be stored.

    ``message`` (and ``str()``) is ``"<field>: <rule it breaks>"`` (``content: 3,000 characters,
    the limit is 2,000``): the agent tools, MCP and the HTTP API all show it, so whoever sent the
    field learns what to change. It never quotes the submitted value, which may be long, private or
    unprintable. ``args`` stays ``(field,)``, the reference's ``ValueError("confidence")``, so a
    router ported from it that maps ``exc.args[0]`` keeps working.
    """

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(field)
        self.field = field
        self.message = f"{field}: {reason}"

    def __str__(self) -> str:
        return self.message


class InvalidDocumentError(MemstoreError, ValueError):
    """A file that cannot be imported; the message is the reason shown to the operator."""


# -- sessions ------------------------------------------------------------------------------


class InvalidTurnError(MemstoreError, ValueError):
    """A session turn that cannot be stored (role, content, name or tool calls); the message says
    which rule it breaks and never quotes the turn."""


class SessionLimitError(MemstoreError):
    """A session write refused because it would pass a cap: ``kind`` is ``turns`` (the raw turns
    one session holds while its compression is pending, ``session_max_stored_turns``) or
    ``sessions`` (a user's sessions, ``session_max_per_user``). Nothing of the write was stored."""

    def __init__(self, message: str, *, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


class SessionStoreUnavailableError(StorageUnavailableError):
    """The session store (the database or Redis) did not answer; nothing was written."""


# -- the agent's own documents ---------------------------------------------------------------


class AgentDocPathError(MemstoreError, ValueError):
    """A virtual path that names no document under ``/memories/``; the message names the rule."""


class AgentDocEditError(MemstoreError, ValueError):
    """A write or edit that cannot apply (``old_string`` not found or not unique, content that
    cannot be stored or is over its cap); nothing was stored."""


class AgentDocNotFoundError(MemstoreError, KeyError):
    """No live document at this path in the scope."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path

    def __str__(self) -> str:
        return f"no document at {self.path}"


class AgentDocConflictError(MemstoreError):
    """The document is not at the version the write expected: another writer (a replica, an
    operator) changed, created or deleted it first. Nothing was stored; read it again."""

    def __init__(self, path: str, *, expected: int, current: int) -> None:
        super().__init__(path)
        self.path = path
        self.expected = expected
        self.current = current

    def __str__(self) -> str:
        if self.expected == 0:
            return (
                f"{self.path} already exists (version {self.current}): read it and pass its version "
                "to overwrite it, or use edit_file"
            )
        now = "no longer exists" if self.current == 0 else f"is at version {self.current}"
        return (
            f"{self.path} has changed since version {self.expected} was read: it {now}; "
            "read it again and redo the change"
        )


class AgentDocLimitError(MemstoreError):
    """A write refused because the scope would hold more documents or characters than allowed."""


# -- the LangGraph store's items ---------------------------------------------------------------


class StoreItemError(MemstoreError, ValueError):
    """A store operation that cannot run as given: a namespace, key, value, filter, query or page
    that breaks a rule or a size cap. The message names the rule, never the value (a namespace
    label may be a user id). Nothing of the batch it came in was stored."""


class StoreItemLimitError(MemstoreError):
    """A batch refused because a scope would hold more live items than its ``max_items``; nothing
    of the batch was stored."""


SETUP_ERRORS = (MigrationError, StorageSetupError, ConfigError)
"""What no retry fixes: an operator must migrate the database or correct a setting. The request
path raises these (the first call fails with the command that fixes it) and logs the rest."""
