"""MemoryConfig: defaults, YAML, environment overrides and errors that name the field."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pydantic import SecretStr

from memstore.config import MemoryConfig, get_memory_config, load_memory_config, set_memory_config
from memstore.errors import ConfigError


def test_defaults_follow_the_reference() -> None:
    config = MemoryConfig()
    assert config.enabled is True
    assert config.debounce_seconds == 30
    assert config.max_facts == 100
    assert config.fact_confidence_threshold == 0.7
    assert config.mode == "middleware"
    assert config.max_injection_tokens == 2000
    assert config.token_counting == "tiktoken"
    assert config.guaranteed_categories == ["correction"]
    assert config.guaranteed_token_budget == 500
    assert config.data_dir == "./.memstore"
    assert config.extractor == "auto"
    assert config.storage_class == "memstore.storage.sql.SqlMemoryStorage"
    assert config.llm_api_key is None


def test_yaml_section_then_environment_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "memory:\n  max_facts: 50\n  debounce_seconds: 5\n  guaranteed_categories: [correction, goal]\n",
        encoding="utf-8",
    )
    monkeypatch.setenv("MEMSTORE_DEBOUNCE_SECONDS", "7")
    monkeypatch.setenv("MEMSTORE_ENABLED", "false")
    config = load_memory_config(path)
    assert config.max_facts == 50
    assert config.debounce_seconds == 7
    assert config.enabled is False
    assert config.guaranteed_categories == ["correction", "goal"]


def test_config_path_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "memstore.yaml"
    path.write_text("memory:\n  mode: tool\n", encoding="utf-8")
    monkeypatch.setenv("MEMSTORE_CONFIG", str(path))
    assert load_memory_config().mode == "tool"


def test_list_from_comma_separated_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMSTORE_GUARANTEED_CATEGORIES", "correction, goal")
    assert load_memory_config().guaranteed_categories == ["correction", "goal"]


@pytest.mark.parametrize(
    ("env", "value"),
    [
        ("MEMSTORE_MAX_FACTS", "5"),
        ("MEMSTORE_TOKEN_COUNTING", "words"),
        ("MEMSTORE_FACT_CONFIDENCE_THRESHOLD", "nan"),
        ("MEMSTORE_DEBOUNCE_SECONDS", "soon"),
        ("MEMSTORE_EXTRACTOR", "magic"),
    ],
)
def test_invalid_values_name_the_field(monkeypatch: pytest.MonkeyPatch, env: str, value: str) -> None:
    monkeypatch.setenv(env, value)
    field = env.removeprefix("MEMSTORE_").lower()
    with pytest.raises(ConfigError, match=field):
        load_memory_config()


def test_unknown_yaml_key_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("memory:\n  max_fact: 50\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="max_fact"):
        load_memory_config(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "database_url: sqlite:///x.db\n",
            "unknown top-level key 'database_url' (memstore reads only its 'memory:' section); "
            "indent the settings under 'memory:'",
        ),
        (
            "memstore:\n  database_url: sqlite:///x.db\n",
            "unknown top-level key 'memstore' (memstore reads only its 'memory:' section)",
        ),
        (
            "memory:\n  max_facts: 50\nmax_facts: 60\nother: {x: 1}\n",
            "unknown top-level keys 'max_facts', 'other' (memstore reads only its 'memory:' section); "
            "indent the settings under 'memory:'",
        ),
    ],
)
def test_a_top_level_key_other_than_memory_is_an_error_naming_it(
    tmp_path: Path, text: str, message: str
) -> None:
    """Such a file was read as empty: memstore ran on ./.memstore while the file seemed in use."""
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as raised:
        load_memory_config(path)
    assert str(raised.value) == f"memory config file {path}: {message}"


def test_a_file_with_only_an_empty_memory_section_gives_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("# nothing set yet\nmemory:\n", encoding="utf-8")
    assert load_memory_config(path) == MemoryConfig()


def test_missing_config_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_memory_config(tmp_path / "absent.yaml")


def test_api_key_comes_from_openai_env_and_is_not_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-value")
    config = MemoryConfig()
    assert config.llm_api_key is not None
    assert config.llm_api_key.get_secret_value() == "sk-secret-value"
    assert "sk-secret-value" not in repr(config)


def test_assignment_is_validated() -> None:
    config = MemoryConfig()
    with pytest.raises(ValueError, match="max_injection_tokens"):
        config.max_injection_tokens = 10


def test_process_wide_config_can_be_replaced() -> None:
    replacement = MemoryConfig(max_facts=42)
    set_memory_config(replacement)
    assert get_memory_config() is replacement


def test_a_misspelt_variable_is_reported_with_the_setting_it_resembles(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("MEMSTORE_DATABASE_URI", "postgresql://db/memstore")
    monkeypatch.setenv("MEMSTORE_WHATEVER", "1")
    monkeypatch.setenv("MEMSTORE_TEST_PG_URL", "postgresql://elsewhere")  # read by the tests, not a typo
    with caplog.at_level(logging.WARNING, logger="memstore.config"):
        config = load_memory_config()
    assert config.database_url is None  # ignored, as before, but no longer silently
    assert [record.getMessage() for record in caplog.records] == [
        "MEMSTORE_DATABASE_URI is not a memstore setting and is ignored; did you mean MEMSTORE_DATABASE_URL?",
        "MEMSTORE_WHATEVER is not a memstore setting and is ignored",
    ]


def test_an_empty_variable_unsets_an_optional_setting_the_file_gave(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "memory:\n  database_url: postgresql://db/memstore\n  expire_below: 0.2\n", encoding="utf-8"
    )
    assert load_memory_config(path).database_url == "postgresql://db/memstore"
    monkeypatch.setenv("MEMSTORE_DATABASE_URL", "")
    monkeypatch.setenv("MEMSTORE_EXPIRE_BELOW", "")
    monkeypatch.setenv("MEMSTORE_DATA_DIR", "")  # not optional: stays the empty string it says
    config = load_memory_config(path)
    assert (config.database_url, config.expire_below, config.data_dir) == (None, None, "")


def test_lists_take_json_too_and_bad_json_names_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMSTORE_STALENESS_PROTECTED_CATEGORIES", '["correction", "goal, with comma"]')
    assert load_memory_config().staleness_protected_categories == ["correction", "goal, with comma"]
    monkeypatch.setenv("MEMSTORE_GUARANTEED_CATEGORIES", "[correction")
    with pytest.raises(ConfigError, match=r"^invalid memory config: guaranteed_categories: Expecting value"):
        load_memory_config()


def test_only_the_upper_case_spelling_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("memstore_max_facts", "20")
    monkeypatch.setenv("MEMSTORE_Max_Facts", "30")
    assert load_memory_config().max_facts == 100


def test_a_loaded_config_is_a_plain_memory_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMSTORE_MAX_FACTS", "42")
    monkeypatch.setenv("MEMSTORE_LLM_API_KEY", "sk-from-env")
    loaded = load_memory_config()
    assert type(loaded) is MemoryConfig
    assert loaded == MemoryConfig(max_facts=42, llm_api_key=SecretStr("sk-from-env"))
    with pytest.raises(ValueError, match="max_facts"):
        loaded.max_facts = 1  # still validated on assignment


@pytest.mark.parametrize("key", ["MAX_FACTS", "Database_Url", "_env_file", "_cli_parse_args", 7])
def test_a_file_key_must_be_a_setting_name_exactly(tmp_path: Path, key: object) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(f"memory:\n  {key}: 30\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=f"^invalid memory config: {key}: Extra inputs are not permitted$"):
        load_memory_config(path)


def test_an_unreadable_file_is_an_error_naming_it(tmp_path: Path) -> None:
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"memory:\n  max_facts: \xf0\x28\x8c\x28\n")
    with pytest.raises(ConfigError, match=f"^cannot read memory config file {binary}: 'utf-8' codec"):
        load_memory_config(binary)
    with pytest.raises(ConfigError, match=f"^cannot read memory config file {tmp_path}: "):
        load_memory_config(tmp_path)


def test_load_memory_config_takes_code_values_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one way to build a config in code that still reads MEMSTORE_*: code wins, env fills in."""
    monkeypatch.setenv("MEMSTORE_EMBEDDING_PROVIDER", "local")
    monkeypatch.setenv("MEMSTORE_MAX_FACTS", "200")
    config = load_memory_config(max_facts=300, debounce_seconds=5)
    assert (config.embedding_provider, config.max_facts, config.debounce_seconds) == ("local", 300, 5)
    assert type(config) is MemoryConfig
    with pytest.raises(ConfigError, match="max_facts"):
        load_memory_config(max_facts=5)
    with pytest.raises(ConfigError, match="no_such_setting"):
        load_memory_config(no_such_setting=1)


def test_a_config_built_in_code_warns_of_the_environment_it_ignores(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from memstore.gateway.middleware import MemoryMiddleware

    monkeypatch.setenv("MEMSTORE_EMBEDDING_PROVIDER", "local")
    monkeypatch.setenv("MEMSTORE_MAX_FACTS", "200")
    with caplog.at_level(logging.WARNING, logger="memstore.gateway.middleware"):
        MemoryMiddleware(config=MemoryConfig(max_facts=300))  # max_facts is the code's choice
    assert "ignores MEMSTORE_EMBEDDING_PROVIDER;" in caplog.text
    assert "MEMSTORE_MAX_FACTS" not in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="memstore.gateway.middleware"):
        MemoryMiddleware(config=load_memory_config())
        MemoryMiddleware()
    assert "ignores" not in caplog.text
