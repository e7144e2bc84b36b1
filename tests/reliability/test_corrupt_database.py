"""A SQLite file with corrupt pages: the CLI answers with one line and exit 1, never a traceback.

The schema pages are left intact, so the storage opens and migrations pass; ``facts list`` and
``facts search`` then read the damaged table pages, as an operator meets a disk fault in practice.
(``stats`` no longer does: it counts from an index since revision 0006.)
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

from memstore.document import create_empty_memory
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import dispose_engines
from tests.reliability.conftest import Record

GARBAGE = b"\xde\xad\xbe\xef"


def _memstore(*args: str, data_dir: Path) -> subprocess.CompletedProcess[str]:
    executable = shutil.which("memstore", path=str(Path(sys.executable).parent))
    assert executable is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTORE_")}
    env["MEMSTORE_DATA_DIR"] = str(data_dir)
    return subprocess.run([executable, *args], capture_output=True, text=True, env=env, check=False)


def _corrupt_fact_pages(path: Path, pages: int) -> int:
    """Overwrite some leaf pages of ``memory_facts`` with garbage; returns how many were hit."""
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        leaves = [
            row[0]
            for row in conn.execute(
                "SELECT pageno FROM dbstat WHERE name = 'memory_facts' AND pagetype = 'leaf' ORDER BY pageno"
            )
        ]
    conn.close()
    hit = leaves[len(leaves) // 2 : len(leaves) // 2 + pages]
    with path.open("r+b") as file:
        for page in hit:
            file.seek((page - 1) * page_size)
            file.write(GARBAGE * (page_size // len(GARBAGE)))
    return len(hit)


def test_corrupt_pages_are_one_line_errors(tmp_path: Path, record: Record) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    database = data_dir / "memory.db"
    storage = SqlMemoryStorage(f"sqlite:///{database}")
    for user in range(20):
        document = create_empty_memory()
        document["facts"] = [
            {"id": f"fact_{n:08x}", "content": f"user {user} fact {n} " + "x" * 200, "confidence": 0.8}
            for n in range(20)
        ]
        assert storage.save(document, user_id=f"u{user}")
    dispose_engines()
    corrupted = _corrupt_fact_pages(database, pages=3)
    assert corrupted == 3

    for args in [("facts", "list", "--limit", "400"), ("facts", "search", "fact")]:
        result = _memstore(*args, data_dir=data_dir)
        assert result.returncode == 1, (args, result.stdout, result.stderr[-3000:])
        assert result.stderr.splitlines() == ["Error: database error: database disk image is malformed"], args
    record(tried="facts list and facts search on a SQLite file with 3 corrupt pages", stderr_lines=1, lost=0)
