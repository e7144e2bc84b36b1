"""Human-readable rendering of a memory document, shared by ``memstore show`` and the demo."""

from __future__ import annotations

import re
import unicodedata

from memstore.document import HISTORY_SECTIONS, USER_SECTIONS, MemoryDocument, coerce_confidence

# Marks that reorder or hide text on screen: bidi embeddings, overrides and isolates, the
# direction marks and the zero-width space. U+200D (the joiner emoji sequences need) stays.
_INVISIBLE = re.compile("[\u200b\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def one_line(text: str) -> str:
    """``text`` safe to print as one line of a terminal listing.

    Every run of whitespace (newlines included) becomes one space, so a stored value cannot
    fake further rows; control characters (C0 and C1, ESC among them) and invisible reordering
    marks are dropped, so it cannot move the cursor, retitle the window or disguise itself.
    """
    collapsed = _INVISIBLE.sub("", " ".join(text.split()))
    return "".join(char for char in collapsed if unicodedata.category(char) != "Cc")


def memory_lines(memory: MemoryDocument) -> list[str]:
    """Non-empty summaries, then one line per fact: id, category, confidence, content."""
    lines: list[str] = []
    for group, names in (("user", USER_SECTIONS), ("history", HISTORY_SECTIONS)):
        sections = memory.get(group)
        for name in names:
            section = sections.get(name) if isinstance(sections, dict) else None
            summary = section.get("summary", "") if isinstance(section, dict) else ""
            if summary:
                lines.append(f"  {name}: {one_line(str(summary))}")
    facts = [fact for fact in memory.get("facts", []) if isinstance(fact, dict)]
    lines.append(f"  facts ({len(facts)}):")
    for fact in facts:
        avoid = f"  (avoid: {one_line(str(fact['sourceError']))})" if fact.get("sourceError") else ""
        fact_id, category = one_line(str(fact.get("id", "?"))), one_line(str(fact.get("category", "")))
        content = one_line(str(fact.get("content", "")))
        confidence = coerce_confidence(fact.get("confidence"))
        lines.append(f"    {fact_id:<14} {category:<11} {confidence:.2f}  {content}{avoid}")
    return lines
