"""``memstore store list|show|history``: the items LangGraph graphs keep through ``MemstoreStore``.

The commands read as the named user in their tenant (``--user``, ``--tenant``), on the
application's connection, as ``sessions`` and ``agent-doc`` do: on PostgreSQL the row-level
security holds every read to that user's rows. ``--agent`` names the store's agent (default: a
store that names none). A namespace is its labels joined by ``.`` (``memories.alice``); a bad id,
namespace or key is a usage error (exit 2) that does not repeat the value; an item that is not
stored exits 4.
"""

from __future__ import annotations

import json
import sys
import unicodedata
from datetime import datetime
from typing import Any, NoReturn

import click

from memstore.cli.exit_codes import EXIT_NOTHING_MATCHED
from memstore.cli.output import echo_json, echo_table, user_id_option
from memstore.errors import InvalidScopeError, StoreItemError
from memstore.ops.view import one_line
from memstore.scope import DEFAULT_TENANT_ID, normalize_agent_name, validate_tenant_id
from memstore.storage.records import iso
from memstore.storage.sql.store_items.items import (
    MAX_LIMIT,
    MAX_OFFSET,
    SEPARATOR,
    ItemScope,
    Namespace,
    checked_key,
    checked_namespace,
    joined,
)
from memstore.storage.sql.store_items.reads import item_reads

PREVIEW_CHARS = 60
ID_RULE = "use 1-128 characters from A-Z a-z 0-9 _ -"


def _tenant(_ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    try:
        return None if value is None else validate_tenant_id(value)
    except InvalidScopeError as exc:
        raise click.BadParameter(f"not a tenant id: {ID_RULE}", param=param) from exc


def _agent(_ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    try:
        return normalize_agent_name(value)
    except InvalidScopeError as exc:
        raise click.BadParameter(
            "not an agent name: use 1-128 characters from A-Z a-z 0-9 -", param=param
        ) from exc


def _namespace(_ctx: click.Context, param: click.Parameter, value: str | None) -> Namespace | None:
    if value is None:
        return None
    if not value.strip():
        raise click.BadParameter("must not be empty", param=param)
    try:
        return checked_namespace(tuple(value.split(SEPARATOR)))
    except StoreItemError as exc:
        raise click.BadParameter(f"{exc} (labels are joined by '.')", param=param) from exc


def _key(_ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        return checked_key(value)
    except StoreItemError as exc:
        raise click.BadParameter(str(exc), param=param) from exc


user_option = click.option("--user", "user_id", callback=user_id_option, required=True, help="User id.")
tenant_option = click.option(
    "--tenant",
    "tenant_id",
    callback=_tenant,
    help="The tenant whose items these are (default: the default tenant).",
)
agent_option = click.option(
    "--agent",
    "agent_name",
    callback=_agent,
    help="The agent the store names (default: none, a store without agent_name).",
)
item_namespace = click.option(
    "--namespace",
    callback=_namespace,
    required=True,
    help="The item's namespace, its labels joined by '.' (memories.alice).",
)
item_key = click.option("--key", callback=_key, required=True, help="The item's key.")
json_option = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")


def _scope(user_id: str, agent_name: str | None, tenant_id: str | None) -> ItemScope:
    return ItemScope(tenant_id or DEFAULT_TENANT_ID, user_id, agent_name or "")


def _label(scope: ItemScope) -> str:
    who = scope.user_id if not scope.agent_name else f"{scope.user_id} / agent {scope.agent_name}"
    return who if scope.tenant_id == DEFAULT_TENANT_ID else f"{who} (tenant {scope.tenant_id})"


def _when(value: datetime) -> str:
    return (iso(value) or "")[:19]


def _ids(scope: ItemScope) -> dict[str, str | None]:
    return {"tenantId": scope.tenant_id, "userId": scope.user_id, "agentName": scope.agent_name or None}


def _nothing(scope: ItemScope, namespace: Namespace, key: str, what: str) -> NoReturn:
    shown = one_line(f"{joined(namespace)} / {key}")
    click.echo(f"no {what} {shown} of {_label(scope)} (check the ids, namespace and key)", err=True)
    raise SystemExit(EXIT_NOTHING_MATCHED)


@click.group("store")
def store() -> None:
    """List and show the items LangGraph graphs keep through MemstoreStore, and their history."""


@store.command("list")
@user_option
@agent_option
@tenant_option
@click.option(
    "--namespace",
    callback=_namespace,
    help="Only the items in this namespace or under it (labels joined by '.': memories.alice).",
)
@click.option("--limit", type=click.IntRange(1, MAX_LIMIT), default=100, show_default=True, help="Page size.")
@click.option(
    "--offset",
    type=click.IntRange(0, MAX_OFFSET),
    default=0,
    show_default=True,
    help="Items to skip, for paging.",
)
@json_option
def list_command(
    user_id: str,
    agent_name: str | None,
    tenant_id: str | None,
    namespace: Namespace | None,
    limit: int,
    offset: int,
    as_json: bool,
) -> None:
    """The user's live items (of --agent's store), the most recently updated first."""
    scope = _scope(user_id, agent_name, tenant_id)
    found = item_reads().list_items(scope, namespace or (), limit=limit, offset=offset)
    if as_json:
        items = [
            {
                "namespace": list(item.namespace),
                "key": item.key,
                "chars": item.chars,
                "version": item.version,
                "createdAt": iso(item.created_at),
                "updatedAt": iso(item.updated_at),
            }
            for item in found
        ]
        echo_json({**_ids(scope), "items": items, "limit": limit, "offset": offset})
        return
    rows = [(joined(i.namespace), i.key, _when(i.updated_at), i.chars, i.version) for i in found]
    echo_table(("NAMESPACE", "KEY", "UPDATED", "CHARS", "VERSION"), rows)
    shown = f"{offset + 1}-{offset + len(found)}" if found else "none"
    click.echo(f"showing {shown} of the store items of {_label(scope)}")


@store.command("show")
@item_namespace
@item_key
@user_option
@agent_option
@tenant_option
@json_option
def show_command(
    namespace: Namespace,
    key: str,
    user_id: str,
    agent_name: str | None,
    tenant_id: str | None,
    as_json: bool,
) -> None:
    """Print a live item's value as JSON (its version and times go to stderr, so `> FILE` keeps
    the value alone). Exits with 4 when the item is not stored or was deleted."""
    scope = _scope(user_id, agent_name, tenant_id)
    item = item_reads().get_item(scope, namespace, key)
    if item is None:
        _nothing(scope, namespace, key, "store item")
    if as_json:
        echo_json(
            {
                **_ids(scope),
                "namespace": list(namespace),
                "key": key,
                "version": item.version,
                "createdAt": iso(item.created_at),
                "updatedAt": iso(item.updated_at),
                "value": item.value,
            }
        )
        return
    heading = one_line(f"{joined(namespace)} / {key}")
    click.echo(
        f"{heading} of {_label(scope)}: version {item.version}, created {_when(item.created_at)}, "
        f"updated {_when(item.updated_at)}",
        err=True,
    )
    click.echo(_safe(json.dumps(item.value, ensure_ascii=False, indent=2)))


@store.command("history")
@item_namespace
@item_key
@user_option
@agent_option
@tenant_option
@json_option
def history_command(
    namespace: Namespace,
    key: str,
    user_id: str,
    agent_name: str | None,
    tenant_id: str | None,
    as_json: bool,
) -> None:
    """An item's puts and deletes, the newest first (the newest 20 are kept; a deleted item's stay
    until its tombstone is purged). Exits with 4 when there is none."""
    scope = _scope(user_id, agent_name, tenant_id)
    changes = item_reads().history(scope, namespace, key)
    if not changes:
        _nothing(scope, namespace, key, "history of store item")
    if as_json:
        entries = [
            {"version": c.version, "op": c.op, "changedAt": iso(c.changed_at), "value": c.value}
            for c in changes
        ]
        echo_json({**_ids(scope), "namespace": list(namespace), "key": key, "history": entries})
        return
    rows = [(c.version, c.op, _when(c.changed_at), _preview(c.value)) for c in changes]
    echo_table(("VERSION", "OP", "CHANGED", "VALUE"), rows)


def _preview(value: dict[str, Any] | None) -> str:
    if value is None:
        return "-"
    text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"


def _safe(text: str) -> str:
    """On a terminal, without control and format characters (but newline), so a stored value
    cannot move the cursor, restyle or reorder the screen; elsewhere as it is."""
    if not sys.stdout.isatty():
        return text
    return "".join(c for c in text if c == "\n" or unicodedata.category(c) not in ("Cc", "Cf"))
