"""``memstore demo``: bundled conversations through the whole pipeline, on the default storage.

It drives exactly what a gateway would: the middleware enqueues each finished turn, the
queue batches them, the updater extracts memory and the storage saves it; then it shows
each user's stored memory and the block the next prompt would receive.

The sample users go into a throwaway SQLite directory of their own (``demo_config``), never into
the configured database, unless the caller asks for that explicitly: a demo must not leave
made-up users in a real deployment.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from memstore.config import SQL_STORAGE_CLASS, MemoryConfig, get_memory_config
from memstore.gateway.middleware import MemoryMiddleware
from memstore.ops.view import memory_lines
from memstore.queue import get_memory_queue
from memstore.storage.loader import get_memory_storage
from memstore.update.extractor import describe_extractor

Echo = Callable[[str], None]


def load_sample_conversations() -> list[dict[str, Any]]:
    text = resources.files("memstore").joinpath("demo_data/conversations.json").read_text(encoding="utf-8")
    conversations: list[dict[str, Any]] = json.loads(text)["conversations"]
    return conversations


def demo_config(config: MemoryConfig, data_dir: Path) -> MemoryConfig:
    """``config`` with storage redirected to an embedded SQLite database under ``data_dir``."""
    return config.model_copy(
        update={"storage_class": SQL_STORAGE_CLASS, "data_dir": str(data_dir), "database_url": None}
    )


def run_demo(echo: Echo, config: MemoryConfig | None = None) -> list[str]:
    """Run the sample conversations and print the results; returns the user ids shown."""
    config = config or get_memory_config()
    storage = get_memory_storage()
    echo(f"Storage:   {type(storage).__name__} ({config.storage_class})")
    echo(f"Extractor: {describe_extractor(config)}")
    middleware = MemoryMiddleware(config=config)
    conversations = load_sample_conversations()
    for conversation in conversations:
        middleware.after_agent(
            conversation["messages"], thread_id=conversation["thread_id"], user_id=conversation["user_id"]
        )
    queue = get_memory_queue()
    echo(f"Queued {queue.pending_count} conversation(s); processing now instead of waiting for the debounce.")
    queue.flush()

    users = list(dict.fromkeys(c["user_id"] for c in conversations))
    for user_id in users:
        echo("")
        echo(f"=== {user_id} ===")
        for line in memory_lines(storage.load(user_id=user_id)):
            echo(line)
        block = middleware.memory_context(user_id=user_id)
        echo("")
        echo("Injected into the next prompt:")
        echo(block.rstrip("\n") if block else "(nothing to inject)")
    return users
