"""``memstore doctor`` (issue 20) through the console entry point, on SQLite and PostgreSQL.

A good setup, a bad database URL, a database behind head and an unreachable LLM endpoint, each
against real servers: the local OpenAI-compatible one, a port nobody listens on.
"""

from __future__ import annotations

import json
import socket

from memstore.cli.exit_codes import EXIT_DOCTOR_FAILED
from memstore.storage.sql.engine import dispose_engines
from memstore.storage.sql.schema import migrate
from tests.integration.conftest import Cli
from tests.support.openai_server import OpenAIStubServer


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _findings(cli: Cli, *args: str) -> tuple[int, dict[str, tuple[str, str]]]:
    result = cli("doctor", "--json", *args)
    assert result.stderr == "", result.stderr
    return result.returncode, {f["part"]: (f["verdict"], f["detail"]) for f in json.loads(result.stdout)}


def _with_llm(cli: Cli, base_url: str) -> None:
    cli.env.update(
        {"MEMSTORE_LLM_BASE_URL": base_url, "MEMSTORE_MODEL_NAME": "test-model", "OPENAI_API_KEY": "sk-test"}
    )


def test_a_good_setup_passes_every_check(cli: Cli, openai_server: OpenAIStubServer) -> None:
    assert cli("db", "upgrade").returncode == 0
    _with_llm(cli, openai_server.base_url)
    code, found = _findings(cli)
    assert code == 0
    assert found["settings"] == ("ok", "every MEMSTORE_* variable names a setting")
    assert found["database"][0] == "ok" and found["schema"] == ("ok", f"at head {migrate.head()}")
    assert found["queue"] == ("ok", "0 pending, 0 leased, 0 dead")
    assert found["llm"][0] == "ok" and openai_server.base_url in found["llm"][1]
    assert found["embeddings"][0] == "skip" and found["tokens"][0] == "ok"
    text = cli("doctor")
    assert text.returncode == 0 and text.stdout.splitlines()[1].startswith("ok    database")


def test_a_bad_database_url_fails_without_showing_the_password(cli: Cli) -> None:
    cli.env["MEMSTORE_DATABASE_URL"] = f"postgresql://memstore:s3cret-pw@127.0.0.1:{_closed_port()}/memstore"
    result = cli("doctor")
    assert result.returncode == EXIT_DOCTOR_FAILED
    [line] = [line for line in result.stdout.splitlines() if line.startswith("fail")]
    assert line.startswith("fail  database    cannot reach postgresql://memstore:***@127.0.0.1:")
    assert "s3cret-pw" not in result.stdout + result.stderr
    cli.env["MEMSTORE_DATABASE_URL"] = "postgres ql://nonsense"
    code, found = _findings(cli)
    assert code == EXIT_DOCTOR_FAILED and "is not a valid SQLAlchemy URL" in found["database"][1]


def test_a_database_behind_head(cli: Cli) -> None:
    assert cli("db", "upgrade").returncode == 0
    previous = migrate.history()[1].revision
    assert cli("db", "downgrade", previous).returncode == 0
    dispose_engines()
    code, found = _findings(cli)
    at = f"at {previous}, head is {migrate.head()}"
    if cli.url.startswith("sqlite"):  # the embedded database migrates itself when opened
        assert (code, found["schema"]) == (0, ("ok", f"{at}: migrated when memstore first opens it"))
    else:
        assert (code, found["schema"]) == (EXIT_DOCTOR_FAILED, ("fail", f"{at}: run `memstore db upgrade`"))


def test_an_unreachable_llm_endpoint_fails(cli: Cli) -> None:
    assert cli("db", "upgrade").returncode == 0
    _with_llm(cli, f"http://127.0.0.1:{_closed_port()}/v1")
    code, found = _findings(cli)
    assert code == EXIT_DOCTOR_FAILED
    verdict, detail = found["llm"]
    assert (
        verdict == "fail" and detail.startswith("cannot reach http://127.0.0.1:") and "test-model" in detail
    )
    assert found["database"][0] == "ok"


def test_a_misspelt_setting_is_a_warning_with_the_likely_name(cli: Cli) -> None:
    assert cli("db", "upgrade").returncode == 0
    cli.env["MEMSTORE_DATABASE_URI"] = "postgresql://db/memstore"
    result = cli("doctor")
    assert result.returncode == 0  # a warning, not a failure: the setting is ignored
    assert result.stdout.splitlines()[0] == (
        "warn  settings    MEMSTORE_DATABASE_URI is not a memstore setting and is ignored; "
        "did you mean MEMSTORE_DATABASE_URL?"
    )
    assert "did you mean MEMSTORE_DATABASE_URL?" in result.stderr  # logged when the settings load
