"""The identity a transaction runs for, as PostgreSQL's row-level security reads it.

Every application transaction on a connection that is subject to the policies of
``schema/rls.py`` starts with one statement that sets ``memstore.tenant_id``,
``memstore.user_id`` and ``memstore.roles`` transaction-locally (``set_config(..., true)``):
they end with the transaction, so a transaction-mode pooler can hand the connection to anyone
next. A role that bypasses the policies (a superuser, ``BYPASSRLS``) gains nothing from the
settings, so they are skipped there and such deployments pay no extra statement; memstore's
own predicates (tenant, user, visibility) still scope every read, as they do on SQLite.
"""

from __future__ import annotations

import re
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, Engine, bindparam, func, select, text, true

from memstore.errors import InvalidScopeError
from memstore.scope import Identity

TIMEOUTS_AND_IDENTITY = select(
    func.set_config("lock_timeout", bindparam("lock_timeout"), true()),
    func.set_config("statement_timeout", bindparam("statement_timeout"), true()),
    func.set_config("memstore.tenant_id", bindparam("i_tenant"), true()),
    func.set_config("memstore.user_id", bindparam("i_user"), true()),
    func.set_config("memstore.roles", bindparam("i_roles"), true()),
)
"""A write transaction's timeouts and identity in one statement (``SET LOCAL`` takes no parameters)."""
SET_IDENTITY = select(
    func.set_config("memstore.tenant_id", bindparam("i_tenant"), true()),
    func.set_config("memstore.user_id", bindparam("i_user"), true()),
    func.set_config("memstore.roles", bindparam("i_roles"), true()),
)
_BYPASSES = text("SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user")

_enforced: dict[str, bool] = {}
_by_engine: weakref.WeakKeyDictionary[Engine, bool] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def policies_apply(engine: Engine, conn: Connection | None = None) -> bool:
    """Whether the engine's role is subject to row-level security (asked once per engine URL), on
    ``conn`` when the caller holds one: a second checkout could wait forever on a one-connection pool."""
    if engine.dialect.name != "postgresql":
        return False
    known = _by_engine.get(engine)  # every read asks: no URL rendering on the way
    if known is not None:
        return known
    # By URL: an engine with other execution options (the autocommit reader) shares the answer.
    key = engine.url.render_as_string(hide_password=False)
    with _lock:
        known = _enforced.get(key)
    if known is None:
        if conn is not None:
            known = not bool(conn.execute(_BYPASSES).scalar())
        else:
            with engine.connect() as own:
                known = not bool(own.execute(_BYPASSES).scalar())
        with _lock:
            _enforced[key] = known
    _by_engine[engine] = known
    return known


def set_identity(conn: Connection, identity: Identity) -> None:
    """Set the transaction's identity when the policies apply to this connection's role."""
    if policies_apply(conn.engine, conn):
        conn.execute(SET_IDENTITY, identity_parameters(identity))


def identity_parameters(identity: Identity) -> dict[str, str]:
    return {
        "i_tenant": identity.tenant_id,
        "i_user": identity.user_id or "",
        "i_roles": identity.roles_setting,
    }


@contextmanager
def reading(engine: Engine, reader: Engine, identity: Identity) -> Iterator[Connection]:
    """A connection for one read: ``reader`` (autocommit on PostgreSQL) as it is, or, when the
    policies apply to this role, inside a transaction whose identity is set by the same round trip
    that opens it (``BEGIN; SELECT set_config(...)`` as one simple query) and rolled back after."""
    if not policies_apply(engine):
        with reader.connect() as conn:
            yield conn
        return
    with reader.connect() as conn:
        if reader is not engine:  # autocommit: open the transaction in the identity's round trip
            conn.exec_driver_sql(f"BEGIN; {_literal_settings(identity)}")
            try:
                yield conn
            finally:
                # A connection lost or cancelled mid-read is invalidated: the server ends its
                # transaction, and a ROLLBACK here would replace the real error with its own.
                if not conn.invalidated:
                    conn.exec_driver_sql("ROLLBACK")
            return
    with transaction(engine, identity) as conn:
        yield conn


_SETTING_TEXT = re.compile(r"[A-Za-z0-9_,-]*")


def _literal_settings(identity: Identity) -> str:
    """``SELECT set_config(...)`` with the values inlined: a simple query takes no parameters. Each
    value is checked against the id alphabet here (no quote, no backslash), whatever built it."""
    values = identity_parameters(identity)
    for value in values.values():
        if not _SETTING_TEXT.fullmatch(value):
            raise InvalidScopeError(f"an identity holds characters no id may: {value!r}")
    names = (
        ("memstore.tenant_id", "i_tenant"),
        ("memstore.user_id", "i_user"),
        ("memstore.roles", "i_roles"),
    )
    return "SELECT " + ", ".join(f"set_config('{name}', '{values[key]}', true)" for name, key in names)


@contextmanager
def transaction(engine: Engine, identity: Identity) -> Iterator[Connection]:
    """``engine.begin()`` with the identity set first."""
    with engine.begin() as conn:
        set_identity(conn, identity)
        yield conn
