"""The one place memstore's typed errors become the HTTP errors ``/api/memory`` documents.

``MemoryRoute``, the route class of every ``/api/memory`` route, answers each 422 in the documented
shape. A 503 (the database, or for a search by meaning the embeddings endpoint, failed) is also logged,
once, at WARNING, with the caller's user id and the cause: the client gets a generic message,
and without this line the server log showed only the access line. The cause is memstore's own
message, which names the database by its masked URL and never carries a password.

An agent document's version conflict is a 409 whose body adds ``expected`` and ``current`` (the
versions) to ``detail``, so a client can re-read and retry without parsing the message.
"""

import logging
from collections.abc import Callable, Coroutine, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import HTTPException, RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from memstore.errors import (
    EMBEDDINGS_FAILED_MESSAGE,
    STORAGE_UNAVAILABLE_MESSAGE,
    AccessDeniedError,
    AgentDocConflictError,
    AgentDocEditError,
    AgentDocLimitError,
    AgentDocNotFoundError,
    AgentDocPathError,
    DuplicateFactError,
    EmbeddingError,
    FactEditConflictError,
    FactNotFoundError,
    InvalidDocumentError,
    InvalidFactError,
    InvalidScopeError,
    InvalidTurnError,
    QueryError,
    RevisionConflictError,
    SessionLimitError,
    SessionStoreUnavailableError,
    StaleDocumentError,
    StorageSetupError,
    StorageUnavailableError,
    StorageWriteError,
)

logger = logging.getLogger(__name__)

LIMIT_HEADER = "X-Memstore-Limit"
"""On a 429: the cap a session write would pass, ``turns`` or ``sessions`` (``SessionLimitError.kind``)."""


class VersionConflict(HTTPException):
    """A 409 that carries the versions of an ``AgentDocConflictError`` into its body."""

    def __init__(self, error: AgentDocConflictError) -> None:
        super().__init__(409, str(error))
        self.expected = error.expected
        self.current = error.current


class MemoryRoute(APIRoute):
    """Answers every 422 in the documented shape: ``loc``, ``msg`` and ``type`` only, and a
    ``VersionConflict`` with its versions.

    FastAPI's own handler echoes each error's ``input`` too. A NaN or a lone surrogate in a body
    cannot be encoded back as JSON, so the 422 for it became a 500, and the echo of a rejected
    megabyte-sized fact doubled the traffic it cost. Doing this in the route keeps it with the
    router whatever app mounts it.
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as exc:
                raise RequestValidationError([_renderable(error) for error in exc.errors()]) from exc
            except VersionConflict as exc:
                body = {"detail": exc.detail, "expected": exc.expected, "current": exc.current}
                return JSONResponse(body, status_code=exc.status_code)

        return handle


def _renderable(error: Mapping[str, Any]) -> dict[str, Any]:
    def text(value: object) -> str:
        return str(value).encode("utf-8", "replace").decode("utf-8")

    return {
        "loc": [part if isinstance(part, int) else text(part) for part in error.get("loc", ())],
        "msg": text(error.get("msg", "")),
        "type": text(error.get("type", "value_error")),
    }


@contextmanager
def mapped_errors(owner: str) -> Iterator[None]:
    """The one place memstore's typed errors become the documented HTTP errors."""
    try:
        yield
    except AgentDocConflictError as exc:
        raise VersionConflict(exc) from exc
    except AgentDocNotFoundError as exc:
        raise HTTPException(404, str(exc)) from exc
    except AgentDocLimitError as exc:  # the agent's documents are full: delete or shorten some
        raise HTTPException(413, str(exc)) from exc
    except AgentDocPathError as exc:  # the message names the rule, never the path
        raise RequestValidationError([{"loc": ["query"], "msg": str(exc), "type": "value_error"}]) from exc
    except AgentDocEditError as exc:
        raise RequestValidationError([{"loc": ["body"], "msg": str(exc), "type": "value_error"}]) from exc
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
    except InvalidTurnError as exc:  # the message names the rule, never the turn's text
        error = {"loc": ["body", "turns"], "msg": str(exc), "type": "value_error"}
        raise RequestValidationError([error]) from exc
    except SessionLimitError as exc:
        raise HTTPException(429, str(exc), headers={LIMIT_HEADER: exc.kind}) from exc
    except StaleDocumentError as exc:
        raise HTTPException(409, str(exc)) from exc
    except SessionStoreUnavailableError as exc:  # a StorageUnavailableError: the same 503
        logger.warning("memory request of user %s answered 503, session store: %s", owner, exc)
        raise HTTPException(503, STORAGE_UNAVAILABLE_MESSAGE) from exc
    except (StorageUnavailableError, StorageWriteError, StorageSetupError) as exc:
        # StorageWriteError: the provider's save returned False (the database refused the write).
        logger.warning("memory request of user %s answered 503, storage: %s", owner, exc)
        raise HTTPException(503, STORAGE_UNAVAILABLE_MESSAGE) from exc
    except EmbeddingError as exc:
        logger.warning("memory request of user %s answered 503, embeddings: %s", owner, exc)
        raise HTTPException(503, EMBEDDINGS_FAILED_MESSAGE) from exc
