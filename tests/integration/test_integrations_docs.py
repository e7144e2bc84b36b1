"""Runs every ```python example of docs/integrations.md and checks it prints the documented output.

Each example runs as its own program, as a reader would paste it, configured only through the
environment: a fresh SQLite data directory and the local OpenAI-compatible server as the LLM.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.openai_server import OpenAIStubServer
from tests.support.remember_llm import statements_reply

DOC = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"
# A python block, optionally followed by "Output:" and the text block it must print.
EXAMPLE = re.compile(r"```python\n(.*?)```\s*(?:Output:\s*```text\n(.*?)```)?", re.DOTALL)


def examples() -> list[tuple[str, str | None]]:
    return [(code, output) for code, output in EXAMPLE.findall(DOC.read_text(encoding="utf-8"))]


def test_every_section_has_a_checked_example() -> None:
    found = examples()
    assert len(found) == 3
    assert all(output for _, output in found)


@pytest.mark.parametrize("index", range(3), ids=["plain-python", "langchain", "fastapi"])
def test_example_prints_the_documented_output(
    index: int, tmp_path: Path, openai_server: OpenAIStubServer
) -> None:
    code, expected = examples()[index]
    openai_server.default_reply = statements_reply
    env = {
        **os.environ,
        "MEMSTORE_DATA_DIR": str(tmp_path / "data"),
        "MEMSTORE_LLM_BASE_URL": openai_server.base_url,
        "MEMSTORE_MODEL_NAME": "test-model",
        "OPENAI_API_KEY": "test-key",
    }
    env.pop("MEMSTORE_CONFIG", None)
    script = tmp_path / "example.py"
    script.write_text(code, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected
