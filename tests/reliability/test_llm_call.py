"""The LLM call's time bound and conversations with broken text (issue 13, item 10).

The real ``openai`` client talks to the local stub server; a reply is delayed by holding the
handler until the test releases it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from memstore.config import MemoryConfig
from memstore.errors import LLMError, LLMUnavailableError
from memstore.gateway.middleware import MemoryMiddleware
from memstore.queue import MemoryUpdateQueue, set_memory_queue
from memstore.storage.loader import get_memory_storage
from memstore.update.llm import LLMClient
from memstore.update.updater import MemoryUpdater
from tests.reliability.conftest import Record, configure, llm_settings
from tests.reliability.llm_script import fact, prompt_conversation, update_reply
from tests.support.openai_server import OpenAIStubServer, ScriptedError

TIMEOUT_SECONDS = 1.0
PROMPT = [{"role": "user", "content": "Reply with {}."}]


@pytest.fixture
def release(openai_server: OpenAIStubServer) -> Iterator[threading.Event]:
    """Every request waits for this event (or 30 s) before it is answered."""
    event = threading.Event()

    def slow(body: dict[str, Any]) -> str:
        event.wait(30)
        return update_reply()

    openai_server.default_reply = slow
    yield event
    event.set()


def client(server: OpenAIStubServer, timeout: float = TIMEOUT_SECONDS) -> LLMClient:
    return LLMClient(MemoryConfig(llm_base_url=server.base_url, model_name="m", llm_timeout_seconds=timeout))


def test_a_reply_slower_than_the_timeout_fails_within_the_timeout(
    openai_server: OpenAIStubServer, release: threading.Event, record: Record
) -> None:
    start = time.monotonic()
    with pytest.raises(LLMError):
        client(openai_server).complete(PROMPT)
    elapsed = time.monotonic() - start
    # The openai client's own retries made it 3 tries plus back-off: 16.3 s for a 5 s setting.
    assert len(openai_server.requests) == 1
    assert elapsed < 2 * TIMEOUT_SECONDS, f"took {elapsed:.2f} s with llm_timeout_seconds {TIMEOUT_SECONDS}"
    record(llm_timeout_seconds=TIMEOUT_SECONDS, seconds=round(elapsed, 2), requests=1, lost=0)


def test_the_updater_gives_up_on_a_slow_endpoint_within_the_timeout(
    openai_server: OpenAIStubServer, release: threading.Event, isolated_config: MemoryConfig
) -> None:
    configure(
        data_dir=isolated_config.data_dir,
        **{**llm_settings(openai_server), "llm_timeout_seconds": TIMEOUT_SECONDS},
    )
    start = time.monotonic()
    assert MemoryUpdater().update_memory(PROMPT, thread_id="t", user_id="u") is False
    assert time.monotonic() - start < 2 * TIMEOUT_SECONDS
    assert len(openai_server.requests) == 1


def test_a_passing_server_error_is_tried_again_within_the_timeout(openai_server: OpenAIStubServer) -> None:
    openai_server.script(ScriptedError(503, "overloaded"), ScriptedError(429, "slow down"), update_reply())
    assert "newFacts" in client(openai_server, timeout=10.0).complete(PROMPT)
    assert len(openai_server.requests) == 3


@pytest.mark.parametrize("status", [503, 500])
def test_a_failing_server_is_tried_at_most_three_times(openai_server: OpenAIStubServer, status: int) -> None:
    openai_server.script(*[ScriptedError(status)] * 3)
    start = time.monotonic()
    with pytest.raises(LLMError):
        client(openai_server, timeout=10.0).complete(PROMPT)
    assert len(openai_server.requests) == 3
    assert time.monotonic() - start < 10.0


def test_a_client_error_is_not_tried_again(openai_server: OpenAIStubServer) -> None:
    openai_server.script(ScriptedError(400, "bad request"), update_reply())
    with pytest.raises(LLMError) as raised:
        client(openai_server, timeout=10.0).complete(PROMPT)
    assert len(openai_server.requests) == 1
    assert not isinstance(raised.value, LLMUnavailableError), (
        "a 400 will not pass: the queue must not retry it"
    )


def test_what_may_pass_later_is_marked_for_the_queue_with_the_retry_after(
    openai_server: OpenAIStubServer,
) -> None:
    """A 429 asking for more time than the call has left ends the call at once, carrying it."""
    openai_server.script(ScriptedError(429, "slow down", {"Retry-After": "120"}))
    start = time.monotonic()
    with pytest.raises(LLMUnavailableError) as raised:
        client(openai_server, timeout=5.0).complete(PROMPT)
    assert raised.value.retry_after == 120.0
    assert len(openai_server.requests) == 1 and time.monotonic() - start < 5.0

    openai_server.script(ScriptedError(429, "slow down", {"Retry-After": "1.5"}), update_reply())
    start = time.monotonic()
    assert "newFacts" in client(openai_server, timeout=5.0).complete(PROMPT)
    assert time.monotonic() - start >= 1.5, "a Retry-After longer than the usual pause is waited out"

    openai_server.script(*[ScriptedError(503)] * 3)
    with pytest.raises(LLMUnavailableError) as raised:
        client(openai_server, timeout=5.0).complete(PROMPT)
    assert raised.value.retry_after is None


BROKEN = "I like green tea \ud83d and biscuits."


def test_a_lone_surrogate_in_a_turn_is_replaced_and_the_update_still_runs(
    store_settings: dict[str, Any], openai_server: OpenAIStubServer, record: Record
) -> None:
    configure(**store_settings, **llm_settings(openai_server))
    openai_server.default_reply = lambda body: update_reply([fact("User likes green tea")])
    queue = MemoryUpdateQueue()
    set_memory_queue(queue)
    MemoryMiddleware().after_agent(
        [{"role": "user", "content": BROKEN}, {"role": "assistant", "content": "Noted \udc00."}],
        thread_id="broken",
        user_id="u",
    )
    queue.flush()
    assert (queue.stats.updated, queue.stats.errors, queue.stats.skipped) == (1, 0, 0)
    [body] = openai_server.requests
    assert (
        prompt_conversation(body) == "User: I like green tea \ufffd and biscuits.\n\nAssistant: Noted \ufffd."
    )
    assert [f["content"] for f in get_memory_storage().load(user_id="u")["facts"]] == ["User likes green tea"]
    record(extractor="llm", surrogates=2, lost=0)


def test_the_rules_extractor_keeps_a_statement_with_a_lone_surrogate(
    store_settings: dict[str, Any], record: Record
) -> None:
    configure(**store_settings, extractor="rules")
    assert MemoryUpdater().update_memory(
        [{"role": "user", "content": BROKEN}, {"role": "assistant", "content": "Noted."}],
        thread_id="broken",
        user_id="u",
    )
    contents = [f["content"] for f in get_memory_storage().load(user_id="u")["facts"]]
    assert contents == ["User likes green tea \ufffd and biscuits"]
    record(extractor="rules", surrogates=1, lost=0)
