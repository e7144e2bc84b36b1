"""``memstore history``: the audit trail of one user's memory."""

from __future__ import annotations

import json
from typing import Any

import click

from memstore.cli.output import echo_json, echo_table, user_id_option
from memstore.cli.params import PAGE_SIZE, TENANT_OPTION, agent_name_option, not_blank
from memstore.queries import ANY_AGENT, FactFilter, memory_history
from memstore.storage.records import HistoryEntry, iso


@click.command()
@click.option("--user", "user_id", callback=user_id_option, required=True, help="User id.")
@click.option(
    "--agent",
    "agent_name",
    callback=agent_name_option,
    help="Only this agent's memory (default: all of the user's scopes).",
)
@click.option("--fact", "fact_id", callback=not_blank, help="Only the changes of this fact id.")
@click.option("--limit", type=PAGE_SIZE, default=100, show_default=True, help="Show the newest N changes.")
@TENANT_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print the entries, with before/after values, as JSON.")
def history(
    user_id: str,
    agent_name: str | None,
    fact_id: str | None,
    limit: int,
    tenant_id: str | None,
    as_json: bool,
) -> None:
    """Every change to the user's facts and summaries: when, which revision, by whom, before and after."""
    where = FactFilter(user_id=user_id, agent_name=agent_name if agent_name else ANY_AGENT)
    entries = memory_history(where, fact_id=fact_id, limit=limit, tenant_id=tenant_id)
    if as_json:
        echo_json([entry.to_json() for entry in entries])
        return
    rows = [
        (
            (iso(entry.changed_at) or "")[:19],
            entry.agent_name or "-",
            entry.revision,
            entry.entity,
            entry.entity_id,
            entry.action,
            entry.origin,
            _change(entry),
        )
        for entry in entries
    ]
    echo_table(("CHANGED", "AGENT", "REV", "ENTITY", "ID", "ACTION", "ORIGIN", "CHANGE"), rows)
    click.echo(f"{len(entries)} change(s)")


def _change(entry: HistoryEntry) -> str:
    """The changed text for people; ``--json`` has the full before/after values."""
    key = "content" if entry.entity == "fact" else "summary"
    before = (entry.before or {}).get(key)
    after = (entry.after or {}).get(key)
    if entry.action == "update" and before == after:
        changed = sorted(k for k in {*(entry.before or {}), *(entry.after or {})} if _differs(entry, k))
        return f"{after} ({', '.join(changed)} changed)"
    if entry.action == "update":
        return f"{before} -> {after}"
    if entry.action == "delete" and entry.detail:
        return f"{before} [{_reason(entry.detail)}]"
    return str(after if entry.action == "insert" else before)


def _reason(detail: dict[str, Any]) -> str:
    """``evicted, score 0.526`` and the like: why a fact went, in a few words."""
    reason = str(detail.get("reason", "removed"))
    if isinstance(detail.get("score"), float | int):
        return f"{reason}, score {detail['score']:.3f}"
    if reason == "consolidated" and detail.get("into"):
        return f"{reason} into {detail['into']}"
    if detail.get("llm_reason"):
        return f"{reason}: {detail['llm_reason']}"
    return reason


def _differs(entry: HistoryEntry, key: str) -> bool:
    before, after = (entry.before or {}).get(key), (entry.after or {}).get(key)
    return json.dumps(before, sort_keys=True) != json.dumps(after, sort_keys=True)
