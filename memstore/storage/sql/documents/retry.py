"""One more try for a read or a save whose PostgreSQL connection turned out to be gone.

The pool no longer pings a connection before handing it out (``engine.py``): its checkout only
notices a connection the server closed in an orderly way (``driver.closed_by_server``). One that
dies between the checkout and its first statement, or that had silently gone, fails the statement
with a disconnect: SQLAlchemy then invalidates it and every other pooled connection opened before
it, so a second try runs on a new connection.

- A read is always tried again: it changed nothing.
- A save is tried again only if the connection was lost before its ``COMMIT`` was sent: the server
  rolls back a transaction whose client went away, so nothing of the first try is stored and the
  second cannot write anything twice. A connection lost while committing leaves the outcome
  unknown (the server may have committed just before), so that failure is raised as the outage it
  is (``StorageUnavailableError``), as it was with the pre-ping; a later load shows what happened.

One retry only: if the second try fails too, the database is really unreachable and the caller
gets the outage.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from sqlalchemy.exc import DBAPIError

logger = logging.getLogger(__name__)

T = TypeVar("T")


class Attempt:
    """One try of a save: whether its ``COMMIT`` may have been sent."""

    __slots__ = ("committing",)

    def __init__(self) -> None:
        self.committing = False

    @contextmanager
    def commits(self) -> Iterator[None]:
        """Entered just inside the transaction's ``with``: leaving it without an error means the
        ``COMMIT`` goes out next. An error in the body leaves ``committing`` False (rolled back)."""
        yield
        self.committing = True


def _lost(exc: DBAPIError, what: str) -> None:
    if not exc.connection_invalidated:
        raise exc
    logger.info("the database connection was gone; %s once more on a new connection", what)


def read_twice(read: Callable[[], T]) -> T:
    """``read()``, tried once more when its connection was gone."""
    try:
        return read()
    except DBAPIError as exc:
        _lost(exc, "reading")
    return read()


def save_twice(save: Callable[[Attempt], T]) -> T:
    """``save(attempt)``, tried once more when its connection was lost before its ``COMMIT``."""
    attempt = Attempt()
    try:
        return save(attempt)
    except DBAPIError as exc:
        if attempt.committing:
            raise
        _lost(exc, "saving")
    return save(Attempt())
