"""``memstore config show``: the effective settings, and where each one came from.

Sources, in the order the loader applies them: the default, the ``memory:`` section of the
settings file (``--config`` or ``$MEMSTORE_CONFIG``), a ``MEMSTORE_<FIELD>`` variable (and
``OPENAI_API_KEY`` for ``llm_api_key``). Secrets show as ``***`` when set, and the database
URL with its password masked.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click
import yaml
from pydantic import SecretStr

from memstore.cli.output import echo_json, echo_table
from memstore.config import CONFIG_PATH_ENV, ENV_PREFIX, MemoryConfig, get_memory_config
from memstore.errors import ConfigError
from memstore.queue.process import queue_backend
from memstore.storage.sql.engine import mask_url


def _file_keys() -> tuple[str | None, set[str]]:
    path = os.environ.get(CONFIG_PATH_ENV)
    if not path:
        return None, set()
    # get_memory_config() has already read and validated this file; only its keys are wanted here.
    loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    section = loaded.get("memory") if isinstance(loaded, dict) else None
    return path, set(section) if isinstance(section, dict) else set()


def _source(field: str, path: str | None, in_file: set[str]) -> str:
    if ENV_PREFIX + field.upper() in os.environ:
        return f"environment ({ENV_PREFIX}{field.upper()})"
    if field in in_file:
        return f"file ({path})"
    if field == "llm_api_key" and os.environ.get("OPENAI_API_KEY"):
        return "environment (OPENAI_API_KEY)"
    return "default"


DATABASE_URL_FIELDS = ("database_url", "operator_database_url", "database_read_url")
"""Settings that hold a database URL, shown with any password as ``***``."""


def settings_with_sources(config: MemoryConfig) -> dict[str, dict[str, Any]]:
    """``{setting: {"value", "source"}}`` in field order, JSON-ready and with secrets masked.

    An unset ``queue_backend`` shows the backend it resolves to, with the source saying so: a
    blank there read as "no queue".
    """
    path, in_file = _file_keys()
    dumped = config.model_dump(mode="json")
    shown: dict[str, dict[str, Any]] = {}
    for field in MemoryConfig.model_fields:
        value = "***" if isinstance(getattr(config, field), SecretStr) else dumped[field]
        if field in DATABASE_URL_FIELDS and isinstance(value, str):
            value = mask_url(value)
        shown[field] = {"value": value, "source": _source(field, path, in_file)}
    if config.queue_backend is None:
        try:
            backend = queue_backend(config)
        except ConfigError:
            pass  # storage_class cannot be loaded: the unset value stays, and `doctor` says why
        else:
            shown["queue_backend"] = {"value": backend, "source": "derived from storage_class"}
    return shown


@click.group()
def config() -> None:
    """Inspect the settings memstore runs with."""


@config.command()
@click.option("--json", "as_json", is_flag=True, help="Print {setting: {value, source}} as JSON.")
def show(as_json: bool) -> None:
    """The effective settings and where each came from; secrets masked."""
    shown = settings_with_sources(get_memory_config())
    if as_json:
        echo_json(shown)
        return
    rows = [
        (name, "" if entry["value"] is None else _text(entry["value"]), entry["source"])
        for name, entry in shown.items()
    ]
    echo_table(("SETTING", "VALUE", "SOURCE"), rows)


def _text(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(str(item) for item in value)
    return str(value).lower() if isinstance(value, bool) else str(value)
