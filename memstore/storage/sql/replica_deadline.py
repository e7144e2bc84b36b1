"""How long a read replica may take to answer, on the client side (``replica.py``).

A replica host that vanished is found by libpq itself: the replica's URL gets ``connect_timeout``,
TCP keepalives and ``tcp_user_timeout`` (``REPLICA_URL_OPTIONS``) unless it sets them. A replica
whose server stopped answering while its host still acknowledges packets (a frozen process, a
stuck VM) passes those checks forever, and a server-side ``statement_timeout`` never fires there.
So every read on the replica also runs under a client-side deadline (``READ_DEADLINE_SECONDS``): a
watchdog thread shuts down the sockets of every connection of that replica's pools once a read
outlives it. The reads on them fail as a lost connection does, the replica counts as down
(``replica.py``'s back-off) and the primary answers them.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.pool import Pool

READ_DEADLINE_SECONDS = 10.0
WATCH_INTERVAL_SECONDS = 0.2
REPLICA_URL_OPTIONS = {
    "connect_timeout": "2",
    "keepalives": "1",
    "keepalives_idle": "2",
    "keepalives_interval": "1",
    "keepalives_count": "2",
    "tcp_user_timeout": "3000",
}
"""libpq options a replica's URL gets unless it sets them: a host gone is noticed in seconds."""

_Names = tuple[Any, Any]


def replica_url(url: str) -> URL:
    parsed = make_url(url)
    missing = {name: value for name, value in REPLICA_URL_OPTIONS.items() if name not in parsed.query}
    return parsed.update_query_dict(missing)


def _names(fd: int) -> _Names | None:
    """The socket's own and its peer's address: what tells it from another socket given the same
    descriptor number later."""
    try:
        with socket.socket(fileno=os.dup(fd)) as sock:
            return sock.getsockname(), sock.getpeername()
    except OSError:
        return None


class Severer:
    """One replica's pools, their connections, and the reads running on them with a deadline."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pools: weakref.WeakSet[Pool] = weakref.WeakSet()
        self._records: weakref.WeakKeyDictionary[Any, _Names] = weakref.WeakKeyDictionary()
        self._reads: dict[object, float] = {}

    def watch(self, engine: Engine) -> None:
        """Remember the connections ``engine``'s pool opens from now on (each face has its own)."""
        with self._lock:
            if engine.pool in self._pools:
                return
            self._pools.add(engine.pool)
        event.listen(engine.pool, "connect", self._connected)

    def _connected(self, dbapi_connection: Any, record: Any) -> None:
        names = _names(getattr(dbapi_connection, "driver_connection", dbapi_connection).fileno())
        if names is not None:
            with self._lock:
                self._records[record] = names

    @contextmanager
    def deadline(self) -> Iterator[None]:
        token = object()
        with self._lock:
            self._reads[token] = time.monotonic() + READ_DEADLINE_SECONDS
        _watchdog().add(self)
        try:
            yield
        finally:
            with self._lock:
                self._reads.pop(token, None)

    def expired(self) -> bool:
        """Whether a read outlived its deadline (each one is counted once)."""
        now = time.monotonic()
        with self._lock:
            late = [token for token, deadline in self._reads.items() if deadline <= now]
            for token in late:
                del self._reads[token]
            return bool(late)

    def busy(self) -> bool:
        with self._lock:
            return bool(self._reads)

    def sever(self) -> None:
        """Shut down the socket of every open connection to the replica."""
        with self._lock:
            records = list(self._records.items())
        for record, names in records:
            connection = record.dbapi_connection
            if connection is None:
                continue
            try:
                fd = getattr(connection, "driver_connection", connection).fileno()
                with socket.socket(fileno=os.dup(fd)) as sock:
                    if (sock.getsockname(), sock.getpeername()) == names:
                        sock.shutdown(socket.SHUT_RDWR)
            except Exception:  # closed meanwhile (psycopg's or the OS's error): nothing to sever
                continue


class _Watchdog:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watched: weakref.WeakSet[Severer] = weakref.WeakSet()
        self._wake = threading.Event()
        threading.Thread(target=self._run, name="memstore-replica-deadline", daemon=True).start()

    def add(self, severer: Severer) -> None:
        with self._lock:
            self._watched.add(severer)
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            time.sleep(WATCH_INTERVAL_SECONDS)
            self._wake.clear()  # before looking: a read added meanwhile sets it again
            with self._lock:
                watched = list(self._watched)
            for severer in watched:
                if severer.expired():
                    severer.sever()
            if any(severer.busy() for severer in watched):
                self._wake.set()


_watchdogs: dict[int, _Watchdog] = {}
_watchdogs_lock = threading.Lock()


def _watchdog() -> _Watchdog:
    """The process's watchdog thread (a forked child starts its own)."""
    with _watchdogs_lock:
        dog = _watchdogs.get(os.getpid())
        if dog is None:
            dog = _watchdogs[os.getpid()] = _Watchdog()
        return dog
