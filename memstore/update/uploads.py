"""Upload scrubbing: uploaded files do not outlive their thread, so memory must not mention them.

The mention pattern is the reference's; ``strip_upload_mentions`` removes each summary sentence
holding one and drops each fact whose content does, and ``mentions_upload`` lets a stage refuse to
write such a fact in the first place.

A new fact's other text is held to the same pattern, and to an upload path or block marker
anywhere in it, before it is stored (``scrub_record_fields``, for both extractors): a ``raw`` that
mentions an upload is dropped whole rather than cut (the sentence rule splits at the ``.`` of a
file name, so a cut would keep pieces of the path), so is a ``structured`` object any of whose keys
or string values does, and so is each such tag. The fact itself is kept when its content is clean.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from typing import Any

from memstore.document import SECTION_GROUPS, MemoryDocument
from memstore.record import RAW_KEY, STRUCTURED_KEY, TAGS_KEY

logger = logging.getLogger(__name__)

# Upload mentions, as in the reference's sentence pattern (IGNORECASE)
#   [^.!?]*\b(?:MENTION)[^.!?]*[.!?]?\s*
# which removes each sentence holding a mention, with its end mark and the spaces after it. Its
# quirks are kept so results match: neighbouring sentences get glued, a "." inside a path ends
# the sentence. Run as one regex it retried every start position of a long sentence (quadratic:
# a 32,000-character fact took 21 s), so `_upload_sentences` finds the same spans in one pass.
_UPLOAD_MENTION = re.compile(
    r"\b(?:upload(?:ed|ing)?(?:\s+\w+){0,3}\s+(?:file|files?|document|documents?|attachment|attachments?)"
    r"|file\s+upload|/mnt/user-data/uploads/|<uploaded_files>)",
    re.IGNORECASE,
)
_UPLOAD_MARKER = re.compile(r"/mnt/user-data/uploads/|<uploaded_files>", re.IGNORECASE)
_SENTENCE_END = re.compile(r"[.!?]")
_SPACES = re.compile(r"\s*")
_MULTI_SPACE = re.compile(r"  +")


def mentions_upload(text: str) -> bool:
    return _UPLOAD_MENTION.search(text) is not None


def _any_mention(value: object) -> bool:
    """Whether a string anywhere in ``value`` (a JSON value; keys too) mentions an upload: the
    reference's pattern, or an upload path or block marker anywhere (the pattern's leading ``\b``
    misses those after a space or at the start, a quirk kept for content and summaries only)."""
    if isinstance(value, str):
        return mentions_upload(value) or _UPLOAD_MARKER.search(value) is not None
    if isinstance(value, dict):
        return any(_any_mention(key) or _any_mention(item) for key, item in value.items())
    if isinstance(value, list | tuple):
        return any(_any_mention(item) for item in value)
    return False


def scrub_record_fields(fact: dict[str, Any]) -> None:
    """Drop ``fact``'s ``raw``, ``structured`` and each tag that mention an upload (in place)."""
    for key in (RAW_KEY, STRUCTURED_KEY):
        if key in fact and _any_mention(fact[key]):
            del fact[key]
            logger.info("a new fact's %s mentioned an upload and was dropped", key)
    tags = fact.get(TAGS_KEY)
    if isinstance(tags, list) and any(_any_mention(tag) for tag in tags):
        kept = [tag for tag in tags if not _any_mention(tag)]
        logger.info("%d tag(s) of a new fact mentioned an upload and were dropped", len(tags) - len(kept))
        if kept:
            fact[TAGS_KEY] = kept
        else:
            del fact[TAGS_KEY]


def _upload_sentences(text: str) -> Iterator[tuple[int, int]]:
    """The ``(start, end)`` spans the reference's sentence pattern would remove, left to right.

    A match of that pattern starts where the search resumes, if a mention lies between there and
    the next end mark (a mention never contains one), and ends after that mark and the spaces
    following it. Without a mention, no start before the mark can match, so the scan moves past
    it. Each character is read a bounded number of times.
    """
    position = 0
    while position < len(text):
        mark = _SENTENCE_END.search(text, position)
        sentence_end = mark.start() if mark is not None else len(text)
        if _UPLOAD_MENTION.search(text, position, sentence_end) is None:
            position = sentence_end + 1
            continue
        end = _SPACES.match(text, min(sentence_end + 1, len(text)))
        assert end is not None  # \s* matches everywhere
        yield position, end.end()
        position = end.end()


def _without_upload_sentences(text: str) -> str:
    pieces: list[str] = []
    kept_from = 0
    for start, end in _upload_sentences(text):
        pieces.append(text[kept_from:start])
        kept_from = end
    pieces.append(text[kept_from:])
    return "".join(pieces)


def strip_upload_mentions(memory: MemoryDocument) -> MemoryDocument:
    """Remove upload sentences from every summary and drop facts that mention uploads (in place).

    Uploaded files do not outlive their thread, so remembering them sends later sessions
    looking for files that are gone. Non-string summaries and contents are left alone.
    """
    for group in SECTION_GROUPS:
        sections = memory.get(group)
        if not isinstance(sections, dict):
            continue
        for section in sections.values():
            if isinstance(section, dict) and isinstance(section.get("summary"), str):
                scrubbed = _without_upload_sentences(section["summary"]).strip()
                section["summary"] = _MULTI_SPACE.sub(" ", scrubbed)
    facts = memory.get("facts")
    if isinstance(facts, list) and facts:
        memory["facts"] = [
            fact
            for fact in facts
            if not (
                isinstance(fact, dict)
                and isinstance(fact.get("content"), str)
                and _UPLOAD_MENTION.search(fact["content"])
            )
        ]
    return memory
