"""The request user ContextVar and the id helpers."""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memstore.gateway.user_context import (
    CurrentUser,
    get_current_user_id,
    get_effective_user_id,
    reset_current_user,
    set_current_user,
)
from memstore.scope import DEFAULT_USER_ID, USER_ID_PATTERN, make_safe_user_id, validate_user_id


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


def test_make_safe_user_id_reserves_the_fallback_user() -> None:
    """``default`` is the scope of every call that names no user: no external identity maps to it."""
    assert get_effective_user_id() == DEFAULT_USER_ID
    encoded = make_safe_user_id(DEFAULT_USER_ID)
    assert encoded == "default-37a8eec1ce19687d"  # the id README.md and the docs quote
    # Whoever sends that encoded id as a raw name is encoded again, as for any encoded id.
    near = [DEFAULT_USER_ID, encoded, "Default", "DEFAULT", " default", "default@x", "default-", "defaultx"]
    mapped = [make_safe_user_id(raw) for raw in near]
    assert DEFAULT_USER_ID not in mapped
    assert len(set(mapped)) == len(near)


@settings(max_examples=500, deadline=None, derandomize=True)
@given(
    st.text(max_size=140)
    | st.from_regex(r"[A-Za-z0-9_-]{1,128}", fullmatch=True)
    | st.from_regex(r"default(-[0-9a-f]{16})*", fullmatch=True)
)
def test_no_raw_id_maps_to_the_fallback_user(raw: str) -> None:
    mapped = make_safe_user_id(raw)
    assert mapped != DEFAULT_USER_ID
    assert USER_ID_PATTERN.fullmatch(mapped)
    # Injective around the reservation: only ``default`` itself maps to its encoding.
    assert (mapped == make_safe_user_id(DEFAULT_USER_ID)) == (raw == DEFAULT_USER_ID)
