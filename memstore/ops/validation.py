"""What an explicit edit may store: fact fields, search text and imported documents.

The caps are the core's (``memstore.document``), the same ones extractor replies are held to.
Text must also be storable by every provider: PostgreSQL text cannot hold NUL, and a lone
surrogate cannot be encoded as UTF-8. Checking both here, before anything is saved, turns what
used to be a failed save (a 503 or a 500 over HTTP) into an error that names the field.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from memstore.document import (
    DEFAULT_CATEGORY,
    FACT_CATEGORIES,
    MAX_CATEGORY_CHARS,
    MAX_DOCUMENT_DEPTH,
    MAX_DOCUMENT_FACTS,
    MAX_FACT_CHARS,
    MAX_SUMMARY_CHARS,
    SECTION_GROUPS,
    VISIBILITIES,
    unstorable,
)
from memstore.errors import (
    AccessDeniedError,
    InvalidDocumentError,
    InvalidFactError,
    InvalidScopeError,
    QueryError,
)
from memstore.record import checked_record_fields
from memstore.scope import ADMIN_ROLE, EDITOR_ROLE, validate_roles, validate_user_id

MAX_GRANTS = 100
"""Users, and roles, one shared fact may name (each list): a grant list is not a tenant directory."""
SHARING_ROLES = frozenset({EDITOR_ROLE, ADMIN_ROLE})
"""Roles that may make a fact shared or public; anyone may keep private facts."""
ACCESS_KEYS = ("visibility", "allowedUsers", "allowedRoles")

_FACT_TEXT_CAPS = {"content": MAX_FACT_CHARS, "category": MAX_CATEGORY_CHARS, "sourceError": MAX_FACT_CHARS}


def fact_content(content: object) -> str:
    """The stripped content of a manual fact; raises ``InvalidFactError('content')``."""
    if not isinstance(content, str):
        raise InvalidFactError("content", f"must be text, not {type(content).__name__}")
    if not content.strip():
        raise InvalidFactError("content", "empty; a fact needs some text")
    return _checked_text("content", content.strip(), MAX_FACT_CHARS)


def fact_category(category: object) -> str:
    """One of ``FACT_CATEGORIES`` (any case; blank means the default); else ``InvalidFactError``.

    Manual edits are held to the six categories, so a typo cannot file a fact where no filter or
    injection budget looks. Extracted and imported facts keep whatever category they carry, as
    in the reference: this check is only for what a person or an agent types.
    """
    if not isinstance(category, str):
        raise InvalidFactError("category", f"must be text, not {type(category).__name__}")
    value = _checked_text("category", category.strip(), MAX_CATEGORY_CHARS).lower() or DEFAULT_CATEGORY
    if value not in FACT_CATEGORIES:
        raise InvalidFactError("category", f"unknown; use one of {', '.join(FACT_CATEGORIES)}")
    return value


def fact_confidence(confidence: object) -> float:
    """``confidence`` as a float in [0, 1]; a bool is refused, although Python counts it as an int."""
    if isinstance(confidence, bool) or not isinstance(confidence, int | float):
        raise InvalidFactError("confidence", f"must be a number from 0 to 1, not {type(confidence).__name__}")
    value = float(confidence)
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise InvalidFactError("confidence", "out of range; it must be a number from 0 to 1")
    return value


def fact_access(
    visibility: object, allowed_users: Iterable[str] | None, allowed_roles: Iterable[str] | None
) -> dict[str, Any]:
    """The access keys of a fact as stored: ``{}`` (private), ``{"visibility": "public"}``, or
    ``{"visibility": "shared", "allowedUsers": [...], "allowedRoles": [...]}`` (empty lists left out).

    Grants exist only on a shared fact, so a grant with another visibility is refused rather than
    silently dropped; each list is capped at ``MAX_GRANTS`` and its names follow the id rules.
    """
    if visibility not in VISIBILITIES:
        raise InvalidFactError("visibility", f"unknown; use one of {', '.join(VISIBILITIES)}")
    access: dict[str, Any] = {} if visibility == "private" else {"visibility": visibility}
    for field, key, names in (
        ("allowed_users", "allowedUsers", allowed_users),
        ("allowed_roles", "allowedRoles", allowed_roles),
    ):
        checked = _grantees(field, names)
        if checked and visibility != "shared":
            raise InvalidFactError(field, "only a shared fact has grants; set visibility to shared")
        if checked:
            access[key] = checked
    return access


def _grantees(field: str, names: Iterable[str] | None) -> list[str]:
    """``names`` sorted, without repeats, each a valid user id (or role name); else ``InvalidFactError``."""
    if names is None:
        return []
    if isinstance(names, str):
        raise InvalidFactError(field, "must be a list of names, not one string")
    listed = list(names)
    if len(listed) > MAX_GRANTS:
        raise InvalidFactError(field, f"{len(listed)} names, the limit is {MAX_GRANTS}")
    if not all(isinstance(name, str) for name in listed):
        raise InvalidFactError(field, "every name must be text")
    try:
        check = _role_name if field == "allowed_roles" else _user_name
        checked = {check(name) for name in listed}
    except InvalidScopeError as exc:
        raise InvalidFactError(field, str(exc)) from exc
    return sorted(checked)


def _user_name(name: str) -> str:
    validate_user_id(name)
    return name


def _role_name(name: str) -> str:
    """One role name checked by the roles rule (``validate_roles`` also caps a caller's count at 32)."""
    validate_roles([name])
    return name


def access_of(fact: Mapping[str, Any]) -> dict[str, Any]:
    """A stored fact's access keys in ``fact_access``'s form (to compare what was asked with what is held)."""
    return {key: fact[key] for key in ACCESS_KEYS if key in fact and fact[key] not in ("private", [], None)}


def check_may_share(access: Mapping[str, Any], roles: Iterable[str] | None) -> None:
    """Refuse a shared or public fact unless ``roles`` holds ``editor`` or ``admin``."""
    if access.get("visibility", "private") != "private" and not SHARING_ROLES & validate_roles(roles):
        raise AccessDeniedError(
            f"a {access['visibility']} fact needs the role {EDITOR_ROLE} or {ADMIN_ROLE}; "
            "without either, facts are private"
        )


def check_document_access(document: Mapping[str, Any], roles: Iterable[str] | None) -> None:
    """The same rule for an imported document: its shared and public facts need a sharing role."""
    facts = document.get("facts")
    if not isinstance(facts, list):
        return
    for fact in facts:
        if isinstance(fact, dict) and any(key in fact for key in ACCESS_KEYS):
            try:
                access = fact_access(
                    fact.get("visibility", "private"), fact.get("allowedUsers"), fact.get("allowedRoles")
                )
            except InvalidFactError as exc:
                raise InvalidDocumentError(f"fact {fact.get('id')!r}: {exc}") from exc
            check_may_share(access, roles)


def search_text(name: str, text: str, max_chars: int) -> str:
    """``text`` when a search may send it to the store; raises ``QueryError`` naming ``name``."""
    reason = _text_problem(text, max_chars)
    if reason is not None:
        raise QueryError(f"{name}: {reason}")
    return text


def check_document(document: Mapping[str, Any]) -> None:
    """Raise ``InvalidDocumentError`` when an imported document breaks a cap or holds unstorable values.

    Only the caps and the memory-record keys (``memstore.record.checked_record_fields``: type,
    importance, tags, sourceKind, raw, structured, relations) are checked here; the rest of the
    shape is the provider's business (the file provider keeps documents other tools wrote, the
    SQL provider refuses what it cannot map to rows).
    """
    facts = document.get("facts")
    if isinstance(facts, list):
        if len(facts) > MAX_DOCUMENT_FACTS:
            raise InvalidDocumentError(f"{len(facts)} facts, over the {MAX_DOCUMENT_FACTS} accepted")
        for index, fact in enumerate(facts):
            content = fact.get("content") if isinstance(fact, dict) else None
            if isinstance(fact, dict) and (
                content is None or (isinstance(content, str) and not content.strip())
            ):
                # No provider keeps a fact without text; refused here it is a 422, not a failed save.
                raise InvalidDocumentError(f"fact {index} has no text content")
            for key, cap in _FACT_TEXT_CAPS.items():
                value = fact.get(key) if isinstance(fact, dict) else None
                if isinstance(value, str) and len(value) > cap:
                    raise InvalidDocumentError(
                        f"fact {index}: {key} is {len(value)} characters, over the {cap} accepted"
                    )
            if isinstance(fact, dict):
                try:
                    checked_record_fields(fact)
                except InvalidFactError as exc:
                    raise InvalidDocumentError(f"fact {index}: {exc}") from exc
    for group, names in SECTION_GROUPS.items():
        sections = document.get(group)
        if not isinstance(sections, dict):
            continue
        for name in names:
            section = sections.get(name)
            summary = section.get("summary") if isinstance(section, dict) else None
            if isinstance(summary, str) and len(summary) > MAX_SUMMARY_CHARS:
                raise InvalidDocumentError(
                    f"{group}.{name}: summary is {len(summary)} characters, "
                    f"over the {MAX_SUMMARY_CHARS} accepted"
                )
    _check_values(document)


def _checked_text(field: str, text: str, max_chars: int) -> str:
    reason = _text_problem(text, max_chars)
    if reason is not None:
        raise InvalidFactError(field, reason)
    return text


def _text_problem(text: str, max_chars: int) -> str | None:
    """The cap or storage rule ``text`` breaks, said without quoting it, or ``None``."""
    if len(text) > max_chars:
        return f"{len(text):,} characters, the limit is {max_chars:,}"
    return unstorable(text)


def _check_values(document: Mapping[str, Any]) -> None:
    """Nesting depth, text and numbers of every value, without recursion (a deep document must not
    exhaust the stack here, nor later in the provider's copies)."""
    pending: list[tuple[object, int]] = [(document, 1)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, dict | list) and depth > MAX_DOCUMENT_DEPTH:
            raise InvalidDocumentError(f"nested deeper than {MAX_DOCUMENT_DEPTH} levels")
        if isinstance(value, dict):
            pending.extend((key, depth) for key in value)
            pending.extend((item, depth + 1) for item in value.values())
        elif isinstance(value, list):
            pending.extend((item, depth + 1) for item in value)
        elif isinstance(value, str):
            if len(value) > MAX_SUMMARY_CHARS:
                # Unknown keys ride along in every load and every update prompt: no text may be
                # longer than the longest known field.
                raise InvalidDocumentError(
                    f"a text value is {len(value)} characters, over the {MAX_SUMMARY_CHARS} accepted"
                )
            problem = unstorable(value)
            if problem is not None:
                raise InvalidDocumentError(f"a text value {problem}")
        elif isinstance(value, float) and not math.isfinite(value):
            raise InvalidDocumentError(f"a number is {value}, which JSON cannot hold")
