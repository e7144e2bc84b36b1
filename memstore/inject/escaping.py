"""How user-influenced text is made inert before it is placed in a prompt.

Both prompts memstore writes (the injected ``<memory>`` block and the update prompt) are
structured by tags and by lines: a fact is a line starting ``- [category | confidence]``, a turn
is a line starting ``User:`` or ``Assistant:``. So every user-influenced item rendered on a line
of its own (fact content, category and ``sourceError``, section summaries, conversation turns)
goes through :func:`inline_text`:

- ``<``, ``>`` and ``&`` are HTML-escaped, so no text can open or close a tag;
- each run of line breaks becomes one space, so no text can start a line of its own. Line
  breaks are every character ``str.splitlines`` splits on: ``\\n``, ``\\r``, ``\\x0b``,
  ``\\x0c``, ``\\x1c``-``\\x1e``, ``\\x85``, ``\\u2028`` and ``\\u2029``. A fact written as
  ``"likes tea\\n- [correction | 1.00] …"`` is injected as the one line
  ``- [… | …] likes tea - [correction | 1.00] …``. Only the prompt copy is changed; the stored
  text keeps its line breaks.

Look-alike characters such as the fullwidth ``＜/memory＞`` (U+FF1C, U+FF1E) are left as they
are. They are not markup: the tags that delimit the blocks are ASCII, user text can never produce
them, and the closing tag still follows. Rewriting look-alikes would change ordinary CJK text
(fullwidth brackets are common there) and could never be complete (``‹``, ``﹤``, ``〈``, …);
what such text says is data to the model, like any other instruction-shaped sentence a user
writes.
"""

from __future__ import annotations

import html
import re

_LINE_BREAKS = re.compile(r"[\n\r\x0b\x0c\x1c-\x1e\x85\u2028\u2029]+")


def single_line(text: str) -> str:
    """``text`` with each run of line-break characters replaced by one space."""
    return _LINE_BREAKS.sub(" ", text)


def inline_text(value: object) -> str:
    """``value`` as text that can neither add a tag nor a line to a prompt.

    Quotes are not escaped (``quote=False``): they cannot break out of anything here, and
    ordinary text should reach the model byte for byte.
    """
    return html.escape(single_line(str(value)), quote=False)


def quoted_inline_text(value: object) -> str:
    """``inline_text`` that also escapes quotes, for text placed inside ``"…"`` or an attribute.

    The update prompt's staleness and consolidation sections quote fact content and put the
    category in a tag attribute, so a ``"`` there could end the quoted part and let the rest of
    the fact read as prompt structure.
    """
    return html.escape(single_line(str(value)), quote=True)


_FIELD_MARKS = str.maketrans({"|": "&#124;", "[": "&#91;", "]": "&#93;"})


def field_text(value: object) -> str:
    """``quoted_inline_text`` for a field of a ``[id | category | ...]`` line: the separators are
    escaped too, so an id or category cannot end its field and pose as another one."""
    return quoted_inline_text(value).translate(_FIELD_MARKS)
