"""memstore's async API: the same operations as the sync one, awaited on the event loop.

Each function here is its sync namesake run on the async face (``memstore.async_face``): one
core, so the validation, errors, caps, identity, row-level security settings and caches are the
sync path's, while the database is reached through the async driver (aiosqlite, psycopg's async
connection) and no thread is held. The request-path hooks are ``MemoryMiddleware.amemory_context``,
``aafter_agent`` and ``asession_context``; the queries are in ``memstore.aio.queries``.

    from memstore import aio
    fact = await aio.create_memory_fact("Prefers short answers", user_id="alice")
    await aio.aclose()  # at shutdown: close this loop's connection pools and clients

A call awaited from a cancelled task stops at its current database call; its transaction is
rolled back, never committed half-way.
"""

import sys

from memstore.async_face import close_loop_resources, on_loop
from memstore.ops import facts, sessions
from memstore.storage.sql.engine import dispose_loop_engines

get_memory_data = on_loop(facts.get_memory_data)
reload_memory_data = on_loop(facts.reload_memory_data)
import_memory_data = on_loop(facts.import_memory_data)
clear_memory_data = on_loop(facts.clear_memory_data)
create_memory_fact = on_loop(facts.create_memory_fact)
create_memory_fact_with_created_fact = on_loop(facts.create_memory_fact_with_created_fact)
update_memory_fact = on_loop(facts.update_memory_fact)
delete_memory_fact = on_loop(facts.delete_memory_fact)
search_memory_facts = on_loop(facts.search_memory_facts)
append_session_turns = on_loop(sessions.append_turns)
session_context = on_loop(sessions.session_context)
read_session = on_loop(sessions.read_session)
list_sessions = on_loop(sessions.list_sessions)
clear_session = on_loop(sessions.clear_session)


async def aclose() -> None:
    """Close the running loop's database pools and Redis session clients (a server's shutdown;
    a test's end)."""
    await dispose_loop_engines()
    await close_loop_resources()
    # Loaded only once a Redis session store exists (the redis extra): else no client to close.
    redis_clients = sys.modules.get("memstore.storage.sessions.redis_clients")
    if redis_clients is not None:
        await redis_clients.close_loop_clients()


__all__ = [
    "aclose",
    "append_session_turns",
    "clear_memory_data",
    "clear_session",
    "create_memory_fact",
    "create_memory_fact_with_created_fact",
    "delete_memory_fact",
    "get_memory_data",
    "import_memory_data",
    "list_sessions",
    "read_session",
    "reload_memory_data",
    "search_memory_facts",
    "session_context",
    "update_memory_fact",
]
