"""scripts/eval_retrieval.py --long-conversations end to end on a slice, with the test server's vectors.

The published figures use the local model over the whole set (docs/performance.md); this checks that
every row is produced and that the numbers mean what the tables say.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.openai_server import OpenAIStubServer

ROOT = Path(__file__).resolve().parents[2]
SEARCHES = (
    "full-text, all words (before)",
    "full-text, any word (after)",
    "semantic",
    "hybrid, all words, rank fusion",
    "hybrid, any word, rank fusion",
    "hybrid, any word, convex (after)",
    "hybrid + second hop (top-3 terms)",
    "hybrid + second hop (top-3 text)",
    "BM25 over the turns (reference)",
)


def _rows(markdown: str) -> dict[str, list[str]]:
    """The first cell of each table row -> its other cells (the first table wins a repeated name)."""
    rows: dict[str, list[str]] = {}
    for line in markdown.splitlines():
        if line.startswith("| ") and not line.startswith("|---"):
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            rows.setdefault(cells[0], cells[1:])
    return rows


def test_the_long_conversation_evaluation_runs_on_a_slice(
    openai_server: OpenAIStubServer, tmp_path: Path
) -> None:
    out = tmp_path / "longconv.md"
    command = [
        sys.executable,
        "scripts/eval_retrieval.py",
        "--long-conversations",
        *("--conversations", "en-1,zh-1", "--max-questions", "3"),
        *("--base-url", openai_server.base_url, "--model", "m", "--markdown", str(out)),
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = _rows(out.read_text(encoding="utf-8"))
    assert rows["questions"][0].startswith("6 (en 3, zh 3;")
    assert rows["facts the store collapsed"] == ["none"]  # every turn is its own fact
    data = json.loads((ROOT / "tests" / "data" / "long_conversations.json").read_text(encoding="utf-8"))
    turns = sum(
        len(s["turns"]) for c in data["conversations"] if c["id"] in ("en-1", "zh-1") for s in c["sessions"]
    )
    assert rows["turns stored (one fact each)"] == [str(turns)]
    recall = {name: [float(cell) for cell in rows[name][:3]] for name in SEARCHES}
    for name, (at5, at10, at20) in recall.items():
        assert 0 <= at5 <= at10 <= at20 <= 1, name  # deeper never finds less
    # Bags of hashed words (the stub's vectors) still find evidence that shares words with a question.
    assert recall["semantic"][2] > 0 and recall["BM25 over the turns (reference)"][2] > 0
    assert recall["full-text, any word (after)"][2] >= recall["full-text, all words (before)"][2]
    for pool in ("20", "50", "100", "200"):
        assert 0 <= float(rows[pool][2]) <= 1
    block, undated = (
        rows["block after (defaults: convex, dated lines)"],
        rows["block after, lines without dates"],
    )
    assert float(rows["block before (rank fusion, full-text 1.0, undated)"][8]) > 0
    assert float(block[7]) > 0 and float(undated[7]) > 0  # some question's evidence was injected
    assert 0 < float(block[8]) <= float(undated[8])  # a dated line costs tokens, never saves them
    assert openai_server.embedding_requests  # the turns and the questions went through the endpoint
