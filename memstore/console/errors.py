"""memstore's typed errors as the console's HTTP answers: the API's mapping (``mapped_errors``),
plus the operator-only ones: a setting the console's work needs (the operator connection, the SQL
provider, ``expire_below``) is a 409 whose message says what to set, so the page can show it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from fastapi import HTTPException

from memstore.console.security import Operator
from memstore.errors import ConfigError
from memstore.integrations.fastapi_errors import mapped_errors


@contextmanager
def console_errors(operator: Operator) -> Iterator[None]:
    try:
        with mapped_errors(operator.user_id):
            yield
    except ConfigError as exc:
        raise HTTPException(409, str(exc)) from exc
