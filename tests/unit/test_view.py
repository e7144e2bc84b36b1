"""``one_line``: stored text printed in a listing stays one inert line."""

from __future__ import annotations

from memstore.ops.view import memory_lines, one_line


def test_one_line_collapses_whitespace_and_drops_what_drives_a_terminal() -> None:
    assert one_line("a\nb\r\n\tc  d") == "a b c d"
    assert one_line("\x1b]0;PWNED\x07 \x9b31mred \x00x") == "]0;PWNED 31mred x"
    assert one_line("file\u202eexe.txt \u2066iso\u2069 zero\u200bwidth") == "fileexe.txt iso zerowidth"
    family = "\U0001f468\u200d\U0001f469\u200d\U0001f467"  # a ZWJ sequence is one emoji: kept
    assert one_line(f"{family} \u05e9\u05dc\u05d5\u05dd") == f"{family} \u05e9\u05dc\u05d5\u05dd"


def test_memory_lines_keep_one_line_per_fact() -> None:
    memory = {
        "user": {"workContext": {"summary": "line one\nfacts (9):\n    fake_fact"}},
        "facts": [{"id": "f1", "category": "context", "confidence": 0.9, "content": "real\n    forged row"}],
    }
    lines = memory_lines(memory)
    assert lines == [
        "  workContext: line one facts (9): fake_fact",
        "  facts (1):",
        "    f1             context     0.90  real forged row",
    ]
