"""The quickstart's two commands install what each needs: the demo only the base package (issue 14.15)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _planned_installs(target: str, tmp_path: Path) -> list[str]:
    """The pip install lines ``make -n target`` would run on a machine with no virtualenv yet."""
    make = shutil.which("make")
    if make is None:
        pytest.fail("make is required: the README's quickstart is make demo / make test")
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    result = subprocess.run(
        [make, "-n", target, f"VENV={tmp_path / 'venv'}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    lines = result.stdout.splitlines()
    return [line for line in lines if "pip install" in line and "--upgrade pip" not in line]


def test_make_demo_installs_only_the_base_package(tmp_path: Path) -> None:
    installs = _planned_installs("demo", tmp_path)
    assert installs, "make demo must install memstore"
    assert all(line.rstrip().endswith("-e .") for line in installs), installs


def test_make_test_installs_the_dev_extras(tmp_path: Path) -> None:
    installs = _planned_installs("test", tmp_path)
    assert any("dev" in line and "postgres" in line for line in installs), installs
