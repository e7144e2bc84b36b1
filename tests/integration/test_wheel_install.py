"""`memstore db` from the built wheel, installed into a fresh virtual environment outside the checkout.

This is what a DBA gets from `pip install memstore[postgres]`: no alembic.ini, no alembic/ directory
beside the code, only the revision scripts shipped inside the package.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from memstore.storage.sql.schema import migrate

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bin/ directory of a new venv with the freshly built wheel installed (once per session)."""
    root = tmp_path_factory.mktemp("wheel")
    # hatchling is already in this venv, so skip build isolation: the build needs no network.
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            root,
            REPO,
        ],
        check=True,
        cwd=root,
    )
    [wheel] = root.glob("memstore-*.whl")
    venv.create(root / "venv", with_pip=True)
    bin_dir = root / "venv" / "bin"
    subprocess.run(
        [bin_dir / "python", "-m", "pip", "install", "--quiet", f"{wheel}[postgres]"], check=True, cwd=root
    )
    return bin_dir


def run(bin_dir: Path, cwd: Path, *args: str, url: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run a venv executable with nothing of the checkout or the test venv in its environment."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MEMSTORE_", "PYTHON", "VIRTUAL_ENV")) and k != "PATH"
    }
    env["PATH"] = f"{bin_dir}{os.pathsep}/usr/bin:/bin"
    if url is not None:
        env["MEMSTORE_DATABASE_URL"] = url
    result = subprocess.run(
        [str(bin_dir / args[0]), *args[1:]], cwd=cwd, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, f"{args}: {result.stdout}{result.stderr}"
    return result


def test_scripts_come_from_the_installed_package(installed: Path, tmp_path: Path) -> None:
    code = "from memstore.storage.sql.schema.migrate import script_location; print(script_location())"
    location = Path(run(installed, tmp_path, "python", "-c", code).stdout.strip())
    assert location.is_relative_to(installed.parent) and location.name == "_alembic"
    assert not location.is_relative_to(REPO)


def test_the_installed_package_knows_its_head_without_alembic(installed: Path, tmp_path: Path) -> None:
    """The head scanned from ``memstore/_alembic/versions`` is Alembic's, and a database at head
    opens and loads without importing Alembic (tests/integration/test_storage_imports.py)."""
    url = f"sqlite:///{tmp_path / 'memory.db'}"
    run(installed, tmp_path, "memstore", "db", "upgrade", url=url)
    code = (
        "import sys\n"
        "from memstore.storage.loader import get_memory_storage\n"
        "from memstore.storage.sql.schema import migrate, revisions\n"
        "get_memory_storage().load(None, user_id='alice')\n"
        "assert 'alembic' not in sys.modules, 'opening a database at head imported alembic'\n"
        "from alembic.script import ScriptDirectory\n"
        "alembic_heads = ScriptDirectory.from_config(migrate.alembic_config()).get_heads()\n"
        "print(revisions.scanned_head(migrate.script_location() / 'versions'), *alembic_heads)\n"
    )
    assert run(installed, tmp_path, "python", "-c", code, url=url).stdout.split() == [migrate.head()] * 2


def test_the_console_ships_its_page_scripts_and_stylesheet(installed: Path, tmp_path: Path) -> None:
    """``memstore serve --console`` serves these from the package: no CDN, no build step."""
    code = "import memstore, pathlib; print(pathlib.Path(memstore.__file__).parent / 'console' / 'static')"
    static = Path(run(installed, tmp_path, "python", "-c", code).stdout.strip())
    assert static.is_relative_to(installed.parent)
    shipped = {path.name for path in static.iterdir()}
    assert {
        "index.html",
        "app.js",
        "lib.js",
        "memory.js",
        "operations.js",
        "more.js",
        "chart.js",
        "app.css",
    } <= shipped


def test_upgrade_an_empty_sqlite_file(installed: Path, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh' / 'memory.db'}"
    run(installed, tmp_path, "memstore", "db", "upgrade", "--url", url)
    current = run(installed, tmp_path, "memstore", "db", "current", "--url", url)
    assert current.stdout == f"{url}: {migrate.head()} (head)\n"


@pytest.mark.postgres
def test_upgrade_an_empty_postgresql_database(installed: Path, tmp_path: Path, pg_url: str) -> None:
    """The URL comes from MEMSTORE_DATABASE_URL here, the way a deployment configures it."""
    run(installed, tmp_path, "memstore", "db", "upgrade", url=pg_url)
    current = run(installed, tmp_path, "memstore", "db", "current", url=pg_url)
    assert current.stdout.endswith(f": {migrate.head()} (head)\n")
    downgraded = run(installed, tmp_path, "memstore", "db", "downgrade", "base", url=pg_url)
    assert downgraded.stdout.endswith(f"{migrate.head()} -> <base>\n")


def test_history_and_offline_sql(installed: Path, tmp_path: Path) -> None:
    history = run(installed, tmp_path, "memstore", "db", "history")
    assert f"-> {migrate.head()} (head)" in history.stdout
    for dialect in migrate.DIALECTS:
        rendered = run(installed, tmp_path, "memstore", "db", "sql", "--dialect", dialect)
        assert rendered.stdout == migrate.render_sql(dialect)


def test_version_config_show_and_doctor_run_from_the_installed_wheel(installed: Path, tmp_path: Path) -> None:
    version = run(installed, tmp_path, "memstore", "--version").stdout
    assert version == f"memstore {importlib.metadata.version('memstore')}\n"
    shown = json.loads(run(installed, tmp_path, "memstore", "config", "show", "--json").stdout)
    assert shown["max_facts"] == {"value": 100, "source": "default"}
    database = tmp_path / "memory.db"
    run(installed, tmp_path, "memstore", "db", "upgrade", url=f"sqlite:///{database}")
    doctor = run(installed, tmp_path, "memstore", "doctor", "--json", url=f"sqlite:///{database}")
    verdicts = {finding["part"]: finding["verdict"] for finding in json.loads(doctor.stdout)}
    assert verdicts == {
        "settings": "ok",
        "database": "ok",
        "schema": "ok",
        "queue": "ok",
        "llm": "skip",
        "embeddings": "skip",
        "tokens": "ok",
    }


def test_alembic_runs_from_the_wheel_with_the_documented_ini(installed: Path, tmp_path: Path) -> None:
    """The wheel ships no alembic.ini; the two lines docs/operations.md gives are enough, and the
    shipped env.py no longer needs logging sections (it raised KeyError: 'formatters')."""
    docs = (REPO / "docs" / "operations.md").read_text(encoding="utf-8")
    [ini] = re.findall(r"```ini\n(.*?)```", docs, re.DOTALL)
    (tmp_path / "memstore-alembic.ini").write_text(ini, encoding="utf-8")
    url = f"sqlite:///{tmp_path / 'memory.db'}"
    alembic = ("alembic", "-c", "memstore-alembic.ini")
    upgraded = run(installed, tmp_path, *alembic, "upgrade", "head", url=url)
    assert "Running upgrade 0001 -> 0002" in upgraded.stderr  # progress, without logging sections
    assert run(installed, tmp_path, *alembic, "current", url=url).stdout.startswith(
        f"{migrate.head()} (head)"
    )
    assert "No new upgrade operations detected" in run(installed, tmp_path, *alembic, "check", url=url).stdout
    offline = run(installed, tmp_path, *alembic, "-x", "url=postgresql://", "upgrade", "head", "--sql")
    assert "CREATE TABLE memory_scopes" in offline.stdout


def test_db_heads_stamp_and_check_from_the_installed_wheel(installed: Path, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'memory.db'}"
    head, previous = migrate.head(), migrate.history()[1].revision
    assert run(installed, tmp_path, "memstore", "db", "heads").stdout.startswith(f"{head} (head): ")
    run(installed, tmp_path, "memstore", "db", "upgrade", url=url)
    checked = run(installed, tmp_path, "memstore", "db", "check", url=url)
    assert checked.stdout == f"{url}: at head {head}; the schema matches memstore's models\n"
    stamped = run(installed, tmp_path, "memstore", "db", "stamp", previous, url=url)
    assert stamped.stdout == f"{url}: {head} -> {previous} (stamped: no migration ran)\n"
