"""The database queue's workers: claim a scope, run its conversations, settle each row.

``ClaimRunner`` does one claim's work and is shared by the worker threads and ``flush`` (which
runs it in the caller's thread). ``LeaseKeeper`` is one heartbeat thread per queue that extends
every claim this process holds, so a long LLM call keeps its lease while a dead process's
leases expire after ``queue_lease_seconds``.

How a conversation ends, by what the updater did:
- saved, or nothing to learn: done (the save already completed the row in its transaction, and
  for the claim's last row gave the claim back there too);
- ``StaleDocumentError`` (the scope was erased or cleared after the capture): the row is deleted;
- ``LeaseLostError``: nothing, the row is another worker's now;
- an outage or a transient endpoint error: pending again after a jittered exponential backoff
  (at least the endpoint's ``Retry-After``), however many attempts that takes;
- anything else: the same backoff, and dead once it has failed so ``update_max_attempts`` times
  (outages and transient errors do not count towards that).

A ``Retry-After`` also pauses this process's other workers: they claim nothing until it has
passed, and a worker holding a claim gives its remaining rows back instead of waiting on them.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Protocol

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from memstore.capture.conversation import ConversationContext
from memstore.config import MemoryConfig, get_memory_config
from memstore.errors import (
    InvalidScopeError,
    LeaseLostError,
    LLMUnavailableError,
    StaleDocumentError,
    StorageUnavailableError,
)
from memstore.queue.retry import jittered_delay
from memstore.storage.sql.engine import describe_db_error
from memstore.storage.sql.queue import admin as queue_admin
from memstore.storage.sql.queue import claims as queue_claims
from memstore.storage.sql.queue import table as queue_table
from memstore.storage.sql.queue.table import LeasedConversation, QueueLease, ScopeClaim
from memstore.update.updater import describe_failure

logger = logging.getLogger(__name__)

SWEEP_INTERVAL_SECONDS = 300.0
"""How often the heartbeat thread also deletes old done rows."""
FAILURES_REMEMBERED = 256


class LeasedUpdater(Protocol):
    """What the database queue needs from an updater (``MemoryUpdater`` is one)."""

    def process(self, context: ConversationContext, lease: QueueLease | None = None) -> bool: ...


LeasedUpdaterFactory = Callable[[], LeasedUpdater]


def utcnow() -> datetime:
    return datetime.now(UTC)


def write_transaction_options(config: MemoryConfig) -> dict[str, object]:
    return queue_table.write_options(round(config.write_lock_timeout_seconds * 1000))


class FailureLog:
    """The unexpected exceptions (a bug, a row no decoder foresaw) that a queue's loops survive.

    Each distinct failure (where, its class, the line that raised it) is logged once with its
    traceback, its repeats in a line, so a poison row met on every poll is seen without flooding
    the log. The message names where it happened, never the conversation being run.
    """

    def __init__(self) -> None:
        self._seen: set[tuple[str, str, str, int | None]] = set()
        self._lock = threading.Lock()

    def report(self, where: str, exc: BaseException, then: str = "it goes on") -> None:
        frames = traceback.extract_tb(exc.__traceback__)
        origin = (frames[-1].filename, frames[-1].lineno) if frames else ("", None)
        key = (where, type(exc).__qualname__, *origin)
        with self._lock:
            first = key not in self._seen
            if len(self._seen) >= FAILURES_REMEMBERED:
                self._seen.clear()
            self._seen.add(key)
        if first:
            logger.exception("memory queue %s failed unexpectedly; %s", where, then, exc_info=exc)
        else:
            logger.warning(
                "memory queue %s failed unexpectedly again; %s: %s", where, then, describe_failure(exc)
            )


class EndpointPause:
    """The endpoint's ``Retry-After`` holds every worker of this process, not only the one told.

    A process's workers all call the one configured endpoint, so one gate per queue is one per
    endpoint. Other processes learn it from their own 429s.
    """

    def __init__(self) -> None:
        self._until = 0.0
        self._lock = threading.Lock()

    def pause(self, seconds: float) -> None:
        with self._lock:
            self._until = max(self._until, time.monotonic() + seconds)

    def active(self) -> bool:
        with self._lock:
            return self._until > time.monotonic()

    def wait(self, stopping: threading.Event) -> None:
        with self._lock:
            remaining = self._until - time.monotonic()
        if remaining > 0:
            stopping.wait(remaining)


class LeaseKeeper:
    """The heartbeat: extends this process's claims every third of a lease."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._held: set[str] = set()
        self._lost: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_sweep = 0.0
        self._failures = FailureLog()

    def hold(self, token: str) -> None:
        with self._lock:
            self._held.add(token)
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(
                    target=self._run, name="memstore-queue-heartbeat", daemon=True
                )
                self._thread.start()

    def drop(self, token: str) -> None:
        with self._lock:
            self._held.discard(token)
            self._lost.discard(token)

    def lost(self, token: str) -> bool:
        with self._lock:
            return token in self._lost

    def held(self) -> list[str]:
        with self._lock:
            return sorted(self._held)

    def stop(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(5.0)

    def _run(self) -> None:
        # Nothing but stop() ends the heartbeat: were it to die, every lease of this process would expire.
        interval = 1.0
        while True:
            try:
                interval = get_memory_config().queue_lease_seconds / 3
            except Exception as exc:
                self._failures.report("heartbeat", exc, "beating at its last interval")
            if self._stop.wait(interval):
                return
            try:
                self.beat()
            except Exception as exc:
                self._failures.report("heartbeat", exc, "trying again at the next beat")

    def beat(self) -> None:
        config = get_memory_config()
        tokens = self.held()
        now = utcnow()
        try:
            with self._engine.connect() as conn:
                conn.execution_options(**write_transaction_options(config))
                with conn.begin():
                    alive = (
                        queue_claims.heartbeat(
                            conn, tokens, now=now, lease_seconds=config.queue_lease_seconds
                        )
                        if tokens
                        else set()
                    )
                    if now.timestamp() - self._last_sweep >= SWEEP_INTERVAL_SECONDS:
                        queue_admin.sweep_done(conn, now)
                        self._last_sweep = now.timestamp()
        except SQLAlchemyError as exc:
            logger.warning("memory queue heartbeat failed (leases expire unless it recovers): %s", exc)
            return
        with self._lock:
            # A claim its last settle gave back is "lost" too until the runner drops it: the
            # runner says so only when rows were left unrun.
            self._lost.update(token for token in set(tokens) - alive if token in self._held)


class ClaimRunner:
    """Runs the conversations of a claim through an updater and settles each row."""

    def __init__(
        self,
        engine: Engine,
        keeper: LeaseKeeper,
        count: Callable[[str], None],
        stopping: threading.Event,
    ) -> None:
        self._engine = engine
        # A PostgreSQL claim is one statement: on its own, it is its own transaction.
        self._claimer = (
            engine.execution_options(isolation_level="AUTOCOMMIT")
            if engine.dialect.name == "postgresql"
            else None
        )
        self._keeper = keeper
        self._count = count
        self._stopping = stopping
        self.pause = EndpointPause()
        self.failures = FailureLog()

    def claim(
        self,
        config: MemoryConfig,
        owner: str,
        *,
        force: bool,
        only_owner: str | None,
        exclude: Sequence[int],
        idle: bool,
    ) -> ScopeClaim | None:
        """Claim a scope in one write transaction: on PostgreSQL a single statement; on SQLite a
        ``BEGIN IMMEDIATE`` transaction, which an ``idle`` worker (its last look found nothing and
        nobody woke it) first checks with a read is worth taking the write lock for."""
        now = utcnow()
        claim = partial(
            queue_claims.claim,
            owner=owner,
            now=now,
            lease_seconds=config.queue_lease_seconds,
            force=force,
            only_owner=only_owner,
            exclude=exclude,
        )
        if self._claimer is not None:
            with self._claimer.connect() as conn:
                return claim(conn)
        if idle:
            with self._engine.connect() as conn:
                if not queue_claims.has_claimable(conn, now, force=force, owner=only_owner, exclude=exclude):
                    return None
        with self._engine.connect() as conn:
            conn.execution_options(**write_transaction_options(config))
            with conn.begin():
                return claim(conn)

    def run(self, claim: ScopeClaim, updater: LeasedUpdater) -> None:
        """Run the claim's conversations. The last one's settle (its save, usually) gives the
        claim back in its own transaction when every row before it was settled; otherwise, and
        whenever the run stops early, a release of its own does."""
        self._keeper.hold(claim.token)
        released = False
        try:
            settled = all([self._kill_undecodable(lease, reason) for lease, reason in claim.undecodable])
            for index, leased in enumerate(claim.conversations):
                if self._keeper.lost(claim.token):
                    logger.warning(
                        "memory queue claim %s was taken over; its remaining rows are not run", claim.token
                    )
                    break
                # Paused by a Retry-After: give the rest back rather than hold the scope meanwhile.
                if self._stopping.is_set() or self.pause.active():
                    break
                last = index == len(claim.conversations) - 1
                leased.lease.releases_claim = last and settled
                settled = self._run_one(leased, updater) and settled
                released = last and settled
        finally:
            self._keeper.drop(claim.token)
            if not released:
                self.release(claim.token)

    def release(self, token: str) -> int:
        """Give the claim back, with any row it did not get to; logged, never raised."""
        try:
            with self._engine.connect() as conn:
                conn.execution_options(**write_transaction_options(get_memory_config()))
                with conn.begin():
                    return queue_table.release(conn, token, now=utcnow())
        except SQLAlchemyError as exc:
            logger.warning("could not release memory queue claim %s (it expires on its own): %s", token, exc)
        except Exception as exc:
            self.failures.report("release of a claim", exc, "the claim expires on its own")
        return 0

    def _kill_undecodable(self, lease: QueueLease, reason: str) -> bool:
        """A row that holds no conversation goes to ``dead`` at once, in its own transaction: retried,
        it would fail the same way on every claim. ``True`` once that transaction committed."""
        self._count("dead")
        logger.error("queued conversation %d cannot be decoded and is dead: %s", lease.row_id, reason)
        return self._settle(
            lease,
            lambda conn, now: queue_table.reschedule(
                conn,
                lease,
                now=now,
                due_at=now,
                error=f"undecodable row: {reason}",
                permanent=True,
                dead=True,
            ),
        )

    def _run_one(self, leased: LeasedConversation, updater: LeasedUpdater) -> bool:
        """Run one conversation; ``True`` once a committed write settled its row (its save, or a
        settle here), with the claim given back too when the lease says so."""
        item = leased.conversation
        try:
            context = ConversationContext(
                item.thread_id,
                item.messages,
                item.agent_name,
                item.user_id,
                item.correction_detected,
                item.reinforcement_detected,
                timestamp=item.captured_at,
                tenant_id=item.tenant_id,
                kind=item.kind,
            )
        except InvalidScopeError as exc:  # a row an older version or a DBA wrote
            return self._kill_undecodable(leased.lease, str(exc))
        config = get_memory_config()
        try:
            updated = updater.process(context, leased.lease)
        except LeaseLostError as exc:
            self._count("taken_over")
            logger.info("queued conversation %d not saved: %s", leased.lease.row_id, exc)
            return False
        except StaleDocumentError:
            self._count("skipped")  # the store logged why; the conversation is dropped with its row
            return self._settle(
                leased.lease, lambda conn, now: queue_table.complete(conn, leased.lease, now=now, forget=True)
            )
        except (StorageUnavailableError, LLMUnavailableError) as exc:
            retry_after = exc.retry_after if isinstance(exc, LLMUnavailableError) else None
            if retry_after:
                self.pause.pause(retry_after)
            return self._retry(leased, config, exc, permanent=False, retry_after=retry_after)
        except Exception as exc:
            return self._retry(leased, config, exc, permanent=True)
        self._count("updated" if updated else "skipped")
        if leased.lease.settled:  # the save completed the row in its committed transaction
            return True
        # Nothing was saved (nothing to learn), so nothing settled it.
        return self._settle(leased.lease, lambda conn, now: queue_table.complete(conn, leased.lease, now=now))

    def _retry(
        self,
        leased: LeasedConversation,
        config: MemoryConfig,
        exc: Exception,
        *,
        permanent: bool,
        retry_after: float | None = None,
    ) -> bool:
        error = f"{type(exc).__name__}: {exc}"
        dead = permanent and leased.failures + 1 >= config.update_max_attempts
        delay = jittered_delay(leased.attempts, config, retry_after)
        row = leased.lease.row_id
        if dead:
            self._count("dead")
            logger.error(
                "queued conversation %d failed %d time(s) and is dead (`memstore queue retry` runs "
                "it again): %s",
                row,
                leased.failures + 1,
                describe_failure(exc),
            )
        else:
            self._count("retries")
            logger.warning(
                "queued conversation %d failed (attempt %d); retrying in %.1f s: %s",
                row,
                leased.attempts,
                delay,
                describe_failure(exc),
            )
        return self._settle(
            leased.lease,
            lambda conn, now: queue_table.reschedule(
                conn,
                leased.lease,
                now=now,
                due_at=now + timedelta(seconds=delay),
                error=error,
                permanent=permanent,
                dead=dead,
            ),
        )

    def _settle(self, lease: QueueLease, write: Callable[..., bool]) -> bool:
        """``write`` in a transaction of its own; ``True`` once it committed (whether or not the
        row was still this lease's: either way nothing of it is left for a release)."""
        try:
            with self._engine.connect() as conn:
                conn.execution_options(**write_transaction_options(get_memory_config()))
                with conn.begin():
                    write(conn, utcnow())
        except SQLAlchemyError as exc:
            # The lease expires and another worker runs the conversation again: nothing is lost.
            logger.warning(
                "could not settle queued conversation %d (it will run again): %s",
                lease.row_id,
                describe_db_error(exc),
            )
            return False
        except Exception as exc:
            self.failures.report("settle of a conversation", exc, "it will run again")
            return False
        return True
