"""Runs every ```python example of docs/integrations.md and checks it prints the documented output.

Each example runs as its own program, exactly as a reader would paste it: a fresh directory,
``MEMSTORE_DATA_DIR`` as the only setting and no LLM endpoint, so the documented output is the
offline rule-based extractor's (the page says so under each example).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"
# A python block, optionally followed by "Output (...):" and the text block it must print.
EXAMPLE = re.compile(r"```python\n(.*?)```\s*(?:Output[^\n]*:\s*```text\n(.*?)```)?", re.DOTALL)


def examples() -> list[tuple[str, str | None]]:
    return [(code, output) for code, output in EXAMPLE.findall(DOC.read_text(encoding="utf-8"))]


def test_every_section_has_a_checked_example() -> None:
    found = examples()
    assert len(found) == 8
    assert all(output for _, output in found)


def test_the_page_says_which_extractor_produced_each_output() -> None:
    text = DOC.read_text(encoding="utf-8")
    labels = re.findall(r"^Output \(([^)]*)\):$", text, re.MULTILINE)
    assert len(labels) == 8
    assert all("rule-based" in label or "no extractor" in label for label in labels)


@pytest.mark.parametrize(
    "index",
    range(8),
    ids=[
        "plain-python",
        "sessions-and-facts",
        "langchain",
        "langchain-agent-doc",
        "langgraph-store",
        "fastapi",
        "async",
        "mcp",
    ],
)
def test_example_prints_the_documented_output(index: int, tmp_path: Path) -> None:
    code, expected = examples()[index]
    # A reader's shell: no memstore settings and no API key, only the data directory the page exports.
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTORE_") and k != "OPENAI_API_KEY"}
    env["MEMSTORE_DATA_DIR"] = "./.memstore"
    # An installed memstore is on the reader's PATH (the MCP example starts the command by name).
    env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
    script = tmp_path / "example.py"
    script.write_text(code, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert expected is not None
    assert _undated(result.stdout) == _undated(expected)


def _undated(text: str) -> str:
    """The block's lines carry the day each fact was stated: the day the example ran, not the page's."""
    return re.sub(r"(\| )\d{4}-\d{2}-\d{2}\]", r"\1<day>]", text)
