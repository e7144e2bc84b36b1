"""The capacity model's figures (docs/scale.md): what one PostgreSQL server does as one worker would.

    .venv/bin/python scripts/capacity.py SERVER_URL [--processes 2] [--seconds 30]

SERVER_URL is a PostgreSQL server (``postgresql+psycopg://postgres@127.0.0.1:5432/postgres``);
the script creates a database ``memstore_capacity_<hex>`` there, migrates it, and drops it at the
end. Four phases, each ``--seconds`` long with ``--processes`` client processes, through
``SqlMemoryStorage`` as a gateway uses it, on scopes of 100 facts (``max_facts``' default, a full
scope): first saves of new scopes, read-modify-writes (load, change one fact, save), cold loads
(``reload``: no cache) and warm loads (``load``: the revision check against a cached document).
Then the bytes every memory table takes, indexes and TOAST included, per fact and per scope.
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from memstore.config import MemoryConfig, set_memory_config
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.schema.migrate import upgrade

FACTS = 100
TABLE_BYTES = (
    "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = current_schema() AND c.relkind = 'r' AND c.relname LIKE 'memory%'"
)


def document(user: str) -> dict[str, Any]:
    return {
        "facts": [
            {"id": f"fact_{index:08x}", "content": f"{user} fact {index} #{index % 7}", "confidence": 0.8}
            for index in range(FACTS)
        ]
    }


def first_save(storage: SqlMemoryStorage, worker: int, done: int, users: int) -> None:
    user = f"u{worker}_{done}"
    storage.save(document(user), user_id=user)


def read_modify_write(storage: SqlMemoryStorage, worker: int, done: int, users: int) -> None:
    user = f"u{worker}_{done % users}"
    loaded = storage.load(user_id=user)
    loaded["facts"][0]["content"] = f"{user} changed {done}"
    storage.save(loaded, user_id=user)


def cold_load(storage: SqlMemoryStorage, worker: int, done: int, users: int) -> None:
    storage.reload(user_id=f"u{worker}_{done % users}")


def warm_load(storage: SqlMemoryStorage, worker: int, done: int, users: int) -> None:
    storage.load(user_id=f"u{worker}_{done % users}")


Phase = Callable[[SqlMemoryStorage, int, int, int], None]
"""One operation of a phase: (storage, worker, operations done so far, users per worker)."""


def _count(phase: Phase, url: str, worker: int, users: int, deadline: float, results: Any) -> None:
    """Run ``phase`` until ``deadline`` in this process and report how many operations it did."""
    set_memory_config(MemoryConfig(database_url=url))
    storage, done = SqlMemoryStorage(url), 0
    while time.monotonic() < deadline:
        phase(storage, worker, done, users)
        done += 1
    results.put(done)


def run(phase: Phase, url: str, processes: int, users: int, seconds: float) -> tuple[int, float]:
    """The operations ``processes`` clients complete in ``seconds``, and the wall time they took."""
    results: Any = multiprocessing.Queue()
    started = time.monotonic()
    deadline = started + seconds
    workers = [
        multiprocessing.Process(target=_count, args=(phase, url, worker, users, deadline, results))
        for worker in range(processes)
    ]
    for process in workers:
        process.start()
    total = sum(results.get() for _ in workers)
    for process in workers:
        process.join()
    return total, time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("server_url")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    server = make_url(args.server_url).set(drivername="postgresql+psycopg")
    name = f"memstore_capacity_{uuid.uuid4().hex[:8]}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = server.set(database=name).render_as_string(hide_password=False)
    try:
        upgrade(url)
        saves, took = run(first_save, url, args.processes, 0, args.seconds)
        print(f"first saves of {FACTS}-fact scopes: {saves} in {took:.1f} s = {saves / took:.1f}/s")
        users = max(1, saves // args.processes // 2)
        for label, phase in (
            ("load, change one fact, save", read_modify_write),
            ("cold loads (reload)", cold_load),
            ("warm loads (revision check)", warm_load),
        ):
            done, took = run(phase, url, args.processes, users, args.seconds)
            print(f"{label}: {done} in {took:.1f} s = {done / took:.1f}/s")
        database = create_engine(url)
        with database.connect() as conn:
            facts = int(conn.execute(text("SELECT count(*) FROM memory_facts")).scalar_one())
            scopes = int(conn.execute(text("SELECT count(*) FROM memory_scopes")).scalar_one())
            size = int(conn.execute(text(TABLE_BYTES)).scalar_one())
        database.dispose()
        print(f"{size} bytes for {scopes} scopes and {facts} facts:", end=" ")
        print(f"{size / facts:.0f} a fact, {size / scopes:.0f} a scope")
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


if __name__ == "__main__":
    main()
