"""The memory-record keys (``memstore.record``) out of DeerFlow's sight, and back on its saves.

DeerFlow's fact has no ``type``, ``importance``, ``tags``, ``sourceKind``, ``raw``, ``structured``
or ``relations``. Unless a deployment opts in (``deerflow_record_fields``, off by default), every
fact the adapters hand DeerFlow (documents, single facts, search results, change-set answers)
leaves them out, so DeerFlow's prompts, API answers and files keep exactly today's fields.

Hiding never loses them. DeerFlow writes back whole facts, and a fact without the keys would reset
them to their defaults, so a fact that comes back with the id of a stored one gets back the keys
it does not carry itself, when the adapter can tell it was read from that fact:

- the seed adapter keeps the keys it hid, per fact id, in the document's ``LoadToken``;
- a seed document without a token (an import), or a DeerMem ``save``, gets them back from the
  stored fact when the content is unchanged (DeerMem: or the fact's own ``revision`` is the stored
  one, DeerMem's per-fact proof of a read, which it checks on every write of an existing fact);
- a DeerMem ``apply_changes`` upsert of an existing fact has had its revision checked already.

A key DeerFlow does send (a plugin that sets ``tags``) is kept as sent. With the setting on,
nothing is hidden or restored: the keys pass through both ways, as before.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from memstore.config import get_memory_config
from memstore.record import RECORD_KEYS

Hidden = Mapping[str, Any]
"""The record keys hidden from one fact, by name."""


def shows_record_fields(setting: bool | None) -> bool:
    """The adapter's own choice when given, else memstore's ``deerflow_record_fields``."""
    return setting if setting is not None else get_memory_config().deerflow_record_fields


def hidden_of(fact: Mapping[str, Any]) -> dict[str, Any]:
    """The record keys ``fact`` carries (copies), which DeerFlow does not see."""
    return {key: copy.deepcopy(fact[key]) for key in RECORD_KEYS if key in fact}


def without_record_keys(fact: dict[str, Any]) -> dict[str, Any]:
    """``fact`` as DeerFlow sees it: a copy without the record keys, the other keys in order.

    A fact that carries none is returned as it is.
    """
    if not any(key in fact for key in RECORD_KEYS):
        return fact
    return {key: value for key, value in fact.items() if key not in RECORD_KEYS}


def restored(fact: dict[str, Any], hidden: Hidden) -> dict[str, Any]:
    """``fact`` with the ``hidden`` keys it does not carry itself put back (a copy when any is)."""
    missing = {key: copy.deepcopy(value) for key, value in hidden.items() if key not in fact}
    return {**fact, **missing} if missing else fact


def same_content(fact: Mapping[str, Any], stored: Mapping[str, Any]) -> bool:
    content = fact.get("content")
    return isinstance(content, str) and content == stored.get("content")


def restore_facts(facts: object, hidden_by_id: Mapping[str, Hidden]) -> object:
    """A document's ``facts`` with each known id's hidden keys back; anything else as it is."""
    if not isinstance(facts, list) or not hidden_by_id:
        return facts
    return [
        restored(fact, hidden_by_id[str(fact.get("id"))])
        if isinstance(fact, dict) and str(fact.get("id")) in hidden_by_id
        else fact
        for fact in facts
    ]


def hidden_by_unchanged_content(facts: object, stored: object) -> dict[str, Hidden]:
    """The record keys of each ``stored`` fact that ``facts`` holds with the same id and content."""
    if not isinstance(facts, list) or not isinstance(stored, list):
        return {}
    incoming = {str(fact.get("id")): fact for fact in facts if isinstance(fact, dict)}
    found: dict[str, Hidden] = {}
    for fact in stored:
        if not isinstance(fact, dict):
            continue
        fact_id = str(fact.get("id"))
        hidden = hidden_of(fact)
        if hidden and fact_id in incoming and same_content(incoming[fact_id], fact):
            found[fact_id] = hidden
    return found
