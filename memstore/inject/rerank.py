"""An optional second opinion on the top of a ranking: a rerank endpoint or the LLM reorders it.

``rerank`` is ``none`` (the default), ``endpoint`` or ``llm``. The first ``rerank_top_n``
candidates of a ranking (the fused order of ``memory_context(query=...)``, or of hybrid search)
go to the reranker with the query; its order replaces theirs and the rest follow unchanged.

- ``endpoint``: ``POST {rerank_base_url}/rerank`` with ``{"model", "query", "documents",
  "top_n"}``, the shape Cohere, Jina, vLLM, LiteLLM and Infinity accept, answered by
  ``{"results": [{"index", "relevance_score"}]}``; highest score first, and any candidate the
  reply leaves out follows in its fused order. ``rerank_api_key`` is sent as a bearer token.
- ``llm``: the chat model (``rerank_model``, else ``model_name``, at ``llm_base_url``) orders the
  numbered candidates (``rerank_llm``).

A reranker is advice on the read path, so nothing here raises: a call slower than
``rerank_timeout_seconds`` (a hard deadline: the call runs on a pool of its own, so a trickling
endpoint holds one of its threads, never the caller), an HTTP error, or a reply that is not what
was asked (not JSON, an index out of range or repeated, a score that is not a finite number) is
logged as a WARNING and the fused order stands.
"""

from __future__ import annotations

import json
import logging
import math
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from memstore.async_face import await_on_loop, bounded_here, loop_resource, running_loop
from memstore.config import MemoryConfig
from memstore.inject.relevance import MAX_QUERY_CHARS
from memstore.inject.rerank_llm import RerankReplyError, completed, llm_order

if TYPE_CHECKING:
    import httpx2

logger = logging.getLogger(__name__)

MAX_REPLY_BYTES = 4_000_000
"""A longer reply is refused unread: the results of 200 candidates are a few kilobytes (a server
that echoes the documents back sends them too, at most 200 facts of 4,000 characters)."""
MIN_RERANK_SECONDS = 0.05
"""Less time than this left on the caller's deadline is not worth a call."""

# As many threads as the memory-context pool, so concurrent turns never queue behind a healthy
# reranker (a hung one holds its threads until its own socket timeout).
_EXECUTOR = ThreadPoolExecutor(max_workers=4, thread_name_prefix="memstore-rerank")


def rerank_order(
    query: str, texts: Sequence[str], config: MemoryConfig, *, timeout: float | None = None
) -> list[int]:
    """The positions of ``texts`` (given best first) in the reranked order: a permutation of
    ``range(len(texts))`` whose first ``rerank_top_n`` entries the reranker ordered.

    ``timeout`` shortens ``rerank_timeout_seconds`` (the caller's own deadline). With ``rerank``
    ``none``, fewer than two texts, or any failure, the order is unchanged.
    """
    unchanged = list(range(len(texts)))
    if config.rerank == "none" or len(texts) < 2 or not query.strip():
        return unchanged
    seconds = config.rerank_timeout_seconds
    if timeout is not None:
        seconds = min(seconds, timeout)
    if seconds < MIN_RERANK_SECONDS:
        logger.warning("rerank skipped: the read's deadline left %.3f s; the fused order stands", seconds)
        return unchanged
    top = min(config.rerank_top_n, len(texts))
    call = _endpoint_order if config.rerank == "endpoint" else llm_order
    try:
        order = _ordered(call, query[:MAX_QUERY_CHARS], list(texts[:top]), config, seconds)
    except TimeoutError:
        logger.warning("rerank (%s) took longer than %.2f s; the fused order stands", config.rerank, seconds)
        return unchanged
    except Exception as exc:
        logger.warning("rerank (%s) failed; the fused order stands: %s", config.rerank, _reason(exc))
        return unchanged
    return [*order, *range(top, len(texts))]


def _ordered(
    call: Callable[[str, list[str], MemoryConfig, float], list[int]],
    query: str,
    texts: list[str],
    config: MemoryConfig,
    seconds: float,
) -> list[int]:
    """``call`` given up after ``seconds`` (``TimeoutError``): on the pool, or on the async face's loop."""
    if running_loop() is not None:
        return bounded_here(seconds, call, query, texts, config, seconds)
    future = _EXECUTOR.submit(call, query, texts, config, seconds)
    try:
        return future.result(timeout=seconds)
    except TimeoutError:
        future.cancel()
        raise


def _reason(exc: Exception) -> str:
    """The failure, with an HTTP error's status only: its body might echo the candidates."""
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code}"
    status = getattr(exc, "status_code", getattr(getattr(exc, "response", None), "status_code", None))
    if isinstance(status, int):
        return f"HTTP {status}"
    return f"{type(exc).__name__}: {str(exc)[:200]}"


def _endpoint_order(query: str, texts: list[str], config: MemoryConfig, timeout: float) -> list[int]:
    base_url = (config.rerank_base_url or "").rstrip("/")
    body: dict[str, Any] = {"query": query, "documents": texts, "top_n": len(texts)}
    if config.rerank_model:
        body["model"] = config.rerank_model
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if config.rerank_api_key is not None:
        headers["Authorization"] = f"Bearer {config.rerank_api_key.get_secret_value()}"
    data = json.dumps(body).encode("utf-8")
    if running_loop() is not None:
        raw = await_on_loop(_posted(base_url + "/rerank", data, headers, timeout))
    else:
        request = urllib.request.Request(base_url + "/rerank", data=data, headers=headers, method="POST")
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read(MAX_REPLY_BYTES + 1)
    if len(raw) > MAX_REPLY_BYTES:
        raise RerankReplyError(f"the reply is longer than {MAX_REPLY_BYTES:,} bytes")
    try:
        reply = json.loads(raw)
    except ValueError:
        raise RerankReplyError("the reply is not JSON") from None
    return scored_order(reply, len(texts))


async def _posted(url: str, data: bytes, headers: dict[str, str], timeout: float) -> bytes:
    """The async face's POST: the reply's first ``MAX_REPLY_BYTES + 1`` bytes; an error status
    raises, as ``urlopen`` does."""
    import httpx2  # only the async face's endpoint reranker needs it

    raw = b""
    client = loop_resource("rerank-endpoint", httpx2.AsyncClient, _close_http)  # one per loop: its pool
    async with client.stream("POST", url, content=data, headers=headers, timeout=timeout) as response:
        response.raise_for_status()
        async for chunk in response.aiter_bytes():
            raw += chunk
            if len(raw) > MAX_REPLY_BYTES:
                break
    return raw[: MAX_REPLY_BYTES + 1]


async def _close_http(client: httpx2.AsyncClient) -> None:
    await client.aclose()


def scored_order(reply: object, count: int) -> list[int]:
    """The order a ``{"results": [{"index", "relevance_score"}]}`` reply gives ``count`` candidates:
    highest score first (equal scores in the reply's order), the candidates it omits after."""
    results = reply.get("results") if isinstance(reply, dict) else None
    if not isinstance(results, list):
        raise RerankReplyError('the reply has no "results" list')
    scored: list[tuple[float, int]] = []
    for item in results:
        index = item.get("index") if isinstance(item, dict) else None
        score = item.get("relevance_score") if isinstance(item, dict) else None
        if type(index) is not int or not 0 <= index < count:
            raise RerankReplyError(f"a result's index is not one of the {count} candidates")
        if type(score) not in (int, float) or not math.isfinite(score):  # type: ignore[arg-type]
            raise RerankReplyError("a result's relevance_score is not a finite number")
        scored.append((float(score), index))  # type: ignore[arg-type]
    listed = [index for _, index in sorted(scored, key=lambda pair: -pair[0])]
    if len(set(listed)) != len(listed):
        raise RerankReplyError("the reply ranks a candidate twice")
    return completed(listed, count)
