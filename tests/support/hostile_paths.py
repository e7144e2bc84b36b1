"""Hypothesis strategies for virtual paths an attacker would try, shared by every tool's test.

``hostile_paths`` yields strings that must all be refused: traversal (``..``, ``.``), escapes
(absolute paths elsewhere, backslashes, URL-encoded or doubled slashes), control, format and
line-break characters, NUL, paths too long or too deep, and random text. ``valid_paths`` yields
paths that must be accepted, so a test can show the checker is not refusing everything.
"""

from __future__ import annotations

from hypothesis import strategies as st

from memstore.agent_doc import MAX_PATH_CHARS, MAX_PATH_DEPTH

_NAME = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,20}", fullmatch=True).filter(
    lambda name: set(name) != {"."}
)
_BAD_NAME = st.sampled_from(
    [
        "..",
        ".",
        "",
        "...",
        ".hidden",
        "-rf",
        "a\\b",
        "a\x00b",
        "a\nb",
        "a\rb",
        "a\u2028b",
        "a\u202eb",
        "a\tb",
        "%2e%2e",
        "a b",
        "é",
        "ａ",
        "a/../b",
        "..\\..",
        "a\x7fb",
        "a\ufeffb",
    ]
)
_FOREIGN_ROOT = st.sampled_from(
    [
        "/",
        "/etc/passwd",
        "memories/agent.md",
        "./memories/a.md",
        "/memories",
        "//memories/a.md",
        "/Memories/a.md",
        "/memories/../etc/passwd",
        "/memories/./a.md",
        "/memories//a.md",
        "/memories/a.md/",
        "\\memories\\a.md",
        "/memories\\a.md",
        "file:///memories/a.md",
        "~/memories/a.md",
        " /memories/a.md",
        "/memories/a.md\n/memories/b.md",
        "/memories/%2e%2e/x",
    ]
)


@st.composite
def _with_bad_segment(draw: st.DrawFn) -> str:
    names = draw(st.lists(_NAME, min_size=0, max_size=3))
    position = draw(st.integers(0, len(names)))
    names.insert(position, draw(_BAD_NAME))
    return "/memories/" + "/".join(names)


_TOO_DEEP = st.integers(MAX_PATH_DEPTH + 1, MAX_PATH_DEPTH + 5).map(
    lambda depth: "/memories/" + "/".join(["d"] * depth)
)
_TOO_LONG = st.integers(MAX_PATH_CHARS + 1, MAX_PATH_CHARS * 4).map(
    lambda size: "/memories/" + "a" * (size - 10)
)
_RANDOM = st.text(max_size=80).filter(lambda text: not text.startswith("/memories/"))

hostile_paths = st.one_of(_FOREIGN_ROOT, _with_bad_segment(), _TOO_DEEP, _TOO_LONG, _RANDOM)
valid_paths = st.lists(_NAME, min_size=1, max_size=MAX_PATH_DEPTH).map(
    lambda names: "/memories/" + "/".join(names)
)
