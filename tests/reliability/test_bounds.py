"""Size bounds: huge conversations, a full queue, and the memory 10,000 queued users cost."""

from __future__ import annotations

import json
import logging
import sys
import tracemalloc
from typing import Any

import pytest

from memstore.capture.conversation import ConversationContext
from memstore.config import MemoryConfig
from memstore.gateway.middleware import MemoryMiddleware
from memstore.queue import MemoryUpdateQueue, set_memory_queue
from memstore.queue.bounds import (
    MAX_QUEUED_CONVERSATION_CHARS,
    MAX_QUEUED_MESSAGE_CHARS,
    conversation_chars,
    correction_reserve,
)
from memstore.update.prompt import MAX_CONVERSATION_CHARS
from tests.reliability.conftest import Record, configure, llm_settings
from tests.reliability.llm_script import fact, prompt_conversation, update_reply
from tests.support.openai_server import OpenAIStubServer
from tests.support.recording_updater import RecordingUpdater

TEN_MB = 10 * 1024 * 1024
# System prompt, memory block and JSON framing on top of the conversation cap.
PROMPT_OVERHEAD = 16_000


def one_huge_message() -> list[dict[str, str]]:
    return [
        {"role": "user", "content": "FIRST " + "a" * TEN_MB + " I prefer tea."},
        {"role": "assistant", "content": "LAST answer."},
    ]


def many_messages() -> list[dict[str, str]]:
    """10 MB over 10,240 turns; each turn is marked so the test can see which ones reached the LLM."""
    turns = []
    for n in range(10_240):
        role = "user" if n % 2 == 0 else "assistant"
        turns.append({"role": role, "content": f"turn {n} " + "b" * 1020})
    return turns


@pytest.mark.parametrize("shape", [one_huge_message, many_messages], ids=["one-message", "many-messages"])
def test_a_ten_megabyte_conversation_is_cut_before_the_llm(
    shape: Any, sql_url: str, openai_server: OpenAIStubServer, record: Record
) -> None:
    configure(database_url=sql_url, **llm_settings(openai_server))
    openai_server.default_reply = lambda body: update_reply([fact("User prefers tea")])
    queue = MemoryUpdateQueue()
    set_memory_queue(queue)
    messages = shape()
    size = sum(len(m["content"]) for m in messages)
    assert size >= TEN_MB

    MemoryMiddleware().after_agent(messages, thread_id="huge", user_id="u0")
    queue.flush()

    [body] = openai_server.requests
    sent = len(json.dumps(body, ensure_ascii=False))
    conversation = prompt_conversation(body)
    assert sent < MAX_CONVERSATION_CHARS + PROMPT_OVERHEAD
    assert len(conversation) <= MAX_CONVERSATION_CHARS
    if shape is many_messages:
        assert "turn 10239 " in conversation and "turn 0 " not in conversation
    else:
        assert conversation.startswith("User: FIRST aaa") and conversation.endswith("Assistant: LAST answer.")
    assert queue.stats.updated == 1
    record(shape=shape.__name__, conversation_chars=size, request_chars=sent, lost=0)


def test_a_full_queue_drops_new_keys_but_admits_corrections_and_replacements(
    isolated_config: MemoryConfig, caplog: pytest.LogCaptureFixture, record: Record
) -> None:
    configure(max_queue_depth=5, data_dir=isolated_config.data_dir)
    queue = MemoryUpdateQueue()
    set_memory_queue(queue)
    middleware = MemoryMiddleware()

    def turn(text: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": text}, {"role": "assistant", "content": "OK."}]

    with caplog.at_level(logging.WARNING, logger="memstore.queue"):
        for n in range(8):
            middleware.after_agent(turn(f"hello {n}"), thread_id=f"t{n}", user_id="u0")
        middleware.after_agent(turn("That's wrong, try again."), thread_id="t-correction", user_id="u0")
        middleware.after_agent(turn("hello again"), thread_id="t0", user_id="u0")

    assert queue.pending_count == 6
    assert queue.stats.rejected_full == 3
    assert caplog.text.count("memory queue is full") == 3
    pending = {context.thread_id: context for context in queue._queue.values()}
    assert sorted(pending) == ["t-correction", "t0", "t1", "t2", "t3", "t4"]
    assert pending["t0"].messages[0]["content"] == "hello again"
    assert pending["t-correction"].correction_detected
    queue.clear()
    record(depth=5, offered=10, dropped=queue.stats.rejected_full, corrections_lost=0)


def queued_bytes(queue: MemoryUpdateQueue, users: int, text_for: Any) -> int:
    """Bytes still allocated after queueing ``users`` conversations (inputs are not kept alive)."""
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for n in range(users):
            queue.add(
                thread_id=f"t{n}",
                messages=[{"role": "user", "content": text_for(n)}, {"role": "assistant", "content": "OK."}],
                user_id=f"user{n}",
            )
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    return sum(stat.size_diff for stat in after.compare_to(before, "filename"))


def entry_bound(text: str) -> int:
    """A generous per-entry allowance: the entry's own objects, tripled for bookkeeping and slack."""
    messages = [{"role": "user", "content": text}, {"role": "assistant", "content": "OK."}]
    own = sum(sys.getsizeof(m) + sys.getsizeof(m["content"]) + sys.getsizeof(m["role"]) for m in messages)
    return 3 * (own + 1024)


def test_ten_thousand_queued_users_cost_memory_proportional_to_the_entries(
    isolated_config: MemoryConfig, record: Record
) -> None:
    configure(data_dir=isolated_config.data_dir)
    queue = MemoryUpdateQueue()
    sample = "I work at Acme and prefer Python for data work, user 00000."
    used = queued_bytes(queue, 10_000, lambda n: f"{sample[:-6]}{n:05d}.")
    assert queue.pending_count == 10_000
    assert used < 10_000 * entry_bound(sample)
    queue.clear()

    # Each user pastes 1 MB: the queue keeps a bounded cut of it, not the paste.
    pasted = MemoryUpdateQueue()
    heavy = queued_bytes(pasted, 1_000, lambda n: f"{n} " + "p" * 1_000_000)
    assert pasted.pending_count == 1_000
    assert heavy < 1_000 * entry_bound("p" * MAX_QUEUED_MESSAGE_CHARS)
    pasted.clear()
    record(
        users=10_000,
        bytes_per_user=used // 10_000,
        bound_per_user=entry_bound(sample),
        pasted_users=1_000,
        pasted_bytes_per_user=heavy // 1_000,
        lost=0,
    )


def test_corrections_past_the_reserve_are_dropped_and_memory_stays_bounded(
    isolated_config: MemoryConfig, caplog: pytest.LogCaptureFixture, record: Record
) -> None:
    """Corrections ("try again", "redo") are everyday turns: a flood of them must not bypass the depth."""
    config = configure(max_queue_depth=100, data_dir=isolated_config.data_dir)
    caplog.set_level(logging.ERROR, logger="memstore")  # captured warnings would be counted too
    queue = MemoryUpdateQueue()
    set_memory_queue(queue)
    middleware = MemoryMiddleware()
    offered = 2_000
    text = "That's wrong, try again. " + "r" * MAX_QUEUED_MESSAGE_CHARS

    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for n in range(offered):
            unique = f"{n:05d} {text}"  # a new string per turn, as real traffic would be
            middleware.after_agent(
                [{"role": "user", "content": unique}, {"role": "assistant", "content": "OK."}],
                thread_id=f"t{n}",
                user_id=f"user{n}",
            )
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    used = sum(stat.size_diff for stat in after.compare_to(before, "filename"))

    limit = config.max_queue_depth + correction_reserve(config.max_queue_depth)
    assert all(context.correction_detected for context in queue._queue.values())
    assert queue.pending_count == limit == 110
    assert queue.stats.rejected_full == offered - limit
    assert used < limit * entry_bound(text)
    queue.clear()
    record(
        depth=100, reserve=10, offered=offered, admitted=limit, bytes=used, bound=limit * entry_bound(text)
    )


def long_thread(n: int) -> list[dict[str, str]]:
    """A conversation over the per-conversation cap, in turns at the per-message cap; unique text."""
    return [
        {
            "role": "user" if i % 2 == 0 else "assistant",
            "content": f"{n}.{i} " + "c" * MAX_QUEUED_MESSAGE_CHARS,
        }
        for i in range(12)
    ]


def test_max_queue_chars_bounds_memory_whatever_the_flags(
    isolated_config: MemoryConfig, record: Record
) -> None:
    config = configure(max_queue_depth=100_000, max_queue_chars=1_000_000, data_dir=isolated_config.data_dir)
    queue = MemoryUpdateQueue()
    offered = 300

    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for n in range(offered):
            queue.add(
                thread_id=f"t{n}",
                messages=long_thread(n),
                user_id=f"user{n}",
                correction_detected=True,
                reinforcement_detected=True,
            )
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    used = sum(stat.size_diff for stat in after.compare_to(before, "filename"))

    held = sum(conversation_chars(context.messages) for context in queue._queue.values())
    assert 0 < held <= config.max_queue_chars
    assert queue.pending_count == held // MAX_QUEUED_CONVERSATION_CHARS
    assert queue.stats.rejected_full == offered - queue.pending_count
    assert used < 2 * config.max_queue_chars  # ASCII: a byte a character, plus per-message overhead
    admitted = queue.pending_count
    queue.clear()
    record(max_queue_chars=config.max_queue_chars, offered=offered, admitted=admitted, chars=held, bytes=used)


def test_the_batch_being_processed_counts_against_max_queue_chars(isolated_config: MemoryConfig) -> None:
    configure(max_queue_chars=4 * MAX_QUEUED_CONVERSATION_CHARS, data_dir=isolated_config.data_dir)
    queue: MemoryUpdateQueue
    admitted_during_batch: list[int] = []

    class Updater:
        def update(self, context: ConversationContext) -> bool:
            if context.thread_id == "first":
                for n in range(5):
                    queue.add(thread_id=f"t{n}", messages=long_thread(n), user_id=f"user{n}")
                admitted_during_batch.append(queue.pending_count)
            return True

    queue = MemoryUpdateQueue(lambda: Updater())
    queue.add(thread_id="first", messages=long_thread(99), user_id="u")
    queue.flush()

    assert admitted_during_batch == [3]  # 4 fit, and the one in flight holds the first slot
    assert queue.stats.rejected_full == 2
    queue.flush()
    assert queue._budget.held == 0
    queue.add(thread_id="after", messages=long_thread(7), user_id="u")
    assert queue.pending_count == 1
    queue.clear()


def test_a_queued_conversation_holds_only_text(isolated_config: MemoryConfig) -> None:
    # Review of issue 13 item 4: a "try again" turn carrying a 5 MB image counted as 11 characters
    # against max_queue_chars while the queue kept the image.
    configure(data_dir=isolated_config.data_dir, max_queue_depth=10)
    queue = MemoryUpdateQueue(RecordingUpdater().factory)
    set_memory_queue(queue)
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 5_000_000}}
    messages = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "try again"}, image],
            "additional_kwargs": {"x": "y" * 100},
        },
        {"role": "assistant", "content": "Sorry, here it is."},
    ]
    MemoryMiddleware().after_agent(messages, thread_id="t", user_id="u0")
    [pending] = queue._queue.values()
    assert pending.messages == [
        {"role": "user", "content": "try again"},
        {"role": "assistant", "content": "Sorry, here it is."},
    ]
    assert len(repr(pending)) < 2_000
    queue.clear()
