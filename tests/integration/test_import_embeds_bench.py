"""``scripts/embed_throughput.py`` end to end on a few texts: every variant reports a rate.
Timings are never asserted; the figures are in docs/performance.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_embedding_throughput_script_measures_every_variant(tmp_path: Path) -> None:
    out = tmp_path / "embed.json"
    command = [sys.executable, str(ROOT / "scripts" / "embed_throughput.py"), "--quick", "--only", "openai"]
    done = subprocess.run([*command, "--json", str(out)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["memstore"] == str(ROOT / "memstore")
    assert set(report["openai"]) == {"stub delay=0 ms", "stub delay=100 ms"}
    for variants in report["openai"].values():
        assert len(variants) == 7
        assert all(0 < rate["median"] <= rate["best"] for rate in variants.values())
