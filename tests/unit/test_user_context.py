"""The request user ContextVar and the id helpers."""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass

import pytest

from memstore.gateway.user_context import (
    CurrentUser,
    get_current_user_id,
    get_effective_user_id,
    reset_current_user,
    set_current_user,
)
from memstore.scope import make_safe_user_id, validate_user_id


@dataclass
class _User:
    id: object


def test_default_user_when_unset() -> None:
    assert get_current_user_id() is None
    assert get_effective_user_id() == "default"


def test_set_and_reset_round_trip() -> None:
    token = set_current_user("alice")
    assert get_effective_user_id() == "alice"
    inner = set_current_user(_User(uuid.UUID("12345678-1234-5678-1234-567812345678")))
    assert get_effective_user_id() == "12345678-1234-5678-1234-567812345678"
    reset_current_user(inner)
    assert get_effective_user_id() == "alice"
    reset_current_user(token)
    assert get_effective_user_id() == "default"


def test_protocol_is_duck_typed() -> None:
    assert isinstance(_User(1), CurrentUser)
    assert not isinstance(object(), CurrentUser)


def test_empty_id_is_rejected() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        set_current_user("")


def test_worker_threads_do_not_inherit_the_user() -> None:
    """Why the queue captures the user at enqueue time."""
    token = set_current_user("alice")
    seen: list[str] = []
    thread = threading.Thread(target=lambda: seen.append(get_effective_user_id()))
    thread.start()
    thread.join()
    reset_current_user(token)
    assert seen == ["default"]


def test_make_safe_user_id_is_valid_and_collision_free() -> None:
    first, second = make_safe_user_id("a.b@example.com"), make_safe_user_id("a-b@example.com")
    assert first != second
    assert validate_user_id(first) == first
    assert make_safe_user_id("plain_id-1") == "plain_id-1"
