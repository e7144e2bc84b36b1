"""Virtual paths: every hostile path is refused with a rule, every plain one accepted as given."""

from __future__ import annotations

import pytest
from hypothesis import given

from memstore.agent_doc import checked_folder, checked_path
from memstore.errors import AgentDocPathError
from tests.support.hostile_paths import hostile_paths, valid_paths


@given(hostile_paths)
def test_a_hostile_path_is_refused_without_being_quoted(path: str) -> None:
    with pytest.raises(AgentDocPathError) as refused:
        checked_path(path)
    message = str(refused.value)  # a rule, short and printable, whatever the path held
    assert len(message) < 160 and message.isprintable()


@given(valid_paths)
def test_a_plain_path_is_accepted_unchanged(path: str) -> None:
    assert checked_path(path) == path
    assert checked_folder(path) == f"{path}/"


@pytest.mark.parametrize("value", [None, 3, b"/memories/a.md", ["/memories/a.md"]])
def test_a_path_that_is_no_string_is_refused(value: object) -> None:
    with pytest.raises(AgentDocPathError, match="string"):
        checked_path(value)


def test_the_root_folder_in_both_spellings() -> None:
    assert checked_folder("/memories") == checked_folder("/memories/") == checked_folder(None) == "/memories/"
    with pytest.raises(AgentDocPathError):
        checked_folder("/memories/../")
