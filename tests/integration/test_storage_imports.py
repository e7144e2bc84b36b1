"""What a process pays in imports to open a migrated SQLite database and read from it (issue 37).

Every storage start asks whether its database is at head. It used to import Alembic to know the
head revision (0.2 s of CPU), numpy with the vector search modules and the OpenAI client with the
reranker (0.4 s) in every ``memstore show``, lifecycle run and test subprocess, none of which
migrates, reranks or embeds. The head now comes from the revision scripts' own lines
(``schema.revisions``), held equal to Alembic's answer here so the two cannot drift apart. Each
new SQLite connection loads sqlite-vec from the extension's path, without importing its Python
module (which imports numpy), held equal to the module's own answer here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory

from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import dispose_engines, sqlite_vec_path
from memstore.storage.sql.schema import migrate
from memstore.storage.sql.schema.revisions import scanned_head

# Libraries a read of a database at head must not import: the migration tool (and the template
# and highlighting libraries it brings), the LLM and rerank clients, the vectors' libraries.
UNUSED = ("alembic", "mako", "pygments", "openai", "httpx2", "tiktoken", "numpy", "sqlite_vec")

READ = """
import sys
from memstore.queries import operations_of
from memstore.storage.loader import get_memory_storage

storage = get_memory_storage()
assert ("alice", None) in operations_of(storage).list_scopes("alice")
assert storage.load(None, user_id="alice")["facts"][0]["content"] == "likes green tea"
print("\\0".join(sorted(sys.modules)))
"""


def _env(url: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("MEMSTORE_")}
    env["MEMSTORE_DATABASE_URL"] = url
    return env


def _stored(url: str) -> None:
    storage = SqlMemoryStorage(url)
    memory = storage.load(None, user_id="alice")
    memory["facts"] = [{"id": "fact_tea", "content": "likes green tea", "category": "preference"}]
    assert storage.save(memory, None, user_id="alice")
    dispose_engines()


def _unused(modules: set[str]) -> list[str]:
    """The libraries of ``UNUSED`` among ``modules`` (their top-level names)."""
    return sorted({name.split(".")[0] for name in modules} & set(UNUSED))


def test_opening_and_loading_a_migrated_database_imports_no_unused_library(sqlite_url: str) -> None:
    _stored(sqlite_url)
    result = subprocess.run(
        [sys.executable, "-c", READ], env=_env(sqlite_url), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    modules = set(result.stdout.strip().split("\0"))
    assert "memstore.storage.sql.documents.provider" in modules
    assert not _unused(modules)


def test_memstore_show_on_a_migrated_database_imports_no_unused_library(sqlite_url: str) -> None:
    _stored(sqlite_url)
    executable = shutil.which("memstore", path=str(Path(sys.executable).parent))
    assert executable is not None
    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('\\0'.join(sorted(sys.modules)), file=sys.stderr))\n"
        "from memstore.cli import main\n"
        "main(['show', '--user', 'alice'], prog_name='memstore')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=_env(sqlite_url), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "likes green tea" in result.stdout
    assert not _unused(set(result.stderr.strip().split("\0")))


def test_a_database_behind_head_is_still_migrated_on_open(tmp_path: Path) -> None:
    """The lazy import is no skipped migration: a new file reaches head on its first open."""
    url = f"sqlite:///{tmp_path / 'memory.db'}"
    code = (
        "import sys\n"
        "from memstore.storage.loader import get_memory_storage\n"
        "assert get_memory_storage().load(None, user_id='alice')['facts'] == []\n"
        "print('\\0'.join(sorted(sys.modules)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=_env(url),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "alembic" in result.stdout.split("\0")
    assert migrate.current(url) == migrate.head()
    dispose_engines()


def test_the_scanned_head_is_alembics_head() -> None:
    """The scan of the shipped scripts and Alembic's ``ScriptDirectory`` name the same head."""
    alembic_heads = ScriptDirectory.from_config(migrate.alembic_config()).get_heads()
    assert [scanned_head(migrate.script_location() / "versions")] == alembic_heads
    assert [migrate.head()] == alembic_heads


def _script(folder: Path, revision: str, down: str) -> None:
    (folder / f"{revision}_step.py").write_text(
        f'"""{revision}."""\n\nrevision: str = "{revision}"\ndown_revision: str | None = {down}\n'
    )


@pytest.mark.parametrize(
    ("chain", "head"),
    [
        ([("a1", "None"), ("b2", '"a1"'), ("c3", '"b2"')], "c3"),
        ([("a1", "None"), ("b2", '"a1"'), ("c3", '"a1"')], None),  # two heads: a branch
        ([("a1", "None"), ("b2", '"a1"'), ("m3", '("a1", "b2")')], None),  # a merge's tuple
        ([("a1", "None"), ("b2", '"zz"')], None),  # a parent that is no script
        ([("a1", "None"), ("b2", "None")], None),  # two roots
        ([], None),
    ],
)
def test_the_scan_answers_only_for_one_linear_chain(
    tmp_path: Path, chain: list[tuple[str, str]], head: str | None
) -> None:
    """Whatever the scan does not understand is Alembic's to answer (``migrate.head`` falls back)."""
    for revision, down in chain:
        _script(tmp_path, revision, down)
    (tmp_path / "__init__.py").write_text('revision = "ignored"\n')
    assert scanned_head(tmp_path) == head


def test_sqlite_vec_is_loaded_from_where_its_own_module_says() -> None:
    import sqlite_vec

    assert sqlite_vec_path() == os.path.normpath(sqlite_vec.loadable_path())
