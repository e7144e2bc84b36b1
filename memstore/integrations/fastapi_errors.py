"""The one place memstore's typed errors become the HTTP errors ``/api/memory`` documents.

A 503 (the database, or for a search by meaning the embeddings endpoint, failed) is also logged,
once, at WARNING, with the caller's user id and the cause: the client gets a generic message,
and without this line the server log showed only the access line. The cause is memstore's own
message, which names the database by its masked URL and never carries a password.
"""

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from fastapi.exceptions import HTTPException, RequestValidationError

from memstore.errors import (
    EMBEDDINGS_FAILED_MESSAGE,
    STORAGE_UNAVAILABLE_MESSAGE,
    AccessDeniedError,
    DuplicateFactError,
    EmbeddingError,
    FactEditConflictError,
    FactNotFoundError,
    InvalidDocumentError,
    InvalidFactError,
    InvalidScopeError,
    QueryError,
    RevisionConflictError,
    StaleDocumentError,
    StorageSetupError,
    StorageUnavailableError,
    StorageWriteError,
)

logger = logging.getLogger(__name__)


@contextmanager
def mapped_errors(owner: str) -> Iterator[None]:
    """The one place memstore's typed errors become the documented HTTP errors."""
    try:
        yield
    except (DuplicateFactError, FactEditConflictError, RevisionConflictError) as exc:
        raise HTTPException(409, str(exc)) from exc
    except AccessDeniedError as exc:
        raise HTTPException(403, str(exc)) from exc
    except FactNotFoundError as exc:
        raise HTTPException(404, f"Memory fact '{exc.fact_id}' not found.") from exc
    except InvalidFactError as exc:
        raise RequestValidationError(
            [{"loc": ["body", exc.field], "msg": exc.message, "type": "value_error"}]
        ) from exc
    except InvalidDocumentError as exc:
        raise RequestValidationError([{"loc": ["body"], "msg": str(exc), "type": "value_error"}]) from exc
    except QueryError as exc:
        raise RequestValidationError([{"loc": ["query"], "msg": str(exc), "type": "value_error"}]) from exc
    except InvalidScopeError as exc:
        raise RequestValidationError([{"loc": ["user"], "msg": str(exc), "type": "value_error"}]) from exc
    except StaleDocumentError as exc:
        raise HTTPException(409, str(exc)) from exc
    except (StorageUnavailableError, StorageWriteError, StorageSetupError) as exc:
        # StorageWriteError: the provider's save returned False (the database refused the write).
        logger.warning("memory request of user %s answered 503, storage: %s", owner, exc)
        raise HTTPException(503, STORAGE_UNAVAILABLE_MESSAGE) from exc
    except EmbeddingError as exc:
        logger.warning("memory request of user %s answered 503, embeddings: %s", owner, exc)
        raise HTTPException(503, EMBEDDINGS_FAILED_MESSAGE) from exc
