"""Which conversation turns feed memory, and the correction/reinforcement signals."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memstore.capture.filtering import (
    MAX_SCANNED_CONVERSATION_CHARS,
    MAX_SCANNED_MESSAGE_CHARS,
    filter_messages_for_memory,
    memory_turns,
    strip_upload_blocks,
)
from memstore.capture.signals import detect_correction, detect_reinforcement
from memstore.queue.bounds import MAX_QUEUED_CONVERSATION_CHARS, MAX_QUEUED_MESSAGE_CHARS

UPLOAD_BLOCK = "<uploaded_files>\n- report.pdf (/mnt/user-data/uploads/report.pdf)\n</uploaded_files>\n"


@dataclass
class Msg:
    """The attributes a LangChain message exposes, without needing langchain installed."""

    type: str
    content: Any
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    additional_kwargs: dict[str, Any] = field(default_factory=dict)


def human(content: Any, **kwargs: Any) -> Msg:
    return Msg("human", content, additional_kwargs=kwargs)


def ai(content: Any, *, tool_calls: list[dict[str, Any]] | None = None) -> Msg:
    return Msg("ai", content, tool_calls=tool_calls or [])


TOOL_CALL = {"id": "call_1", "name": "search", "args": {"q": "x"}}


def valid_input_response(**overrides: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "version": 1,
        "kind": "human_input_response",
        "source": "clarification",
        "request_id": "req-1",
        "response_kind": "text",
        "value": "Use PostgreSQL",
    }
    payload.update(overrides)
    return payload


class TestFilterMessagesForMemory:
    def test_plain_conversation_passes_through_as_the_same_objects(self) -> None:
        messages = [human("Hi"), ai("Hello!"), human("How are you?"), ai("Fine.")]
        kept = filter_messages_for_memory(messages)
        assert len(kept) == 4
        assert all(a is b for a, b in zip(kept, messages, strict=True))

    def test_tool_traffic_and_system_messages_are_excluded(self) -> None:
        final = ai("The answer is 4.")
        question = human("What is 2+2?")
        messages = [
            Msg("system", "You are helpful."),
            question,
            ai("", tool_calls=[TOOL_CALL]),
            Msg("tool", "4"),
            final,
        ]
        assert filter_messages_for_memory(messages) == [question, final]

    def test_upload_only_turn_is_excluded_with_its_answer(self) -> None:
        assert filter_messages_for_memory([human(UPLOAD_BLOCK), ai("I see a PDF.")]) == []

    def test_tool_calls_do_not_consume_the_pending_answer_skip(self) -> None:
        messages = [
            human(UPLOAD_BLOCK),
            ai("", tool_calls=[TOOL_CALL]),
            Msg("tool", "pdf text"),
            ai("Summary"),
        ]
        assert filter_messages_for_memory(messages) == []

    def test_upload_with_a_question_keeps_only_the_question(self) -> None:
        original = human(UPLOAD_BLOCK + "\nWhat does the report conclude?")
        answer = ai("It concludes X.")
        kept = filter_messages_for_memory([original, answer])
        assert [m.content for m in kept] == ["What does the report conclude?", "It concludes X."]
        assert kept[0] is not original
        assert kept[0].type == "human"
        assert "uploaded_files" in original.content
        assert kept[1] is answer

    def test_file_path_never_reaches_filtered_content(self) -> None:
        kept = filter_messages_for_memory([human(UPLOAD_BLOCK + "Summarise it"), ai("ok")])
        assert all("/mnt/user-data/uploads" not in str(m.content) for m in kept)

    def test_multi_turn_with_upload_in_the_middle(self) -> None:
        messages = [
            human("Hello"),
            ai("Hi"),
            human(UPLOAD_BLOCK),
            ai("Got the file"),
            human("Thanks, now help with SQL"),
            ai("Sure"),
        ]
        kept = filter_messages_for_memory(messages)
        assert [m.content for m in kept] == ["Hello", "Hi", "Thanks, now help with SQL", "Sure"]

    def test_a_new_human_turn_cancels_the_pending_skip(self) -> None:
        kept = filter_messages_for_memory([human(UPLOAD_BLOCK), human("Real question"), ai("Answer")])
        assert [m.content for m in kept] == ["Real question", "Answer"]

    def test_multimodal_list_content_upload_only_turn(self) -> None:
        content = [{"type": "text", "text": UPLOAD_BLOCK}, {"type": "image_url", "image_url": {"url": "x"}}]
        assert filter_messages_for_memory([human(content), ai("Nice picture")]) == []

    def test_multimodal_list_content_is_flattened_when_stripped(self) -> None:
        content = [{"type": "text", "text": UPLOAD_BLOCK}, {"type": "text", "text": "Explain this"}]
        kept = filter_messages_for_memory([human(content), ai("ok")])
        assert kept[0].content == "Explain this"

    def test_upload_tag_is_matched_case_insensitively(self) -> None:
        kept = filter_messages_for_memory([human("<UPLOADED_FILES>a.txt</Uploaded_Files>Hi"), ai("ok")])
        assert kept[0].content == "Hi"

    def test_hidden_human_message_is_excluded(self) -> None:
        answer = ai("ok")
        assert filter_messages_for_memory([human("todo reminder", hide_from_ui=True), answer]) == [answer]

    def test_injected_memory_payload_is_excluded(self) -> None:
        injected = human("<memory>\nFacts:\n- [knowledge | 0.90] x\n</memory>", hide_from_ui=True)
        question, answer = human("Hi"), ai("Hello")
        assert filter_messages_for_memory([injected, question, answer]) == [question, answer]

    def test_hidden_valid_human_input_response_is_kept(self) -> None:
        msg = human("Use PostgreSQL", hide_from_ui=True, human_input_response=valid_input_response())
        assert filter_messages_for_memory([msg]) == [msg]

    def test_hidden_option_response_with_option_id_is_kept(self) -> None:
        payload = valid_input_response(response_kind="option", option_id="opt-2")
        msg = human("Option 2", hide_from_ui=True, human_input_response=payload)
        assert filter_messages_for_memory([msg]) == [msg]

    @pytest.mark.parametrize(
        "payload",
        [
            valid_input_response(response_kind="option"),
            valid_input_response(response_kind="option", option_id="  "),
            valid_input_response(version=2),
            valid_input_response(version=True),
            valid_input_response(version="1"),
            valid_input_response(kind="something_else"),
            valid_input_response(value=""),
            valid_input_response(source=None),
            valid_input_response(request_id=" "),
            valid_input_response(response_kind="image"),
            "not a mapping",
            None,
        ],
    )
    def test_hidden_malformed_human_input_response_is_excluded(self, payload: object) -> None:
        msg = human("answer", hide_from_ui=True, human_input_response=payload)
        assert filter_messages_for_memory([msg]) == []

    def test_hide_from_ui_false_is_kept(self) -> None:
        msg = human("visible", hide_from_ui=False)
        assert filter_messages_for_memory([msg]) == [msg]

    def test_accepts_any_iterable(self) -> None:
        assert len(filter_messages_for_memory(m for m in [human("a"), ai("b")])) == 2


class TestFilterOpenAIDicts:
    def test_roles_are_filtered_like_langchain_types(self) -> None:
        question = {"role": "user", "content": "What is 2+2?"}
        final = {"role": "assistant", "content": "4"}
        messages = [
            {"role": "system", "content": "Be brief"},
            {"role": "developer", "content": "internal"},
            question,
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function"}]},
            {"role": "tool", "tool_call_id": "c", "content": "4"},
            final,
        ]
        kept = filter_messages_for_memory(messages)
        assert len(kept) == 2
        assert kept[0] is question
        assert kept[1] is final

    def test_upload_stripping_returns_a_dict_copy(self) -> None:
        original = {"role": "user", "content": UPLOAD_BLOCK + "Summarise", "name": "alice"}
        kept = filter_messages_for_memory([original, {"role": "assistant", "content": "ok"}])
        assert kept[0] == {"role": "user", "content": "Summarise", "name": "alice"}
        assert original["content"].startswith("<uploaded_files>")

    def test_upload_only_user_turn_skips_assistant_reply(self) -> None:
        messages = [
            {"role": "user", "content": [{"type": "text", "text": UPLOAD_BLOCK}]},
            {"role": "assistant", "content": "Got it"},
            {"role": "user", "content": "Next"},
            {"role": "assistant", "content": "Done"},
        ]
        assert [m["content"] for m in filter_messages_for_memory(messages)] == ["Next", "Done"]

    def test_empty_tool_calls_list_counts_as_final_answer(self) -> None:
        final = {"role": "assistant", "content": "Answer", "tool_calls": []}
        assert filter_messages_for_memory([final]) == [final]


class TestDetectCorrection:
    @pytest.mark.parametrize(
        "text",
        ["That's wrong", "that is incorrect.", "You misunderstood me", "Please try again", "please redo it"],
    )
    def test_detects_english_correction_signal(self, text: str) -> None:
        assert detect_correction([human("Do X"), ai("Did Y"), human(text)]) is True

    @pytest.mark.parametrize(
        "text",
        ["不对，应该用 pnpm", "你理解错了", "你理解有误", "请重试", "重新来", "换一种方法", "改用 make"],
    )
    def test_detects_chinese_correction_signal(self, text: str) -> None:
        assert detect_correction([human(text)]) is True

    @pytest.mark.parametrize("text", ["Thanks!", "redone", "that’s wrong", "Try againing", "   ", ""])
    def test_returns_false_without_signal(self, text: str) -> None:
        assert detect_correction([human(text), ai("ok")]) is False

    def test_word_boundary_treats_hyphen_as_a_break(self) -> None:
        assert detect_correction([human("check the redo-log")]) is True

    def test_only_checks_the_last_six_messages(self) -> None:
        older = [human("That's wrong"), ai("Sorry")]
        recent = [human("ok"), ai("ok"), human("fine"), ai("ok"), human("next"), ai("ok")]
        assert detect_correction(older + recent) is False
        assert detect_correction(older[1:] + recent[:4] + older[:1]) is True

    def test_ignores_assistant_messages(self) -> None:
        assert detect_correction([human("Hi"), ai("That's wrong, try again")]) is False

    def test_handles_list_content(self) -> None:
        assert detect_correction([human([{"type": "text", "text": "That is wrong"}])]) is True

    def test_handles_openai_dicts(self) -> None:
        messages = [{"role": "user", "content": "you misunderstood"}, {"role": "assistant", "content": "ok"}]
        assert detect_correction(messages) is True
        assert detect_correction([{"role": "assistant", "content": "try again"}]) is False


class TestDetectReinforcement:
    @pytest.mark.parametrize(
        "text",
        [
            "Yes, exactly",
            "yes that's right",
            "Perfect.",
            "perfect",
            "yes perfect",
            "Exactly right!",
            "That's exactly what I wanted",
            "that is what i needed",
            "Keep doing that",
            "just this",
            "Just like that",
            "This is great!",
            "this is helpful",
            "This is what I wanted.",
        ],
    )
    def test_detects_english_reinforcement_signal(self, text: str) -> None:
        assert detect_reinforcement([human("Do X"), ai("Done"), human(text)]) is True

    @pytest.mark.parametrize(
        "text", ["对，就是这样", "完全正确！", "就是这个意思", "正是我想要的。", "继续保持"]
    )
    def test_detects_chinese_reinforcement_signal(self, text: str) -> None:
        assert detect_reinforcement([human(text)]) is True

    @pytest.mark.parametrize(
        "text", ["perfectly fine", "this is great work", "Thanks, that makes sense.", "完全正确的做法是什么"]
    )
    def test_returns_false_without_signal(self, text: str) -> None:
        assert detect_reinforcement([human(text)]) is False

    def test_only_checks_the_last_six_messages(self) -> None:
        padding = [ai("a"), human("b"), ai("c"), human("d"), ai("e"), human("f")]
        assert detect_reinforcement([human("Perfect!"), *padding]) is False
        assert detect_reinforcement([*padding[1:], human("Perfect!")]) is True

    def test_correction_text_is_not_reinforcement(self) -> None:
        messages = [human("That's wrong, try again.")]
        assert detect_correction(messages) is True
        assert detect_reinforcement(messages) is False

    def test_handles_openai_dicts(self) -> None:
        assert detect_reinforcement([{"role": "user", "content": "Exactly right"}]) is True


# The reference's pattern; strip_upload_blocks must give the same result in linear time.
REFERENCE_UPLOAD_BLOCK = re.compile(r"<uploaded_files>[\s\S]*?</uploaded_files>\n*", re.IGNORECASE)
upload_texts = st.lists(
    st.sampled_from(
        ["<uploaded_files>", "</uploaded_files>", "<UPLOADED_FILES>", "</Uploaded_Files>", "\n", "a b"]
    )
    | st.text(max_size=4),
    max_size=12,
).map("".join)


class TestUploadBlocks:
    @settings(max_examples=500, deadline=None, derandomize=True)
    @given(upload_texts)
    def test_same_result_as_the_reference_pattern(self, text: str) -> None:
        assert strip_upload_blocks(text) == REFERENCE_UPLOAD_BLOCK.sub("", text)

    def test_an_unclosed_tag_before_a_block_does_not_hide_it(self) -> None:
        text = "<uploaded_files>a <uploaded_files>b</uploaded_files>\n\nQuestion"
        assert strip_upload_blocks(text) == "Question"

    def test_an_open_tag_without_a_close_is_kept(self) -> None:
        text = "Q <uploaded_files>x </uploaded_files> and <uploaded_files> unclosed"
        assert strip_upload_blocks(text) == "Q  and <uploaded_files> unclosed"


class TestScanWindow:
    def test_the_window_is_wider_than_what_the_queue_keeps(self) -> None:
        assert MAX_SCANNED_MESSAGE_CHARS >= 4 * MAX_QUEUED_MESSAGE_CHARS
        assert MAX_SCANNED_CONVERSATION_CHARS >= 4 * MAX_QUEUED_CONVERSATION_CHARS

    def test_a_huge_message_is_read_only_up_to_the_window(self) -> None:
        kept = filter_messages_for_memory([human("Q " + "x" * (2 * MAX_SCANNED_MESSAGE_CHARS)), ai("ok")])
        assert len(kept[0].content) == MAX_SCANNED_MESSAGE_CHARS and kept[0].content.startswith("Q x")

    def test_only_the_newest_turns_of_a_huge_thread_are_read(self) -> None:
        turn_chars = MAX_SCANNED_CONVERSATION_CHARS // 10
        thread = [human(f"turn {n} " + "y" * turn_chars) for n in range(30)]
        kept = filter_messages_for_memory(thread)
        assert 0 < len(kept) <= 10 and kept[-1] is thread[-1]

    def test_memory_turns_replace_lone_surrogates(self) -> None:
        turns = list(memory_turns([human("tea \ud83d cake"), ai("ok \udfff")]))
        assert turns == [("human", "tea \ufffd cake"), ("ai", "ok \ufffd")]
