"""Text scans on the request and worker paths cost time linear in their input (issue 13, item 1).

Each test times a sweep of hostile inputs whose size doubles and asserts on the growth of the
time, never on the time itself: doubling the input must cost clearly less than the fourfold a
quadratic scan takes. Each point is the least CPU time of several samples, the growth is fitted
over all points, and a sweep over the limit is measured again before it fails, so one busy
moment on a shared machine does not decide the result. Sizes start small so that the old
quadratic patterns fail in seconds rather than minutes.
"""

from __future__ import annotations

import copy
import functools
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import pytest

from memstore.capture.conversation import ConversationContext, capture_conversation
from memstore.capture.filtering import strip_upload_blocks
from memstore.document import MAX_SUMMARY_CHARS, create_empty_memory
from memstore.update.extractor import RulesExtractor
from memstore.update.prompt import format_conversation_for_update
from memstore.update.updater import MemoryUpdater
from memstore.update.uploads import strip_upload_mentions
from tests.reliability.conftest import Record, configure, llm_settings
from tests.reliability.llm_script import update_reply
from tests.support.openai_server import OpenAIStubServer

SAMPLE_SECONDS = 0.02
SAMPLES = 5
MAX_DOUBLING_RATIO = 3.0
"""A linear scan doubles its time (plus constant overhead); a quadratic one quadruples it."""


def best_seconds(work: Callable[[], object]) -> float:
    """Least CPU time per call over ``SAMPLES`` samples, each repeating ``work`` for ``SAMPLE_SECONDS``.

    CPU time of this process, not wall time: other processes on a shared machine then only
    disturb the figures through caches, not by taking the CPU away mid-sample.
    """
    best = float("inf")
    for _ in range(SAMPLES):
        calls, start = 0, time.process_time()
        while True:
            work()
            calls += 1
            elapsed = time.process_time() - start
            if elapsed >= SAMPLE_SECONDS:
                break
        best = min(best, elapsed / calls)
    return best


def doubling_ratio(timings: dict[int, float]) -> float:
    """How much the time grows when the input doubles: 2 to the slope of log time over log size.

    Fitted over every point, so one disturbed point moves it much less than it moves the ratio
    of two neighbours.
    """
    fit = statistics.linear_regression(
        [math.log2(size) for size in timings], [math.log2(t) for t in timings.values()]
    )
    return float(2**fit.slope)


def assert_linear_sweep(
    make_input: Callable[[int], Any], run: Callable[[Any], object], sizes: list[int]
) -> dict[int, float]:
    """Time ``run`` over inputs of doubling sizes; fail once a doubling costs ``MAX_DOUBLING_RATIO``.

    The growth is checked from the third point on, so a quadratic scan fails early; a sweep over
    the limit is measured once more before it fails, so a single disturbed sample cannot.
    """
    inputs = {size: make_input(size) for size in sizes}

    def measure(size: int) -> float:
        return best_seconds(functools.partial(run, inputs[size]))

    timings: dict[int, float] = {}
    for size in sizes:
        timings[size] = measure(size)
        if len(timings) < 3 or doubling_ratio(timings) < MAX_DOUBLING_RATIO:
            continue
        timings = {measured: min(seconds, measure(measured)) for measured, seconds in timings.items()}
        ratio = doubling_ratio(timings)
        assert ratio < MAX_DOUBLING_RATIO, f"doubling the input cost {ratio:.1f}x time: {timings}"
    return timings


def repeated(unit: str, size: int) -> str:
    return (unit * (size // len(unit) + 1))[:size]


UNCLOSED_TAGS = "<uploaded_files>"
# No sentence end and no upload mention, but "upload" words everywhere: the old sentence pattern
# tried every start position and scanned to the end of the text from each.
UPLOAD_WORDS = {
    "words": "the user likes uploaded things and ",
    "short-words": "uploaded a b c ",
    "spaces": "upload" + " " * 58,
}
KB = 1024


def conversation(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}, {"role": "assistant", "content": "OK."}]


def test_unclosed_upload_tags_are_stripped_in_linear_time(record: Record) -> None:
    sizes = [10 * KB, 20 * KB, 40 * KB, 80 * KB, 160 * KB, 320 * KB]
    timings = assert_linear_sweep(lambda n: repeated(UNCLOSED_TAGS, n), strip_upload_blocks, sizes)
    record(input="unclosed <uploaded_files> tags", seconds=timings, lost=0)


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(
            lambda text: capture_conversation(
                conversation(text), thread_id="t", user_id="u", agent_name=None
            ),
            id="request-after_agent-capture",
        ),
        pytest.param(lambda text: format_conversation_for_update(conversation(text)), id="worker-prompt"),
    ],
)
def test_a_message_of_unclosed_upload_tags_costs_linear_time(
    path: Callable[[str], object], record: Record
) -> None:
    sizes = [10 * KB, 20 * KB, 40 * KB, 80 * KB, 160 * KB, 320 * KB]
    timings = assert_linear_sweep(lambda n: repeated(UNCLOSED_TAGS, n), path, sizes)
    record(input="message of unclosed <uploaded_files> tags", seconds=timings, lost=0)


@pytest.mark.parametrize("unit", list(UPLOAD_WORDS.values()), ids=list(UPLOAD_WORDS))
def test_upload_sentences_are_scrubbed_in_linear_time(unit: str, record: Record) -> None:
    def document(size: int) -> dict[str, Any]:
        memory = create_empty_memory()
        memory["user"]["workContext"] = {"summary": repeated(unit, size), "updatedAt": ""}
        memory["facts"] = [{"id": "fact_1", "content": repeated(unit, size), "confidence": 0.9}]
        return memory

    sizes = [KB // 2, 1 * KB, 2 * KB, 4 * KB, 8 * KB, 16 * KB, 32 * KB, 64 * KB]
    # strip_upload_mentions works in place (and collapses runs of spaces): scrub a fresh copy each time.
    timings = assert_linear_sweep(
        document, lambda memory: strip_upload_mentions(copy.deepcopy(memory)), sizes
    )
    record(input=f"summary and fact of {unit.strip()!r}", seconds=timings, lost=0)


def test_an_update_with_hostile_summaries_at_the_parser_cap_costs_linear_time(
    store_settings: dict[str, Any], openai_server: OpenAIStubServer, record: Record
) -> None:
    """The worker path end to end: real client, stub LLM, apply, save; summaries up to MAX_SUMMARY_CHARS."""
    configure(**store_settings, **llm_settings(openai_server))
    size_of_reply: dict[str, int] = {"size": 0}

    def reply(body: dict[str, Any]) -> str:
        summary = repeated(UPLOAD_WORDS["words"], size_of_reply["size"]).strip()
        return update_reply(user={"workContext": {"summary": summary, "shouldUpdate": True}})

    openai_server.default_reply = reply
    updater = MemoryUpdater()

    def update(size: int) -> bool:
        size_of_reply["size"] = size
        return updater.update_memory(conversation("I like tea."), thread_id="t", user_id="u")

    sizes = [1000, 2000, 4000, MAX_SUMMARY_CHARS]
    timings = {}
    for size in sizes:
        assert update(size), "the update was not saved"
        timings[size] = min(time_once(update, size) for _ in range(3))
    growth = timings[sizes[-1]] / timings[sizes[0]]
    # 8x the text: a linear scan costs at most 8x (the fixed cost of an update makes it far less);
    # the old pattern cost about 64x.
    assert growth < sizes[-1] / sizes[0], f"8x the summary cost {growth:.1f}x the time: {timings}"
    record(input="hostile summaries through the updater", seconds=timings, growth=round(growth, 2), lost=0)


def time_once(work: Callable[[int], object], size: int) -> float:
    start = time.perf_counter()
    work(size)
    return time.perf_counter() - start


@pytest.mark.parametrize(
    "make_text",
    [
        pytest.param(lambda n: "I like" + " " * n + "tea.", id="whitespace-run"),
        pytest.param(lambda n: "That is wrong, " + repeated("use ", n) + " instead.", id="lazy-correction"),
        pytest.param(lambda n: "That is wrong " + repeated("don't use x ", n), id="repeated-correction"),
        pytest.param(lambda n: repeated("I work at Acme and prefer tea, ", n), id="many-clauses"),
    ],
)
def test_the_rules_extractor_costs_linear_time(make_text: Callable[[int], str], record: Record) -> None:
    # The offline extractor is the default without an LLM; its clause and correction patterns were
    # polynomial on whitespace runs and repeated words (1,500 spaces: 43.6 s of CPU).
    extractor = RulesExtractor()
    sizes = [KB // 2, KB, 2 * KB, 4 * KB, 8 * KB]
    timings = assert_linear_sweep(
        make_text,
        lambda text: extractor.extract(ConversationContext("t", conversation(text)), create_empty_memory()),
        sizes,
    )
    record(input="rules extractor", seconds=timings, lost=0)
