"""``memstore facts list|search|show``: facts across users and agents, filtered, paged."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, cast

import click

from memstore.cli.fact_show import show_fact
from memstore.cli.output import echo_json, echo_table, user_id_option
from memstore.cli.params import (
    FRACTION,
    OFFSET,
    PAGE_SIZE,
    TAG,
    TENANT_OPTION,
    agent_name_option,
    not_blank,
)
from memstore.document import FACT_CATEGORIES, VISIBILITIES, as_utc
from memstore.queries import ANY_AGENT, FactFilter, FactPage, list_facts, search_facts
from memstore.record import MEMORY_TYPES, SOURCE_KINDS
from memstore.storage.records import FACT_ORDERS, SEARCH_MODES, AgentFilter, FactOrder, SearchMode, iso
from memstore.storage.search_text import SEARCH_MATCHES, SearchMatch

_DATE_FORMATS = ["%Y-%m-%d", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M:%S%z"]


def filter_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The filter flags shared by ``list`` and ``search``."""
    options = [
        click.option("--user", "user_id", callback=user_id_option, help="Only this user's facts."),
        TENANT_OPTION,
        click.option("--agent", "agent_name", callback=agent_name_option, help="Only this agent's memory."),
        click.option("--no-agent", is_flag=True, help="Only the users' own memory (no agent)."),
        click.option("--category", help="Only this category (preference, knowledge, context, ...)."),
        click.option("--min-confidence", type=FRACTION, help="Only facts at or above this confidence."),
        click.option("--text", help="Only facts containing this text (case-insensitive)."),
        click.option(
            "--visibility", type=click.Choice(VISIBILITIES), help="Only private, shared or public facts."
        ),
        click.option(
            "--type", "memory_type", type=click.Choice(MEMORY_TYPES), help="Only facts of this memory type."
        ),
        click.option("--tag", type=TAG, help="Only facts carrying this tag."),
        click.option("--min-importance", type=FRACTION, help="Only facts at or above this importance."),
        click.option(
            "--source-kind", type=click.Choice(SOURCE_KINDS), help="Only facts of this source kind."
        ),
        click.option(
            "--since", type=click.DateTime(_DATE_FORMATS), help="Created at or after (UTC unless given)."
        ),
        click.option(
            "--until", type=click.DateTime(_DATE_FORMATS), help="Created before (UTC unless given)."
        ),
        click.option("--limit", type=PAGE_SIZE, default=50, show_default=True, help="Page size."),
        click.option("--offset", type=OFFSET, default=0, show_default=True, help="Rows to skip, for paging."),
        click.option("--json", "as_json", is_flag=True, help="Print the page as JSON."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


@click.group()
def facts() -> None:
    """List, search or show facts across users and agents."""


@facts.command("list")
@filter_options
@click.option(
    "--sort",
    type=click.Choice([order.replace("_", "-") for order in FACT_ORDERS]),
    default="newest",
    show_default=True,
    help="Order: newest first, or highest retention score, latest access, most accesses first.",
)
@click.option(
    "--retention",
    "show_retention",
    is_flag=True,
    help="Show each fact's retention and decay scores, accesses and last confirmation (implied by --sort).",
)
def list_command(
    limit: int,
    offset: int,
    as_json: bool,
    sort: str,
    show_retention: bool,
    tenant_id: str | None,
    **filters: Any,
) -> None:
    """List facts, newest first unless --sort says otherwise."""
    order = cast(FactOrder, sort.replace("-", "_"))
    page = list_facts(_filter(**filters), limit=limit, offset=offset, order=order, tenant_id=tenant_id)
    _print(page, as_json=as_json, retention=show_retention or order != "newest")


@facts.command("search")
@click.argument("query", callback=not_blank)
@click.option(
    "--mode",
    type=click.Choice(SEARCH_MODES),
    default="fulltext",
    show_default=True,
    help="fulltext: words, ranked by BM25; semantic: nearest by meaning; hybrid: both, fused "
    "(semantic and hybrid need embedding_provider).",
)
@click.option(
    "--match",
    type=click.Choice(SEARCH_MATCHES),
    default=None,
    help="Whether a full-text hit needs any word of QUERY (function words aside) or all of them "
    "[default: the fulltext_match setting, any].",
)
@filter_options
def search_command(
    query: str,
    mode: str,
    match: str | None,
    limit: int,
    offset: int,
    as_json: bool,
    tenant_id: str | None,
    **filters: Any,
) -> None:
    """Search facts for QUERY, most relevant first.

    QUERY is plain text: quotes, hyphens and words like OR or NOT are matched, never parsed.
    """
    page = search_facts(
        query,
        _filter(**filters),
        mode=cast(SearchMode, mode),
        match=cast(SearchMatch | None, match),
        limit=limit,
        offset=offset,
        tenant_id=tenant_id,
    )
    _print(page, as_json=as_json)


def _filter(
    user_id: str | None,
    agent_name: str | None,
    no_agent: bool,
    category: str | None,
    min_confidence: float | None,
    text: str | None,
    since: datetime | None,
    until: datetime | None,
    visibility: str | None,
    memory_type: str | None,
    tag: str | None,
    min_importance: float | None,
    source_kind: str | None,
) -> FactFilter:
    if no_agent and agent_name:
        raise click.UsageError("--agent and --no-agent exclude each other")
    if since and until and as_utc(since) > as_utc(until):
        raise click.UsageError("--since is later than --until: no fact can match")
    agent: AgentFilter = None if no_agent else agent_name if agent_name else ANY_AGENT
    if category is not None and category not in FACT_CATEGORIES:
        # Not an error: facts from an LLM or an import may carry categories of their own.
        click.echo(
            f"note: {category!r} is not one of the categories memstore writes "
            f"({', '.join(FACT_CATEGORIES)}); only facts that carry it exactly are shown",
            err=True,
        )
    return FactFilter(
        user_id=user_id,
        agent_name=agent,
        category=category,
        min_confidence=min_confidence,
        text=text,
        created_after=since,
        created_before=until,
        visibility=visibility,
        memory_type=memory_type,
        tag=tag,
        min_importance=min_importance,
        source_kind=source_kind,
    )


def _print(page: FactPage, *, as_json: bool, retention: bool = False) -> None:
    if as_json:
        echo_json(page.to_json())
        return
    headers: tuple[str, ...] = ("USER", "AGENT", "ID", "CATEGORY", "CONF", "CREATED")
    if retention:
        headers += ("SCORE", "DECAY", "ACCESSES", "LAST ACCESS", "CONFIRMED")
    rows = []
    for fact in page.facts:
        row: tuple[Any, ...] = (
            fact.user_id or "-",
            fact.agent_name or "-",
            fact.fact_id,
            fact.category,
            fact.confidence,
            (iso(fact.created_at) or "")[:19],
        )
        if retention:
            row += (
                f"{fact.score:.3f}" if fact.score is not None else "-",
                f"{fact.decay:.3f}" if fact.decay is not None else "-",
                fact.access_count,
                (iso(fact.last_accessed_at) or "-")[:19],
                (iso(fact.last_confirmed_at) or "-")[:19],
            )
        rows.append((*row, fact.content))
    echo_table((*headers, "CONTENT"), rows)
    shown = f"{page.offset + 1}-{page.offset + len(page.facts)}" if page.facts else "none"
    note = " (substring matching: no full-text index served this query)"
    click.echo(f"showing {shown} of {page.total}{note if page.search_mode == 'substring' else ''}")


facts.add_command(show_fact)
