"""Option types and callbacks the commands share, so a bad value is a usage error.

Click checks them before the command runs: exit 2 with the usage line and the option's name, the
same as an unknown option. Left to the layers below, the same value failed later as a memstore
error (exit 1) that named an internal field (``min_confidence``) instead of the option.
"""

from __future__ import annotations

import math
from typing import Any

import click

from memstore.errors import InvalidFactError, InvalidScopeError
from memstore.record import checked_tag
from memstore.scope import normalize_agent_name, validate_roles, validate_tenant_id, validate_user_id
from memstore.storage.records import MAX_PAGE_SIZE

MAX_OFFSET = 2**63 - 1
"""The largest OFFSET both databases take (a signed 64-bit integer)."""


class FiniteFloatRange(click.FloatRange):
    """``click.FloatRange`` without ``nan``, which passes its bounds (every comparison is false)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if math.isnan(number):
            self.fail(f"{value!r} is not a number.", param, ctx)
        return number


class TagType(click.ParamType[str]):
    """A tag as ``memstore.record.checked_tag`` takes it (stripped; no comma, 1 to 64 characters)."""

    name = "tag"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return checked_tag(value)
        except InvalidFactError as exc:
            self.fail(exc.message.partition(": ")[2], param, ctx)


FRACTION = FiniteFloatRange(0, 1)
TAG = TagType()
PAGE_SIZE = click.IntRange(1, MAX_PAGE_SIZE)
OFFSET = click.IntRange(0, MAX_OFFSET)


def not_blank(_ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Refuse an empty or blank text value (often an unset shell variable: ``--fact "$ID"``)."""
    if value is not None and not value.strip():
        raise click.BadParameter("must not be empty", param=param)
    return value


def strict_user_id(_ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A ``--user`` that names a scope to write or serve: a valid stored id, as typed, so a typo is an
    error instead of a new scope (lookups take external ids too: ``output.user_id_option``)."""
    try:
        return validate_user_id(value)
    except InvalidScopeError as exc:
        raise click.BadParameter(str(exc), param=param) from exc


def agent_name_option(_ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """An ``--agent`` that is a valid agent name, kept as typed (names compare case-insensitively)."""
    try:
        normalize_agent_name(value)
    except InvalidScopeError as exc:
        raise click.BadParameter(str(exc), param=param) from exc
    return value


def tenant_id_option(_ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A ``--tenant`` that is a valid tenant id, as typed (none: the default tenant)."""
    try:
        return None if value is None else validate_tenant_id(value)
    except InvalidScopeError as exc:
        raise click.BadParameter(str(exc), param=param) from exc


def roles_option(_ctx: click.Context, param: click.Parameter, value: str | None) -> frozenset[str] | None:
    """``--roles editor,admin``: comma-separated role names."""
    if value is None:
        return None
    try:
        return validate_roles([name.strip() for name in value.split(",") if name.strip()])
    except InvalidScopeError as exc:
        raise click.BadParameter(str(exc), param=param) from exc


TENANT_OPTION = click.option(
    "--tenant",
    "tenant_id",
    callback=tenant_id_option,
    help="The tenant whose memory this is (default: the default tenant).",
)
