"""``memstore facts show ID``: one fact with every field of its record and its relations both ways."""

from __future__ import annotations

import json
from typing import Any

import click

from memstore.cli.exit_codes import EXIT_NOTHING_MATCHED
from memstore.cli.output import echo_json, user_id_option
from memstore.cli.params import TENANT_OPTION, agent_name_option, not_blank
from memstore.ops.view import one_line
from memstore.queries import ANY_AGENT, FactFilter, FactRecord, FactRelations, fact_relations, list_facts
from memstore.storage.records import MAX_PAGE_SIZE, AgentFilter, iso


@click.command("show")
@click.argument("fact_id", callback=not_blank)
@click.option("--user", "user_id", callback=user_id_option, help="Only this user's fact.")
@click.option("--agent", "agent_name", callback=agent_name_option, help="Only this agent's memory.")
@click.option("--no-agent", is_flag=True, help="Only the users' own memory (no agent).")
@TENANT_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print the facts and their relations as JSON.")
def show_fact(
    fact_id: str,
    user_id: str | None,
    agent_name: str | None,
    no_agent: bool,
    tenant_id: str | None,
    as_json: bool,
) -> None:
    """Show the live fact FACT_ID: its fields, scores and relations both ways.

    An id is unique within one scope (user and agent); without --user and --agent every scope
    holding a fact with this id is shown. Exits with 4 when none does.
    """
    if no_agent and agent_name:
        raise click.UsageError("--agent and --no-agent exclude each other")
    agent: AgentFilter = None if no_agent else agent_name if agent_name else ANY_AGENT
    where = FactFilter(user_id=user_id, agent_name=agent, fact_id=fact_id)
    page = list_facts(where, limit=MAX_PAGE_SIZE, tenant_id=tenant_id)
    # A named user's filter also reads others' shared facts: show the user's own only.
    found = [fact for fact in page.facts if user_id is None or fact.user_id == user_id]
    if not found:
        click.echo(f"no live fact {fact_id!r} matches", err=True)
        raise SystemExit(EXIT_NOTHING_MATCHED)
    shown = [
        (fact, fact_relations(fact_id, fact.agent_name, user_id=fact.user_id, tenant_id=tenant_id))
        for fact in found
    ]
    if as_json:
        echo_json({"facts": [{**fact.to_json(), "relations": rel.to_json()} for fact, rel in shown]})
        return
    for index, (fact, relations) in enumerate(shown):
        if index:
            click.echo("")
        for line in _lines(fact, relations):
            click.echo(line)


def _lines(fact: FactRecord, relations: FactRelations) -> list[str]:
    owner = f"{fact.user_id or '-'} / {fact.agent_name or '-'}"
    fields: list[tuple[str, Any]] = [
        ("content", fact.content),
        ("category", fact.category),
        ("type", fact.memory_type),
        ("confidence", f"{fact.confidence:.2f}"),
        ("importance", f"{fact.importance:.2f}"),
        ("tags", ", ".join(fact.tags) or "-"),
        ("source", fact.source or "-"),
        ("source kind", fact.source_kind),
        ("created", iso(fact.created_at) or "-"),
        ("version", fact.version),
        ("score", "-" if fact.score is None else f"{fact.score:.3f}"),
        ("decay", "-" if fact.decay is None else f"{fact.decay:.3f}"),
        ("accesses", fact.access_count),
        ("last access", iso(fact.last_accessed_at) or "-"),
        ("confirmed", iso(fact.last_confirmed_at) or "-"),
    ]
    if fact.raw is not None:
        fields.append(("raw", fact.raw))
    if fact.structured is not None:
        fields.append(("structured", json.dumps(fact.structured, ensure_ascii=False)))
    lines = [f"fact {one_line(fact.fact_id)} of {one_line(owner)} ({fact.visibility})"]
    lines += [f"  {name + ':':<13}{one_line(str(value))}" for name, value in fields]
    lines.append(f"relations ({len(relations.outgoing) + len(relations.incoming)}):")
    for relation in relations.outgoing:
        gone = "" if relation.live else " (deleted)"
        lines.append(f"  this {relation.kind} {one_line(relation.fact_id)}{gone}")
    for relation in relations.incoming:
        gone = "" if relation.live else " (deleted)"
        lines.append(f"  {one_line(relation.fact_id)}{gone} {relation.kind} this")
    return lines
