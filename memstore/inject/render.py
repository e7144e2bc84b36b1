"""Render a memory document as the text injected into the next conversation's prompt.

Layout: ``User Context:`` and ``History:`` summaries first, then a single ``Facts:`` block, one
line per fact (``- [category | confidence] content``, or ``- [category | confidence | date] content``
with ``dated``). Facts
are ranked by confidence, or by relevance scores when the caller has a query (``relevance.py``);
guaranteed categories (corrections by default) are placed first from
a budget of their own so a long tail of ordinary facts can never crowd them out. Lines are taken
in rank order until one does not fit; a line bigger than the whole budget is skipped rather than
ending the block (see ``_select_lines``).

Facts of other owners that the identity may read (shared with it, or public in its tenant) are
ranked with the user's own under the same budget, and their lines say so: ``- [shared] [...]`` or
``- [public] [...]``; own lines carry no marker. The marker is fixed text, never taken from the fact.

The memory block is presented to the model as user-managed data, so every user-influenced
string goes through :func:`memstore.inject.escaping.inline_text`: HTML-escaped (``<``/``>``/``&``
only) and kept on its own line (line breaks become spaces). A stored fact can neither close the
``<memory>`` tag and speak with the system's authority, nor start a line that poses as another
fact or a correction; ordinary quotes stay readable.

This runs on every request, so malformed documents are skipped item by item rather than raised
on, and token counts go through :mod:`memstore.inject.tokens`' per-text cache.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from memstore.document import DEFAULT_CATEGORY, coerce_confidence, parse_timestamp
from memstore.inject.escaping import inline_text
from memstore.inject.tokens import count_tokens

DEFAULT_GUARANTEED_CATEGORIES = ("correction",)

_SUMMARY_GROUPS: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...] = (
    (
        "user",
        "User Context:",
        (("workContext", "Work"), ("personalContext", "Personal"), ("topOfMind", "Current Focus")),
    ),
    (
        "history",
        "History:",
        (("recentMonths", "Recent"), ("earlierContext", "Earlier"), ("longTermBackground", "Background")),
    ),
)
_SECTION_SEPARATOR = "\n\n"
_FACTS_HEADER = "Facts:\n"
_TRUNCATION_MARK = "\n..."

_MAX_CHARS_PER_TOKEN = 128
"""No cl100k_base token is longer than 128 bytes, and the estimate counts a token per 4 characters,
so a line longer than 128 characters per token of budget cannot fit under either count."""

_UNRANKED_CONFIDENCE = 0.0
"""Confidence given to facts whose stored value is missing, null, boolean, non-numeric or non-finite.

Matches the reference's injection path (the updater's trim uses 0.5): a fact whose confidence
cannot be read is ranked last and spends prompt budget only after every readable fact.
"""


def _summary(group: Mapping[Any, Any], key: str) -> str | None:
    section = group.get(key)
    if not isinstance(section, Mapping):
        return None
    value = section.get("summary")
    if value is None or not str(value).strip():
        return None
    return inline_text(value)


def _summary_sections(memory: Mapping[Any, Any]) -> list[str]:
    sections = []
    for group_key, title, entries in _SUMMARY_GROUPS:
        group = memory.get(group_key)
        if not isinstance(group, Mapping):
            continue
        lines = [f"- {label}: {text}" for key, label in entries if (text := _summary(group, key)) is not None]
        if lines:
            sections.append(title + "\n" + "\n".join(lines))
    return sections


def _confidence(fact: Mapping[Any, Any]) -> float:
    raw = fact.get("confidence")
    if type(raw) is float and 0.0 <= raw <= 1.0:  # the common case, skipping the full coercion (NaN fails)
        return raw
    return coerce_confidence(raw, _UNRANKED_CONFIDENCE)


def _category(fact: Mapping[Any, Any]) -> str:
    raw = fact.get("category")
    return (str(raw).strip() if raw is not None else "") or DEFAULT_CATEGORY


def _kind(fact: Mapping[Any, Any]) -> str:
    """The marker of another owner's fact: ``public``, or ``shared`` for any other visibility."""
    return "public" if fact.get("visibility") == "public" else "shared"


def _fact_line(fact: Mapping[Any, Any], kind: str | None = None, *, dated: bool = False) -> str:
    """``- [category | 0.95] content``; ``dated``, with the day the fact was stated when it has one
    (``- [category | 0.95 | 2026-05-08] content``). A correction also names the mistake to avoid,
    and another owner's fact starts with its ``kind`` (``- [shared] [category | 0.95] content``)."""
    category = _category(fact)
    marker = f"[{kind}] " if kind else ""
    stated = parse_timestamp(fact.get("createdAt")) if dated else None
    day = f" | {stated:%Y-%m-%d}" if stated is not None else ""
    line = (
        f"- {marker}[{inline_text(category)} | {_confidence(fact):.2f}{day}] {inline_text(fact['content'])}"
    )
    source_error = fact.get("sourceError")
    if category == "correction" and isinstance(source_error, str) and source_error.strip():
        line += f" (avoid: {inline_text(source_error.strip())})"
    return line


def _select_lines(
    facts: Iterable[Mapping[Any, Any]],
    budget: int,
    use_tiktoken: bool,
    taken: list[Mapping[Any, Any]],
    kinds: Mapping[int, str],
    dated: bool,
) -> tuple[list[str], int]:
    """Take fact lines in rank order until one does not fit, skipping lines that never could.

    Stopping (rather than skipping to a shorter line) keeps the ranking strict: a low-confidence
    fact never displaces a higher one just because it is short, and a request renders only
    about as many lines as it injects. A line bigger than the whole ``budget`` is skipped
    instead: nothing before it keeps it out, and stopping there let one 1 MB fact at confidence
    1.0 empty the block while shorter facts would have fit. A line over
    ``_MAX_CHARS_PER_TOKEN`` characters per token of budget is skipped without being counted.
    The facts whose lines were taken are appended to ``taken``; ``kinds`` marks other owners'
    facts (by ``id()``).
    """
    lines: list[str] = []
    used = 0
    for fact in facts:
        line = _fact_line(fact, kinds.get(id(fact)), dated=dated)
        if len(line) > _MAX_CHARS_PER_TOKEN * (budget + 1):
            continue
        cost = count_tokens("\n" + line if lines else line, use_tiktoken=use_tiktoken)
        if used + cost <= budget:
            lines.append(line)
            taken.append(fact)
            used += cost
        elif count_tokens(line, use_tiktoken=use_tiktoken) <= budget:
            break
    return lines, used


def _categories(guaranteed_categories: Iterable[str] | None) -> frozenset[str]:
    if isinstance(guaranteed_categories, str):
        raise TypeError("guaranteed_categories must be an iterable of strings, not a bare str")
    if guaranteed_categories is None:
        return frozenset()
    return frozenset(c.strip() for c in guaranteed_categories if isinstance(c, str) and c.strip())


def _ranked_facts(
    raw_facts: object, guaranteed: frozenset[str], scores: Sequence[float] | None
) -> tuple[list[Mapping[Any, Any]], list[Mapping[Any, Any]]]:
    """Usable facts split into (guaranteed, regular), each sorted by confidence, ties in stored order.

    With ``scores`` (one per stored fact, from ``relevance.fused_scores``) they are sorted by
    score instead. Only a fact whose own category names a guaranteed one is promoted; a missing
    category is never promoted, even when ``context`` (the display default) is guaranteed.
    """
    if not isinstance(raw_facts, list):
        return [], []
    if scores is not None and len(scores) != len(raw_facts):
        raise ValueError(f"{len(scores)} relevance scores for {len(raw_facts)} facts")
    score_of = {id(fact): score for fact, score in zip(raw_facts, scores or (), strict=False)}
    promoted: list[Mapping[Any, Any]] = []
    regular: list[Mapping[Any, Any]] = []
    for fact in raw_facts:
        if not isinstance(fact, Mapping):
            continue
        content = fact.get("content")
        if not isinstance(content, str) or not content.strip():
            continue
        category = fact.get("category")
        if isinstance(category, str) and category.strip() in guaranteed:
            promoted.append(fact)
        else:
            regular.append(fact)
    key = _confidence if scores is None else (lambda fact: score_of[id(fact)])
    promoted.sort(key=key, reverse=True)
    regular.sort(key=key, reverse=True)
    return promoted, regular


def _fit_summaries(summaries: Sequence[str], facts_block: str, limit: int, use_tiktoken: bool) -> str:
    """Cut the summaries so summaries + facts fit ``limit``; the facts block is never cut."""
    preceding = _SECTION_SEPARATOR.join(summaries)
    if not preceding:
        return facts_block
    suffix = _SECTION_SEPARATOR + facts_block if facts_block else ""
    budget = max(0, limit - count_tokens(suffix, use_tiktoken=use_tiktoken))
    preceding_tokens = count_tokens(preceding, use_tiktoken=use_tiktoken)
    if preceding_tokens > budget:
        # Cut by characters at the text's own chars-per-token ratio, with 5% headroom.
        chars_per_token = len(preceding) / max(preceding_tokens, 1)
        kept = preceding[: int(budget * chars_per_token * 0.95)].rstrip()
        if not kept:
            return facts_block
        preceding = kept + _TRUNCATION_MARK
    return preceding + suffix


def format_memory_for_injection(
    memory: Mapping[str, Any] | None,
    max_tokens: int = 2000,
    *,
    guaranteed_categories: Iterable[str] | None = DEFAULT_GUARANTEED_CATEGORIES,
    guaranteed_token_budget: int = 500,
    use_tiktoken: bool = True,
) -> str:
    """The memory text to inject, within ``max_tokens`` plus whatever guaranteed facts used.

    See ``render_memory`` for the rules; this is its text alone.
    """
    return render_memory(
        memory,
        max_tokens,
        guaranteed_categories=guaranteed_categories,
        guaranteed_token_budget=guaranteed_token_budget,
        use_tiktoken=use_tiktoken,
    )[0]


def render_memory(
    memory: Mapping[str, Any] | None,
    max_tokens: int = 2000,
    *,
    guaranteed_categories: Iterable[str] | None = DEFAULT_GUARANTEED_CATEGORIES,
    guaranteed_token_budget: int = 500,
    use_tiktoken: bool = True,
    scores: Sequence[float] | None = None,
    others: Sequence[Mapping[str, Any]] = (),
    dated: bool = False,
) -> tuple[str, list[str]]:
    """The memory text to inject and the ids of the own facts it shows (for access tracking).

    The text is within ``max_tokens`` plus whatever guaranteed facts used. Facts go in order of
    confidence, or of ``scores`` (one per entry of ``memory["facts"]``, then one per entry of
    ``others``; query-aware injection). ``others`` are other owners' facts the identity may read,
    each with its ``visibility``: ranked with the own facts, marked in the text, never in the ids
    (their ids belong to other scopes). ``dated`` puts the day each fact was stated (its
    ``createdAt``, UTC) in its line, so the model can place "yesterday" or "last week" in time;
    ``format_memory_for_injection``, the reference's format, leaves it out.

    Guaranteed facts are charged only to ``guaranteed_token_budget``; regular facts get what is
    left of ``max_tokens`` after the summaries, the header and the guaranteed lines. When the
    summaries alone overflow, they are truncated and the facts block is kept whole.

    Raises ``TypeError`` for a bare ``str`` ``guaranteed_categories`` (it would otherwise be
    read as a set of single characters); a malformed document never raises.
    """
    guaranteed = _categories(guaranteed_categories)
    if not isinstance(memory, Mapping) or not memory:
        if not others:
            return "", []
        memory = {}
    summaries = _summary_sections(memory)
    own = raw if isinstance(raw := memory.get("facts"), list) else []
    kinds = {id(fact): _kind(fact) for fact in others}
    promoted, regular = _ranked_facts([*own, *others], guaranteed, scores)

    shown: list[Mapping[Any, Any]] = []
    fact_lines, guaranteed_used = _select_lines(
        promoted, guaranteed_token_budget, use_tiktoken, shown, kinds, dated
    )
    if regular:
        fixed = count_tokens(_FACTS_HEADER, use_tiktoken=use_tiktoken) + guaranteed_used
        if summaries:
            fixed += count_tokens(_SECTION_SEPARATOR.join(summaries), use_tiktoken=use_tiktoken)
        if fact_lines:
            fixed += count_tokens("\n", use_tiktoken=use_tiktoken)
        if max_tokens - fixed > 0:
            fact_lines += _select_lines(regular, max_tokens - fixed, use_tiktoken, shown, kinds, dated)[0]

    # The facts block is never cut (only summaries are), so every fact taken is in the text.
    fact_ids = [
        fact_id for fact in shown if id(fact) not in kinds and isinstance(fact_id := fact.get("id"), str)
    ]
    facts_block = _FACTS_HEADER + "\n".join(fact_lines) if fact_lines else ""
    result = _SECTION_SEPARATOR.join([*summaries, facts_block] if facts_block else summaries)
    limit = max_tokens + guaranteed_used
    if result and count_tokens(result, use_tiktoken=use_tiktoken) > limit:
        return _fit_summaries(summaries, facts_block, limit, use_tiktoken), fact_ids
    return result, fact_ids


def wrap_memory_block(text: str) -> str:
    """Enclose injected memory in its ``<memory>`` tag; blank text yields no block at all."""
    if not text.strip():
        return ""
    return f"<memory>\n{text}\n</memory>\n"
