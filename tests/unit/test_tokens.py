"""Token counting: offline tiktoken, the character estimate, and failure caching."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import threading
from typing import Any

import pytest
import tiktoken

from memstore.inject.tokens import (
    ENCODING_NAME,
    EncodingLoader,
    count_tokens,
    estimate_tokens,
    warm_tiktoken_cache,
)


def _run_isolated(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=60,
        check=False,
    )


class TestEstimate:
    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("", 0),
            ("abc", 0),
            ("abcd", 1),
            ("\n\n", 0),
            ("Facts:\n", 1),
            ("你好世界", 2),
            ("こんにちは", 2),
            ("안녕하세요", 2),
            ("ab你好", 1),
            ("café au lait", 3),
        ],
    )
    def test_four_chars_per_token_and_two_per_cjk_char(self, text: str, expected: int) -> None:
        assert estimate_tokens(text) == expected

    def test_char_mode_uses_the_estimate(self) -> None:
        text = "The user prefers PostgreSQL 用户喜欢"
        assert count_tokens(text, use_tiktoken=False) == estimate_tokens(text)


class TestTiktoken:
    def test_counts_with_cl100k_base(self) -> None:
        assert warm_tiktoken_cache() is True
        expected = tiktoken.get_encoding(ENCODING_NAME).encode_ordinary("hello world, 你好")
        assert count_tokens("hello world, 你好", use_tiktoken=True) == len(expected)
        assert count_tokens("hello world", use_tiktoken=True) == 2

    def test_special_token_text_is_counted_as_plain_text(self) -> None:
        assert count_tokens("<|endoftext|>", use_tiktoken=True) > 1

    def test_repeated_and_very_long_texts_count_exactly(self) -> None:
        line = "- [knowledge | 0.90] The user deploys with Kubernetes"
        assert count_tokens(line, use_tiktoken=True) == count_tokens(line, use_tiktoken=True)
        long_text = "word " * 10_000
        assert count_tokens(long_text, use_tiktoken=True) == len(
            tiktoken.get_encoding(ENCODING_NAME).encode_ordinary(long_text)
        )

    def test_loads_from_the_bundled_file_without_network(self, tmp_path: Any) -> None:
        result = _run_isolated(
            """
            import socket

            def refuse(*args, **kwargs):
                raise AssertionError("network access attempted")

            socket.socket.connect = refuse
            socket.create_connection = refuse
            from memstore.inject.tokens import count_tokens, warm_tiktoken_cache
            assert warm_tiktoken_cache()
            print(count_tokens("hello world", use_tiktoken=True))
            """,
            TIKTOKEN_CACHE_DIR=str(tmp_path),
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "2"

    def test_char_mode_never_imports_tiktoken(self) -> None:
        result = _run_isolated(
            """
            import sys
            from memstore.inject.render import format_memory_for_injection
            from memstore.inject.tokens import count_tokens
            doc = {"facts": [{"content": "x", "category": "correction", "confidence": 0.9}],
                   "user": {"workContext": {"summary": "w"}}}
            assert format_memory_for_injection(doc, use_tiktoken=False)
            assert count_tokens("abc", use_tiktoken=False) == 0
            print("tiktoken" in sys.modules)
            """
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "False"


class _RecordingLoad:
    """A real tiktoken load that records its attempts; it fails until ``succeed_from``."""

    def __init__(self, succeed_from: int | None = None) -> None:
        self.attempts = 0
        self.succeed_from = succeed_from

    def __call__(self, name: str) -> Any:
        self.attempts += 1
        if self.succeed_from is not None and self.attempts >= self.succeed_from:
            return tiktoken.get_encoding(ENCODING_NAME)
        return tiktoken.get_encoding(name)


class TestEncodingLoader:
    def test_failure_is_cached_during_the_cooldown(self, caplog: pytest.LogCaptureFixture) -> None:
        load = _RecordingLoad()
        loader = EncodingLoader("no_such_encoding", load=load)
        with caplog.at_level(logging.WARNING, logger="memstore.inject.tokens"):
            assert loader.counter() is None
            assert loader.counter() is None
        assert load.attempts == 1
        assert len(caplog.records) == 1
        assert "no_such_encoding" in caplog.records[0].getMessage()

    def test_retries_after_the_cooldown_and_logs_the_failure_once(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        load = _RecordingLoad()
        loader = EncodingLoader("no_such_encoding", cooldown_seconds=0.0, load=load)
        with caplog.at_level(logging.WARNING, logger="memstore.inject.tokens"):
            for _ in range(3):
                assert loader.counter() is None
        assert load.attempts == 3
        assert len(caplog.records) == 1

    def test_recovers_when_a_retry_succeeds(self) -> None:
        load = _RecordingLoad(succeed_from=2)
        loader = EncodingLoader("no_such_encoding", cooldown_seconds=0.0, load=load)
        assert loader.counter() is None
        counter = loader.counter()
        assert counter is not None
        assert counter("hello world") == 2
        assert loader.counter() is counter
        assert load.attempts == 2

    def test_concurrent_callers_fall_back_while_a_load_is_in_flight(self) -> None:
        started, release = threading.Event(), threading.Event()
        attempts: list[str] = []

        def slow_load(name: str) -> Any:
            attempts.append(name)
            started.set()
            release.wait(timeout=10)
            return tiktoken.get_encoding(name)

        loader = EncodingLoader(load=slow_load)
        results: list[object] = []
        worker = threading.Thread(target=lambda: results.append(loader.counter()))
        worker.start()
        assert started.wait(timeout=10)
        assert loader.counter() is None
        release.set()
        worker.join(timeout=10)
        assert results[0] is not None
        assert loader.counter() is results[0]
        assert attempts == [ENCODING_NAME]
