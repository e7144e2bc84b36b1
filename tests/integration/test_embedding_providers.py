"""The ``openai`` provider against the local OpenAI-compatible server, and the provider loader."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from memstore.config import MemoryConfig
from memstore.embedding import MAX_EMBED_CHARS, get_embedder
from memstore.embedding.openai_client import OpenAIEmbedder
from memstore.errors import EmbeddingError, EmbeddingUnavailableError
from tests.support.openai_server import OpenAIStubServer, RunningServer


@pytest.fixture
def embedder(openai_server: OpenAIStubServer) -> OpenAIEmbedder:
    config = MemoryConfig(
        embedding_provider="openai",
        embedding_model="embed-small",
        embedding_base_url=openai_server.base_url,
        embedding_batch_size=64,
        llm_base_url="http://127.0.0.1:9/v1",  # the chat endpoint is elsewhere and never called
        model_name="chat-model",
    )
    return OpenAIEmbedder(config)


def test_texts_go_in_batches_and_come_back_normalised_in_order(
    embedder: OpenAIEmbedder, openai_server: OpenAIStubServer
) -> None:
    texts = [f"fact number {i} about topic {i % 5}" for i in range(150)]
    matrix = embedder.embed_documents(texts)
    assert matrix.shape == (150, openai_server.embedding_dimension)
    assert np.allclose(np.linalg.norm(matrix, axis=1), 1.0, atol=1e-5)
    assert [len(body["input"]) for body in openai_server.embedding_requests] == [64, 64, 22]
    assert {body["model"] for body in openai_server.embedding_requests} == {"embed-small"}
    again = embedder.embed_documents([texts[149]])
    assert np.allclose(again[0], matrix[149])  # the order of the reply is the order of the texts
    assert embedder.model == "openai:embed-small"


def test_a_long_text_is_cut_before_it_is_sent(
    embedder: OpenAIEmbedder, openai_server: OpenAIStubServer
) -> None:
    embedder.embed_query("word " * 10_000)
    assert len(openai_server.embedding_requests[-1]["input"][0]) == MAX_EMBED_CHARS


def _replying(payload: Any, status: int = 200) -> Iterator[str]:
    """A one-off server answering every embeddings call with ``payload``."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None: ...

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def _item(index: int, vector: list[Any]) -> dict[str, Any]:
    return {"object": "embedding", "index": index, "embedding": vector}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([_item(0, [0.1, 0.2])], "1 vectors for 2 texts"),
        ([_item(0, [0.1, 0.2]), _item(1, [0.1, 0.2, 0.3])], "length"),
        ([_item(0, [0.1, 0.2]), _item(1, [0.1, float("nan")])], "non-finite"),
        ([_item(0, []), _item(1, [])], "length"),
    ],
)
def test_a_malformed_reply_is_an_embedding_error(data: list[Any], message: str) -> None:
    payload = {"object": "list", "data": data, "model": "m", "usage": {"prompt_tokens": 1, "total_tokens": 1}}
    for url in _replying(json.loads(json.dumps(payload).replace("NaN", "NaN"))):
        config = MemoryConfig(embedding_provider="openai", embedding_model="m", embedding_base_url=url)
        with pytest.raises(EmbeddingError, match=message) as raised:
            OpenAIEmbedder(config).embed_documents(["a", "b"])
        assert not isinstance(raised.value, EmbeddingUnavailableError)


def test_a_wrong_dimension_against_the_setting_is_an_error(openai_server: OpenAIStubServer) -> None:
    config = MemoryConfig(
        embedding_provider="openai",
        embedding_model="m",
        embedding_base_url=openai_server.base_url,
        embedding_dimensions=1536,
    )
    with pytest.raises(EmbeddingError, match="not 1536"):
        OpenAIEmbedder(config).embed_query("hello")


def test_an_outage_is_retryable_and_a_refusal_is_not(
    embedder: OpenAIEmbedder, openai_server: OpenAIStubServer
) -> None:
    openai_server.fail_embeddings(503)
    with pytest.raises(EmbeddingUnavailableError):
        embedder.embed_query("hello")
    openai_server.fail_embeddings(400)
    with pytest.raises(EmbeddingError) as refused:
        embedder.embed_query("hello")
    assert not isinstance(refused.value, EmbeddingUnavailableError)
    with RunningServer() as gone:
        url = gone.base_url
    closed = OpenAIEmbedder(
        MemoryConfig(embedding_provider="openai", embedding_model="m", embedding_base_url=url)
    )
    with pytest.raises(EmbeddingUnavailableError):
        closed.embed_query("hello")


def test_the_loader_builds_one_embedder_per_setting(openai_server: OpenAIStubServer) -> None:
    assert get_embedder(MemoryConfig()) is None
    config = MemoryConfig(
        embedding_provider="openai", embedding_model="m", embedding_base_url=openai_server.base_url
    )
    first = get_embedder(config)
    assert first is not None and get_embedder(config.model_copy()) is first
    other = get_embedder(config.model_copy(update={"embedding_model": "n"}))
    assert other is not None and other is not first and other.model == "openai:n"


def test_openai_without_a_model_is_a_config_error() -> None:
    with pytest.raises(ValidationError, match="embedding_model"):
        MemoryConfig(embedding_provider="openai")
    with pytest.raises(ValidationError, match="relevance"):
        MemoryConfig(
            relevance_semantic_weight=0,
            relevance_fulltext_weight=0,
            relevance_confidence_weight=0,
            relevance_recency_weight=0,
        )


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b"this is not JSON", "application/json"),
        (b"<html><body><h1>502 Bad Gateway</h1></body></html>", "text/html"),
        (b'{"object": "list", "data": null}', "application/json"),
        (b'{"object": "list", "data": [{"index": 0, "embedding": "abc"}]}', "application/json"),
    ],
)
def test_a_reply_that_is_no_embeddings_list_is_an_embedding_error(
    embedder: OpenAIEmbedder, openai_server: OpenAIStubServer, body: bytes, content_type: str
) -> None:
    openai_server.embedding_raw = (body, content_type)
    with pytest.raises(EmbeddingError, match="embeddings endpoint"):
        embedder.embed_query("hello")


def test_batches_of_different_lengths_are_an_error_not_a_ragged_matrix(
    openai_server: OpenAIStubServer,
) -> None:
    config = MemoryConfig(
        embedding_provider="openai",
        embedding_model="m",
        embedding_base_url=openai_server.base_url,
        embedding_batch_size=1,
    )
    embedder = OpenAIEmbedder(config)
    answer = openai_server.embeddings

    def shrinking(body: dict[str, Any]) -> Any:  # another model's length from the second batch on
        vectors = answer(body)
        openai_server.embedding_dimension = 16
        return vectors

    openai_server.embeddings = shrinking  # type: ignore[method-assign]
    with pytest.raises(EmbeddingError, match="different lengths across batches"):
        embedder.embed_documents(["first", "second"])
    # Nothing is locked in for the process: once the endpoint is consistent again, so are its answers.
    assert embedder.embed_documents(["third", "fourth"]).shape == (2, 16)


def test_a_lone_surrogate_is_replaced_not_a_crash(
    embedder: OpenAIEmbedder, openai_server: OpenAIStubServer
) -> None:
    vector = embedder.embed_query("caf\ud800e au lait")
    assert vector.shape == (openai_server.embedding_dimension,)
    assert "\ud800" not in openai_server.embedding_requests[-1]["input"][0]
