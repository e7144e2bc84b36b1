"""Properties of every tagged block a model sees (lessons B1-B4), over arbitrary text.

The unit tests pin specific payloads; these check that no text at all, in any user-influenced
field, can add a tag to the update prompt or the injected memory, that the prompt's memory
block decodes back to exactly the stored text, and that text without ``<``, ``>`` or ``&``
passes through byte for byte (quotes and apostrophes included).
"""

from __future__ import annotations

import html
import json
import re
import string
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from memstore.document import create_empty_memory
from memstore.inject.render import format_memory_for_injection, wrap_memory_block
from memstore.update.prompt import MAX_MESSAGE_CHARS, build_update_prompt

SETTINGS = settings(max_examples=150, deadline=None, derandomize=True)
TAGS = ("<current_memory>", "</current_memory>", "<conversation>", "</conversation>")
hostile = st.text(alphabet=st.sampled_from("<>&\"'/= abc\n\u00e9\u4e2d") | st.characters(), max_size=60)
benign = st.text(
    alphabet=string.ascii_letters + string.digits + " .,;:!?'\"-_()\u00e9\u4e2d", min_size=1, max_size=60
)


def memory_with(text: str) -> dict[str, Any]:
    memory = create_empty_memory()
    memory["user"]["workContext"] = {"summary": f"w {text}", "updatedAt": ""}
    memory["history"]["longTermBackground"] = {"summary": f"h {text}", "updatedAt": ""}
    memory["facts"] = [
        {"id": "fact_00000001", "content": f"c {text}", "category": f"k {text}", "confidence": 0.9},
        {"id": "fact_00000002", "content": f"x {text}", "category": "correction", "confidence": 0.95,
         "sourceError": f"e {text}", f"extra {text}": [text]},
    ]  # fmt: skip
    return memory


def unescape_leaves(value: Any) -> Any:
    if isinstance(value, str):
        return html.unescape(value)
    if isinstance(value, dict):
        return {unescape_leaves(k): unescape_leaves(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unescape_leaves(item) for item in value]
    return value


def update_prompt(text: str, memory: dict[str, Any] | None = None) -> str:
    turns = [{"role": "user", "content": f"u {text}"}, {"role": "assistant", "content": f"a {text}"}]
    prompt = build_update_prompt(memory or memory_with(text), turns, correction_detected=True)
    assert prompt is not None
    return prompt[-1]["content"]


@SETTINGS
@given(hostile)
def test_no_text_adds_a_tag_to_the_update_prompt(text: str) -> None:
    prompt = update_prompt(text)
    assert [prompt.count(tag) for tag in TAGS] == [1, 1, 1, 1]
    remainder = prompt
    for tag in TAGS:
        remainder = remainder.replace(tag, "")
    assert "<" not in remainder and ">" not in remainder


@SETTINGS
@given(hostile)
def test_the_prompt_memory_block_decodes_to_the_stored_document(text: str) -> None:
    memory = memory_with(text)
    match = re.search(r"<current_memory>\n(.*)\n</current_memory>", update_prompt(text, memory), re.DOTALL)
    assert match is not None
    assert unescape_leaves(json.loads(match.group(1))) == memory


@SETTINGS
@given(hostile)
def test_no_text_adds_a_tag_to_the_injected_memory(text: str) -> None:
    block = wrap_memory_block(format_memory_for_injection(memory_with(text), 8000, use_tiktoken=False))
    assert block.startswith("<memory>\n") and block.endswith("\n</memory>\n")
    inner = block.removeprefix("<memory>\n").removesuffix("\n</memory>\n")
    assert "<" not in inner and ">" not in inner
    for field in (f"w {text}", f"c {text}", f"k {text}", f"e {text}"):
        assert html.escape(field.strip(), quote=False) in inner


@SETTINGS
@given(benign)
def test_benign_text_is_byte_identical_everywhere(text: str) -> None:
    prompt = update_prompt(text)
    assert f"User: {('u ' + text).strip()}" in prompt and f"Assistant: {('a ' + text).strip()}" in prompt
    injected = format_memory_for_injection(memory_with(text), 8000, use_tiktoken=False)
    for field in (f"w {text}", f"h {text}", f"c {text}", f"e {text}"):
        assert field.strip() in injected


def test_an_entity_is_never_split_at_the_truncation_point() -> None:
    for offset in range(1, 6):
        text = "x" * (MAX_MESSAGE_CHARS - offset) + "&<>" * 4
        prompt = update_prompt(text)
        line = next(line for line in prompt.splitlines() if line.startswith("User: "))
        assert line.endswith("...")
        assert re.search(r"&(?!(amp|lt|gt);)", line) is None, "a cut left a bare or broken entity"
