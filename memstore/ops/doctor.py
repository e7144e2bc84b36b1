"""``memstore doctor``: is this setup able to work? One finding per part, each with a verdict.

The parts, in the order a failure would explain the next: the database URL, the database and its
schema, the durable queue, (on PostgreSQL) row-level security on the application's and the
operator's connections, the LLM endpoint, the embeddings endpoint and the token encoding.
Nothing is written and no completion is bought: an endpoint is probed with ``GET /models``, and
any HTTP answer but 401/403 counts as reachable (not every compatible server lists models).
"""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from sqlalchemy import Engine, func, select, text
from sqlalchemy.exc import DBAPIError

from memstore.config import SQL_STORAGE_CLASS, MemoryConfig, get_memory_config, unknown_env_settings
from memstore.errors import ConfigError, MigrationError, StorageUnavailableError
from memstore.inject.tokens import ENCODING_NAME
from memstore.ops.health import first_line
from memstore.queue.bounds import table_limits
from memstore.storage.sql.engine import (
    database_url_from_config,
    get_engine,
    mask_url,
    normalize_url,
    operator_url_from_config,
)
from memstore.storage.sql.identity import policies_apply
from memstore.storage.sql.queue.admin import queue_status
from memstore.storage.sql.schema import migrate
from memstore.storage.sql.schema.models import scopes_table
from memstore.update.extractor import resolve_extractor
from memstore.update.updater import MemoryUpdater

Verdict = Literal["ok", "warn", "fail", "skip"]
PROBE_TIMEOUT_SECONDS = 5.0


@dataclass(frozen=True)
class Finding:
    part: str
    verdict: Verdict
    detail: str


def diagnose(config: MemoryConfig | None = None) -> list[Finding]:
    config = config or get_memory_config()
    return [_settings(), *_database(config), _llm(config), _embeddings(config), _tokens(config)]


def _settings() -> Finding:
    typos = unknown_env_settings()
    if typos:
        return Finding("settings", "warn", "; ".join(typos))
    return Finding("settings", "ok", "every MEMSTORE_* variable names a setting")


def _database(config: MemoryConfig) -> list[Finding]:
    """The database, schema and queue findings; a part that cannot be checked is a ``skip`` that
    says why, so the three lines are always there."""
    if config.storage_class != SQL_STORAGE_CLASS:
        return _skipped(
            Finding("database", "skip", f"storage_class is {config.storage_class}: no database"),
            "no database",
        )
    url = database_url_from_config(config)
    try:
        normalize_url(url)
    except ConfigError as exc:
        return _skipped(Finding("database", "fail", str(exc)), "the database check failed")
    shown = mask_url(url)
    try:
        found = migrate.current(url)
    except (DBAPIError, MigrationError) as exc:
        failed = Finding("database", "fail", f"cannot reach {shown}: {first_line(exc)}")
        return _skipped(failed, "the database check failed")
    head = migrate.head()
    findings = [Finding("database", "ok", f"reachable: {shown}")]
    if found != head:
        at = f"at {found or '<base> (empty)'}, head is {head}"
        if found is not None and found not in {script.revision for script in migrate.history()}:
            findings.append(Finding("schema", "fail", f"{at}: written by a newer memstore; upgrade memstore"))
        elif url.startswith("sqlite") or config.auto_migrate:
            findings.append(Finding("schema", "ok", f"{at}: migrated when memstore first opens it"))
        else:
            findings.append(Finding("schema", "fail", f"{at}: run `memstore db upgrade`"))
        findings.append(Finding("queue", "skip", "the schema is not at head"))
        return findings + _row_security(url, config, at_head=False)
    findings.append(Finding("schema", "ok", f"at head {head}"))
    if config.queue_backend in (None, "database"):
        # Every tenant's rows: the operator's connection, when there is one.
        findings.append(_queue(operator_url_from_config(config), config))
    else:
        findings.append(Finding("queue", "skip", "queue_backend is memory: each process queues its own"))
    return findings + _row_security(url, config, at_head=True)


def _skipped(database: Finding, reason: str) -> list[Finding]:
    return [database, Finding("schema", "skip", reason), Finding("queue", "skip", reason)]


def _queue(url: str, config: MemoryConfig) -> Finding:
    try:
        with get_engine(url).connect() as conn:
            status = queue_status(conn, datetime.now(UTC), table_limits(config))
    except (DBAPIError, StorageUnavailableError) as exc:
        return Finding("queue", "fail", f"cannot read the queue: {exc}")
    lag = status.oldest_pending_seconds
    detail = f"{status.pending} pending, {status.leased} leased, {status.dead} dead"
    if lag is not None:
        detail += f", oldest waiting {lag:.0f} s"
    if status.dead or (lag is not None and lag > config.ready_max_queue_lag_seconds):
        return Finding("queue", "warn", detail + " (memstore queue status)")
    return Finding("queue", "ok", detail)


def _row_security(url: str, config: MemoryConfig, *, at_head: bool) -> list[Finding]:
    """PostgreSQL only: does row-level security bind the application's role, and does the
    operator's connection (the worker's claims, stats, erase, vacuum, backup) get past it?"""
    if not url.startswith("postgres"):
        return []
    try:
        app, app_bound = _role(get_engine(url))
    except DBAPIError as exc:
        return [Finding("rls", "fail", f"cannot read the application's role: {first_line(exc)}")]
    operator_url = config.operator_database_url
    if operator_url:
        shown = mask_url(operator_url)
        try:
            operator, operator_bound = _role(get_engine(operator_url))
        except (DBAPIError, ConfigError) as exc:
            return [Finding("rls", "fail", f"cannot reach operator_database_url {shown}: {first_line(exc)}")]
        if operator_bound:
            return [
                Finding(
                    "rls",
                    "fail",
                    f"operator_database_url's role {operator} is bound by row-level security, so the "
                    "worker's claims, stats, erase, vacuum and backup see no tenant's rows: "
                    f"ALTER ROLE {operator} BYPASSRLS, or use a superuser",
                )
            ]
    if app_bound:
        if not operator_url:
            return [
                Finding(
                    "rls",
                    "fail",
                    f"the application's role {app} is bound by row-level security and "
                    "operator_database_url is not set: the queue worker cannot claim across tenants, "
                    "and stats, erase, vacuum, lifecycle and backup see no rows; set "
                    "MEMSTORE_OPERATOR_DATABASE_URL to a superuser or BYPASSRLS role",
                )
            ]
        return [
            Finding(
                "rls",
                "ok",
                f"the application's role {app} is bound by row-level security; the operator's "
                f"role {operator} bypasses it",
            )
        ]
    detail = (
        f"the application's role {app} bypasses row-level security (superuser or BYPASSRLS): only "
        "memstore's own queries keep tenants apart; `memstore db grant-app-role` makes a role it binds"
    )
    tenants = _tenants(get_engine(url)) if at_head else 1
    if tenants > 1:
        return [Finding("rls", "warn", f"{tenants} tenants, and {detail}")]
    return [Finding("rls", "ok", detail)]


def _role(engine: Engine) -> tuple[str, bool]:
    """The connection's role, and whether the policies bind it."""
    with engine.connect() as conn:
        role = str(conn.execute(text("SELECT current_user")).scalar_one())
    return role, policies_apply(engine)


def _tenants(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count(scopes_table.c.tenant_id.distinct()))).scalar_one())


def _llm(config: MemoryConfig) -> Finding:
    endpoint = config.llm_base_url or "https://api.openai.com/v1"
    try:
        if resolve_extractor(config) == "rules":
            return Finding("llm", "skip", "no endpoint configured: updates use the offline rules extractor")
        # The check every queue worker makes before its first claim (a missing model_name, say).
        MemoryUpdater(config=config).prepare()
    except ConfigError as exc:
        return Finding("llm", "fail", f"{endpoint}: {exc}")
    key = config.llm_api_key.get_secret_value() if config.llm_api_key else None
    return _probe("llm", endpoint, key, config.model_name)


def _embeddings(config: MemoryConfig) -> Finding:
    if config.embedding_provider == "none":
        return Finding("embeddings", "skip", "embedding_provider is none: ranking by confidence")
    if config.embedding_provider == "local":
        return Finding("embeddings", "ok", "the bundled local model (no endpoint)")
    base = config.embedding_base_url or config.llm_base_url or "https://api.openai.com/v1"
    secret = config.embedding_api_key or config.llm_api_key
    return _probe("embeddings", base, secret.get_secret_value() if secret else None, config.embedding_model)


def _probe(part: str, base_url: str, api_key: str | None, model: str | None) -> Finding:
    request = urllib.request.Request(base_url.rstrip("/") + "/models")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    where = f"{base_url} (model {model or 'default'})"
    try:
        with urllib.request.urlopen(request, timeout=PROBE_TIMEOUT_SECONDS):
            return Finding(part, "ok", f"reachable: {where}")
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            return Finding(part, "fail", f"{where} refused the API key (HTTP {exc.code})")
        return Finding(part, "ok", f"reachable: {where} (GET /models answered HTTP {exc.code})")
    except (urllib.error.URLError, TimeoutError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return Finding(part, "fail", f"cannot reach {where}: {reason}")


def _tokens(config: MemoryConfig) -> Finding:
    if config.token_counting == "char":
        return Finding("tokens", "skip", "token_counting is char: an estimate, no encoding")
    try:
        import tiktoken

        tiktoken.get_encoding(ENCODING_NAME).encode_ordinary("memstore")
    except Exception as exc:  # any failure to load is the finding
        return Finding("tokens", "fail", f"{ENCODING_NAME} does not load: {exc}")
    return Finding("tokens", "ok", f"{ENCODING_NAME} loads offline")
