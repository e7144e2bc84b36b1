"""``MemoryConfig``: one validated model built from YAML and ``MEMSTORE_*`` environment variables.

pydantic-settings loads it (``_LoadedMemoryConfig``); memstore reads the YAML file itself, because
a missing or malformed settings file must be an error that names the file, never an empty config.
"""

from __future__ import annotations

import difflib
import json
import logging
import math
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from memstore.config_agent_docs import AgentDocSettings
from memstore.config_replicas import ReplicaSettings
from memstore.config_sessions import SessionSettings
from memstore.errors import ConfigError

logger = logging.getLogger(__name__)

ENV_PREFIX = "MEMSTORE_"
CONFIG_PATH_ENV = "MEMSTORE_CONFIG"
OTHER_ENV = frozenset({CONFIG_PATH_ENV, "MEMSTORE_RELIABILITY_REPORT", "MEMSTORE_DB_PASSWORD"})
"""``MEMSTORE_*`` names that are no setting but are read elsewhere: the settings file, the
reliability report, compose.yaml's database password."""
OTHER_ENV_PREFIXES = ("MEMSTORE_TEST_", "MEMSTORE_BENCH_")
"""The test suite's and the benchmark's own variables (their servers, the browser, ...)."""
SQL_STORAGE_CLASS = "memstore.storage.sql.SqlMemoryStorage"
FILE_STORAGE_CLASS = "memstore.storage.file.FileMemoryStorage"
FILE_MAX_FACTS = 500
"""The largest ``max_facts`` the file provider accepts: each save rewrites (and fsyncs) the scope's
whole JSON document, and each read parses it whole, so thousands of facts per scope are the SQL
provider's job, which writes only what changed."""


class MemoryConfig(SessionSettings, AgentDocSettings, ReplicaSettings, BaseModel):
    """Every memstore setting. Field names and defaults follow the reference pipeline."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, hide_input_in_errors=True)

    enabled: bool = True
    storage_class: str = SQL_STORAGE_CLASS
    storage_path: str = Field(
        default="",
        description="File provider only: path of the legacy global document (no user, no agent); "
        "relative paths resolve against data_dir.",
    )
    data_dir: str = "./.memstore"
    database_url: str | None = None
    # The connection for work that crosses tenants (the queue worker's claims, stats, erase,
    # vacuum, lifecycle, backup, migrations): a superuser or BYPASSRLS role. Unset: database_url,
    # which is right when that role bypasses row-level security (the table owner as superuser).
    operator_database_url: str | None = None
    auto_migrate: bool = False
    debounce_seconds: int = Field(default=30, ge=1, le=300)
    model_name: str | None = None
    # Facts kept per scope. Past 500 only on the SQL provider (the file provider rewrites the whole
    # document per save); the update prompt then shows the update_prompt_max_facts most relevant.
    max_facts: int = Field(default=100, ge=10, le=20_000)
    update_prompt_max_facts: int = Field(default=200, ge=20, le=2000)
    # Live facts one tenant may hold across all its users; unset: no cap (SQL provider).
    tenant_max_facts: int | None = Field(default=None, ge=1)
    fact_confidence_threshold: float = Field(default=0.7, ge=0.0, le=1.0)
    mode: Literal["middleware", "tool"] = "middleware"
    injection_enabled: bool = True
    max_injection_tokens: int = Field(default=2000, ge=100, le=8000)
    token_counting: Literal["tiktoken", "char"] = "tiktoken"
    guaranteed_categories: list[str] = Field(default_factory=lambda: ["correction"])
    guaranteed_token_budget: int = Field(default=500, ge=50, le=2000)
    shutdown_timeout_seconds: float = Field(default=30.0, gt=0, le=600)
    max_queue_depth: int = Field(default=10_000, ge=1, le=1_000_000)
    # At least one conversation at the queue's per-conversation cap (MAX_QUEUED_CONVERSATION_CHARS).
    max_queue_chars: int = Field(default=100_000_000, ge=64_000, le=10_000_000_000)
    # The most of both bounds one user may hold (at least one conversation of the largest size).
    queue_user_share: float = Field(default=0.1, gt=0.0, le=1.0)
    # The most of both bounds one tenant may hold; 1.0: no cap beyond the totals.
    queue_tenant_share: float = Field(default=1.0, gt=0.0, le=1.0)
    update_max_attempts: int = Field(default=10, ge=1, le=100)
    update_retry_base_seconds: float = Field(default=2.0, gt=0, le=3600)
    update_retry_max_seconds: float = Field(default=300.0, gt=0, le=86_400)
    memory_context_timeout_seconds: float = Field(default=2.0, gt=0, le=60)
    write_lock_timeout_seconds: float = Field(default=5.0, gt=0, le=600)
    write_statement_timeout_seconds: float = Field(default=30.0, gt=0, le=3600)
    llm_base_url: str | None = None
    llm_api_key: SecretStr | None = None
    llm_timeout_seconds: float = Field(default=60.0, gt=0, le=3600)
    llm_json_mode: bool = True
    extractor: Literal["auto", "llm", "rules"] = "auto"
    queue_backend: Literal["database", "memory"] | None = Field(
        default=None,
        description="Where queued conversations wait: 'database' (the default with the SQL provider) "
        "or 'memory' (the default otherwise).",
    )
    queue_workers: int = Field(default=4, ge=0, le=64)
    queue_lease_seconds: float = Field(default=60.0, ge=0.5, le=3600)
    queue_poll_seconds: float = Field(default=1.0, gt=0, le=60)
    queue_enqueue_timeout_seconds: float = Field(default=2.0, gt=0, le=60)
    # The queue lag /readyz reports as lagging (and doctor warns about); never makes the API unready.
    ready_max_queue_lag_seconds: float = Field(default=300.0, ge=1, le=86_400)
    # Staleness review and consolidation (the reference's fields and defaults).
    staleness_review_enabled: bool = True
    staleness_age_days: int = Field(default=90, ge=30, le=365)
    staleness_min_candidates: int = Field(default=3, ge=1, le=50)
    staleness_max_removals_per_cycle: int = Field(default=10, ge=1, le=50)
    staleness_protected_categories: list[str] = Field(default_factory=lambda: ["correction"])
    consolidation_enabled: bool = False
    consolidation_min_facts: int = Field(default=8, ge=3, le=30)
    consolidation_max_groups_per_cycle: int = Field(default=3, ge=1, le=10)
    consolidation_max_sources: int = Field(default=8, ge=2, le=20)
    # Retention: which facts go at max_facts, and which decay away (docs/operations.md).
    eviction_policy: Literal["hybrid", "confidence"] = "hybrid"
    eviction_confidence_weight: float = Field(default=0.65, ge=0.0, le=1.0)
    eviction_confirmation_weight: float = Field(default=0.25, ge=0.0, le=1.0)
    eviction_access_weight: float = Field(default=0.10, ge=0.0, le=1.0)
    confirmation_half_life_days: float = Field(default=90.0, ge=1, le=3650)
    access_half_life_days: float = Field(default=30.0, ge=1, le=3650)
    eviction_reserved_fraction: float = Field(default=0.10, ge=0.0, le=1.0)
    eviction_reserved_max: int = Field(default=10, ge=0, le=500)
    expire_below: float | None = Field(default=None, gt=0.0, lt=1.0)
    lifecycle_interval_seconds: float = Field(default=3600.0, ge=60, le=7 * 86_400)
    # Relevance: embeddings, similarity dedup, query-aware ranking (docs/operations.md).
    embedding_provider: Literal["none", "openai", "local"] = "none"
    # 240: stored as "openai:<model>@<dimensions>" in a 255-character column.
    embedding_model: str | None = Field(default=None, max_length=240)
    embedding_base_url: str | None = None
    embedding_api_key: SecretStr | None = None
    embedding_dimensions: int | None = Field(default=None, ge=1, le=8192)
    embedding_batch_size: int = Field(default=64, ge=1, le=2048)
    embedding_timeout_seconds: float = Field(default=30.0, gt=0, le=600)
    dedup_similarity: float = Field(default=0.97, gt=0.0, le=1.0)
    relevance_rrf_k: int = Field(default=60, ge=1, le=1000)
    relevance_semantic_weight: float = Field(default=1.0, ge=0.0, le=10.0)
    relevance_fulltext_weight: float = Field(default=0.5, ge=0.0, le=10.0)
    relevance_confidence_weight: float = Field(default=0.1, ge=0.0, le=10.0)
    relevance_recency_weight: float = Field(default=0.05, ge=0.0, le=10.0)
    # How the semantic and full-text signals combine: "convex" (their scores, each scaled to 0..1,
    # weighted by relevance_semantic_weight and relevance_fulltext_weight) or "rrf" (their ranks).
    relevance_fusion: Literal["convex", "rrf"] = "convex"
    # Full-text search: "any" word of the query ranked by BM25 (stopwords dropped), or "all" of them.
    fulltext_match: Literal["any", "all"] = "any"
    # Candidates each retriever (vectors, full-text index) gives a hybrid search (docs/performance.md).
    hybrid_pool: int = Field(default=50, ge=10, le=500)
    # Each injected fact line carries the date it was stated ("- [category | 0.90 | 2026-05-08] ...").
    injection_fact_dates: bool = True
    access_tracking: bool = True
    access_interval_seconds: float = Field(default=300.0, ge=1, le=86_400)
    # Memory records (memstore.record): what extraction keeps, and the near-duplicates the LLM
    # decides on (similarity at least adjudication_similarity, below dedup_similarity; None: off).
    fact_importance_threshold: float = Field(default=0.0, ge=0.0, le=1.0)
    adjudication_similarity: float | None = Field(default=0.85, gt=0.0, le=1.0)
    adjudication_max_candidates: int = Field(default=5, ge=1, le=20)
    # Ranking by the record's importance and decay score, and an optional rerank of the top hits
    # (memstore.inject.rerank; rerank_model is the endpoint's model, or the chat model for "llm").
    relevance_importance_weight: float = Field(default=0.0, ge=0.0, le=10.0)
    relevance_decay_weight: float = Field(default=0.0, ge=0.0, le=10.0)
    rerank: Literal["none", "endpoint", "llm"] = "none"
    rerank_base_url: str | None = None
    rerank_model: str | None = None
    rerank_api_key: SecretStr | None = None
    rerank_top_n: int = Field(default=20, ge=2, le=200)
    rerank_timeout_seconds: float = Field(default=5.0, gt=0, le=60)
    # The DeerFlow adapters hand DeerFlow the memory-record keys (type, importance, tags...) only
    # when on; off, they are hidden and restored on DeerFlow's saves (integrations.deerflow.record_view).
    deerflow_record_fields: bool = False

    @field_validator("*")
    @classmethod
    def _finite(cls, value: Any) -> Any:
        """No setting takes NaN or infinity (pydantic's floats would)."""
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value

    @field_validator("storage_class")
    @classmethod
    def _dotted_path(cls, value: str) -> str:
        if "." not in value.strip():
            raise ValueError("must be a dotted class path such as memstore.storage.sql.SqlMemoryStorage")
        return value.strip()

    @model_validator(mode="after")
    def _weights_sum_to_one(self) -> MemoryConfig:
        total = sum(
            (self.eviction_confidence_weight, self.eviction_confirmation_weight, self.eviction_access_weight)
        )
        if not math.isclose(total, 1.0, abs_tol=1e-9):
            raise ValueError(f"the three eviction weights must sum to 1.0 (they sum to {total:g})")
        return self

    @model_validator(mode="after")
    def _embedding_settings(self) -> MemoryConfig:
        if self.embedding_provider == "openai" and not (self.embedding_model or "").strip():
            raise ValueError("embedding_provider 'openai' needs embedding_model")
        weights = (
            self.relevance_semantic_weight,
            self.relevance_fulltext_weight,
            self.relevance_confidence_weight,
            self.relevance_recency_weight,
        )
        if not any(weight > 0 for weight in weights):
            raise ValueError("at least one relevance_*_weight must be above 0")
        return self

    @model_validator(mode="after")
    def _file_provider_cap(self) -> MemoryConfig:
        if self.storage_class == FILE_STORAGE_CLASS and self.max_facts > FILE_MAX_FACTS:
            raise ValueError(
                f"max_facts {self.max_facts} is over {FILE_MAX_FACTS}, the most the file provider keeps "
                "per scope (it rewrites a scope's whole JSON file on every save): lower max_facts or "
                f"use the SQL provider (storage_class: {SQL_STORAGE_CLASS})"
            )
        return self

    @model_validator(mode="after")
    def _rerank_settings(self) -> MemoryConfig:
        if self.rerank == "endpoint" and not (self.rerank_base_url or "").strip():
            raise ValueError("rerank 'endpoint' needs rerank_base_url")
        if self.rerank == "llm" and not (self.rerank_model or self.model_name or "").strip():
            raise ValueError("rerank 'llm' needs model_name (or rerank_model)")
        return self

    @model_validator(mode="after")
    def _api_key_from_environment(self) -> MemoryConfig:
        if self.llm_api_key is None and os.environ.get("OPENAI_API_KEY"):
            # Bypass validate_assignment: re-entering validation here would recurse.
            object.__setattr__(self, "llm_api_key", SecretStr(os.environ["OPENAI_API_KEY"]))
        return self


class _EnvironmentSource(EnvSettingsSource):
    """``MEMSTORE_<FIELD>`` variables, read by pydantic-settings, with memstore's two conventions.

    Only the upper-case spelling counts (a lower-case ``memstore_max_facts`` is not read), a
    list may be comma-separated as well as JSON, and an empty value unsets an optional setting,
    so it also clears a value the settings file gave.
    """

    def __init__(self, settings_cls: type[BaseSettings]) -> None:
        super().__init__(settings_cls)
        self.exact = {
            name: value
            for name, value in os.environ.items()
            if name.startswith(ENV_PREFIX) and name.isupper()
        }
        self.env_vars = {name.lower(): value for name, value in self.exact.items()}

    def prepare_field_value(
        self, field_name: str, field: FieldInfo, value: Any, value_is_complex: bool
    ) -> Any:
        if isinstance(value, str) and get_origin(field.annotation) is list:
            stripped = value.strip()
            if not stripped.startswith("["):
                return [part.strip() for part in stripped.split(",") if part.strip()]
            try:
                return json.loads(stripped)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"invalid memory config: {field_name}: {exc}") from exc
        return super().prepare_field_value(field_name, field, value, value_is_complex)

    def __call__(self) -> dict[str, Any]:
        values = super().__call__()
        for name, field in self.settings_cls.model_fields.items():
            if self.exact.get(ENV_PREFIX + name.upper()) == "" and type(None) in get_args(field.annotation):
                values[name] = None
        return values


class _LoadedMemoryConfig(BaseSettings, MemoryConfig):
    """``MemoryConfig`` as pydantic-settings loads it: the file's values, then the environment's."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="forbid", validate_assignment=True, hide_input_in_errors=True
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # First wins: a variable beats the file's value (passed as init values); no .env, no secrets dir.
        return (_EnvironmentSource(settings_cls), init_settings)


def _read_yaml_section(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"memory config file not found: {path}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read memory config file {path}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"memory config file {path} is not valid YAML: {exc}") from exc
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"memory config file {path} must be a mapping with a 'memory:' section")
    # Anything beside `memory:` (a setting at the top level, a `memstore:` section) would be
    # ignored, and memstore would run on its defaults while the file seemed to be in use.
    unknown = [str(key) for key in loaded if key != "memory"]
    if unknown:
        names = ", ".join(repr(key) for key in unknown)
        hint = (
            "; indent the settings under 'memory:'"
            if any(key in MemoryConfig.model_fields for key in unknown)
            else ""
        )
        raise ConfigError(
            f"memory config file {path}: unknown top-level key{'s' if len(unknown) > 1 else ''} {names} "
            f"(memstore reads only its 'memory:' section){hint}"
        )
    section = loaded.get("memory") or {}
    if not isinstance(section, dict):
        raise ConfigError(f"'memory' in {path} must be a mapping, got {type(section).__name__}")
    return section


def _problems(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(part) for part in err['loc']) or '<root>'}: {err['msg']}" for err in exc.errors()
    )


def build_memory_config(values: dict[str, Any], *, origin: str = "memory config") -> MemoryConfig:
    """Validate ``values``, turning pydantic's error into one message that names each bad field."""
    try:
        return MemoryConfig(**values)
    except ValidationError as exc:
        raise ConfigError(f"invalid {origin}: {_problems(exc)}") from exc


def unknown_env_settings(environ: Mapping[str, str] = os.environ) -> list[str]:
    """A message per ``MEMSTORE_*`` variable that names no setting, with the closest one if any.

    A typo such as ``MEMSTORE_DATABASE_URI`` was silently ignored, and memstore fell back to
    SQLite in ``./.memstore``.
    """
    settings = sorted(ENV_PREFIX + field.upper() for field in MemoryConfig.model_fields)
    messages = []
    for name in sorted(environ):
        known = name in settings or name in OTHER_ENV or name.startswith(OTHER_ENV_PREFIXES)
        if name.startswith(ENV_PREFIX) and not known:
            close = difflib.get_close_matches(name, settings, n=1, cutoff=0.8)
            hint = f"; did you mean {close[0]}?" if close else ""
            messages.append(f"{name} is not a memstore setting and is ignored{hint}")
    return messages


def ignored_env_settings(config: MemoryConfig, environ: Mapping[str, str] = os.environ) -> list[str]:
    """The ``MEMSTORE_<FIELD>`` variables that ``config``, built in code, leaves unread.

    ``MemoryConfig(...)`` reads no environment: a deployment that sets
    ``MEMSTORE_EMBEDDING_PROVIDER`` and hands the middleware a config made in code ran without
    embeddings, with no sign of it. Fields the code set itself are its choice and not listed.
    """
    return sorted(
        ENV_PREFIX + field.upper()
        for field in MemoryConfig.model_fields
        if field not in config.model_fields_set and ENV_PREFIX + field.upper() in environ
    )


def load_memory_config(path: str | os.PathLike[str] | None = None, **overrides: Any) -> MemoryConfig:
    """Read the YAML file (argument, else ``$MEMSTORE_CONFIG``), then let ``MEMSTORE_<FIELD>`` win,
    then ``overrides``: the way to build a config in code that still reads the environment.

    A ``MEMSTORE_*`` variable that names no setting is logged at WARNING as a likely typo.
    """
    for message in unknown_env_settings():
        logger.warning("%s", message)
    config_path = path if path is not None else os.environ.get(CONFIG_PATH_ENV)
    from_file = _read_yaml_section(Path(config_path)) if config_path else {}
    # Exact names only: pydantic-settings would match the file's keys in any case, and take
    # keys such as _env_file as its own options.
    unknown = [key for key in (*from_file, *overrides) if key not in MemoryConfig.model_fields]
    if unknown:
        problems = "; ".join(f"{key}: Extra inputs are not permitted" for key in unknown)
        raise ConfigError(f"invalid memory config: {problems}")
    try:
        loaded = _LoadedMemoryConfig(**from_file)
    except ValidationError as exc:
        raise ConfigError(f"invalid memory config: {_problems(exc)}") from exc
    except SettingsError as exc:
        if isinstance(exc.__cause__, ConfigError):
            raise exc.__cause__ from None
        raise ConfigError(f"invalid memory config: {exc}") from exc
    values = dict(loaded)
    if overrides:
        try:
            values = MemoryConfig(**{**values, **overrides}).model_dump()
        except ValidationError as exc:
            raise ConfigError(f"invalid memory config: {_problems(exc)}") from exc
    # A plain MemoryConfig, equal to one built by hand with the same values.
    return MemoryConfig.model_construct(loaded.model_fields_set | set(overrides), **values)


_config: MemoryConfig | None = None
_config_lock = threading.Lock()


def get_memory_config() -> MemoryConfig:
    """The process-wide config, loaded from file and environment on first use."""
    global _config
    with _config_lock:
        if _config is None:
            _config = load_memory_config()
        return _config


def set_memory_config(config: MemoryConfig | None) -> None:
    """Replace the process-wide config; ``None`` makes the next ``get_memory_config`` reload it."""
    global _config
    with _config_lock:
        _config = config
