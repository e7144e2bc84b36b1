"""``memstore demo`` through the real console entry point, in a fresh working directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path


def test_demo_builds_memory_for_both_users_on_the_default_storage(tmp_path: Path) -> None:
    executable = shutil.which("memstore", path=str(Path(sys.executable).parent))
    assert executable is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTORE_") and k != "OPENAI_API_KEY"}
    result = subprocess.run(
        [executable, "demo"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "WARNING" not in result.stderr  # the demo's data directory is its own, never the default
    out = result.stdout
    assert "Storage:   SqlMemoryStorage" in out
    assert "Extractor: rule-based" in out
    assert "=== alice ===" in out and "=== wei ===" in out
    alice, wei = out.split("=== wei ===")
    assert "User works at Acme Robotics as a backend engineer" in alice
    assert "(avoid: " in alice
    assert "用户喜欢简洁的中文回答" in wei and "Acme" not in wei
    assert alice.count("<memory>") == 1 and wei.count("<memory>") == 1
    # The sample users go to a throwaway directory that the demo names, never the configured storage
    # (here the default ./.memstore of the working directory), and the commands it suggests work there.
    assert not (tmp_path / ".memstore").exists()
    exports = dict(
        line.strip().removeprefix("export ").split("=", 1)
        for line in out.splitlines()
        if line.strip().startswith("export MEMSTORE_")
    )
    database = Path(exports["MEMSTORE_DATABASE_URL"].removeprefix("sqlite:///"))
    assert database.is_file() and "throwaway" in out
    shown = subprocess.run(
        [executable, "show", "--user", "alice"],
        cwd=tmp_path,
        env=env | exports,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "Acme Robotics" in shown.stdout
    shutil.rmtree(database.parent)


def test_demo_writes_into_the_configured_database_only_when_asked(tmp_path: Path) -> None:
    executable = shutil.which("memstore", path=str(Path(sys.executable).parent))
    assert executable is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTORE_") and k != "OPENAI_API_KEY"}
    result = subprocess.run(
        [executable, "demo", "--into-configured-database"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / ".memstore" / "memory.db").is_file()
    assert "written to the configured storage" in result.stdout
