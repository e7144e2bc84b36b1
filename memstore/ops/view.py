"""Human-readable rendering of a memory document, shared by ``memstore show`` and the demo."""

from __future__ import annotations

from memstore.document import HISTORY_SECTIONS, USER_SECTIONS, MemoryDocument, coerce_confidence


def memory_lines(memory: MemoryDocument) -> list[str]:
    """Non-empty summaries, then one line per fact: id, category, confidence, content."""
    lines: list[str] = []
    for group, names in (("user", USER_SECTIONS), ("history", HISTORY_SECTIONS)):
        sections = memory.get(group)
        for name in names:
            section = sections.get(name) if isinstance(sections, dict) else None
            summary = section.get("summary", "") if isinstance(section, dict) else ""
            if summary:
                lines.append(f"  {name}: {summary}")
    facts = [fact for fact in memory.get("facts", []) if isinstance(fact, dict)]
    lines.append(f"  facts ({len(facts)}):")
    for fact in facts:
        avoid = f"  (avoid: {fact['sourceError']})" if fact.get("sourceError") else ""
        lines.append(
            f"    {fact.get('id', '?'):<14} {fact.get('category', ''):<11} "
            f"{coerce_confidence(fact.get('confidence')):.2f}  {fact.get('content', '')}{avoid}"
        )
    return lines
