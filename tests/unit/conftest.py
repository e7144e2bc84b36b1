"""Fixtures shared by the unit tests of the queue's producers (middleware, summarization hook)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from memstore.queue import MemoryUpdateQueue, reset_memory_queue, set_memory_queue
from tests.support.recording_updater import RecordingUpdater


@pytest.fixture
def updater() -> RecordingUpdater:
    return RecordingUpdater()


@pytest.fixture
def queue(updater: RecordingUpdater) -> Iterator[MemoryUpdateQueue]:
    """A process queue that records updates instead of calling an LLM, removed afterwards."""
    reset_memory_queue()
    installed = MemoryUpdateQueue(updater.factory)
    set_memory_queue(installed)
    yield installed
    reset_memory_queue()
