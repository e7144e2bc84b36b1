"""``memstore sessions list|show|clear``: a user's short-term session memory (issue 33).

Sessions live where ``session_backend`` says: the memory database or Redis, both of which this
command reaches; with ``memory`` they live in each server's own process and the command refuses,
since it could only show its own, empty, memory.
"""

from __future__ import annotations

from typing import NoReturn

import click

from memstore.cli.confirm import confirm_deletion, yes_option
from memstore.cli.exit_codes import EXIT_NOTHING_MATCHED
from memstore.cli.output import CliError, echo_json, echo_table, user_id_option
from memstore.cli.params import TENANT_OPTION, agent_name_option
from memstore.config import get_memory_config
from memstore.errors import InvalidScopeError
from memstore.gateway.session_tools import MAX_CONTEXT_TOKENS, MAX_LIST_OFFSET
from memstore.ops.sessions import (
    MAX_LIST_LIMIT,
    clear_session,
    info_dict,
    list_sessions,
    read_session,
    session_context,
    turn_dict,
)
from memstore.scope import DEFAULT_TENANT_ID
from memstore.session import SessionInfo, validate_session_id
from memstore.storage.records import iso
from memstore.storage.sessions.loader import session_backend


def session_id_argument(_ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        return validate_session_id(value)
    except InvalidScopeError as exc:
        raise click.BadParameter(str(exc), param=param) from exc


session_argument = click.argument("session_id", callback=session_id_argument)
user_option = click.option("--user", "user_id", callback=user_id_option, required=True, help="User id.")
agent_option = click.option(
    "--agent",
    "agent_name",
    callback=agent_name_option,
    help="The agent the session is with (default: none, the user's own).",
)


def _reachable() -> None:
    """Refuse ``session_backend: memory``: those sessions are in the servers' processes, not here."""
    if session_backend(get_memory_config()) == "memory":
        raise CliError(
            "session_backend is memory: sessions live in each server's own process, out of this "
            "command's reach (set session_backend to database or redis to share them)"
        )


def _label(user_id: str, agent_name: str | None) -> str:
    return user_id if agent_name is None else f"{user_id} / agent {agent_name}"


def _nothing(session_id: str, user_id: str, agent_name: str | None) -> NoReturn:
    click.echo(f"no session {session_id!r} of {_label(user_id, agent_name)} (check the ids)", err=True)
    raise SystemExit(EXIT_NOTHING_MATCHED)


@click.group()
def sessions() -> None:
    """List, show or clear users' short-term session memory (the recent turns of a conversation)."""


@sessions.command("list")
@user_option
@TENANT_OPTION
@click.option(
    "--limit", type=click.IntRange(1, MAX_LIST_LIMIT), default=100, show_default=True, help="Page size."
)
@click.option(
    "--offset",
    type=click.IntRange(0, MAX_LIST_OFFSET),
    default=0,
    show_default=True,
    help="Sessions to skip, for paging.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the page as JSON.")
def list_command(user_id: str, tenant_id: str | None, limit: int, offset: int, as_json: bool) -> None:
    """The user's live sessions with every agent, the most recently active first."""
    _reachable()
    found = list_sessions(user_id, tenant_id=tenant_id or DEFAULT_TENANT_ID, limit=limit, offset=offset)
    if as_json:
        echo_json({"sessions": [info_dict(info) for info in found], "limit": limit, "offset": offset})
        return
    rows = [
        (
            info.key.session_id,
            info.key.agent_name or "-",
            info.turn_count,
            info.token_count,
            info.compressions,
            (iso(info.updated_at) or "")[:19],
            (iso(info.expires_at) or "")[:19],
        )
        for info in found
    ]
    echo_table(("SESSION", "AGENT", "TURNS", "TOKENS", "COMPRESSIONS", "UPDATED", "EXPIRES"), rows)
    shown = f"{offset + 1}-{offset + len(found)}" if found else "none"
    click.echo(f"showing {shown} of the sessions of {user_id}")


@sessions.command("show")
@session_argument
@user_option
@agent_option
@TENANT_OPTION
@click.option(
    "--context",
    "as_context",
    is_flag=True,
    help="Show what the next prompt would get: the summary, then the newest turns within --max-tokens.",
)
@click.option(
    "--max-tokens",
    type=click.IntRange(1, MAX_CONTEXT_TOKENS),
    help="With --context: the token budget [default: the session_context_max_tokens setting].",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print the session and its turns (or the context) as JSON."
)
def show_command(
    session_id: str,
    user_id: str,
    agent_name: str | None,
    tenant_id: str | None,
    as_context: bool,
    max_tokens: int | None,
    as_json: bool,
) -> None:
    """Show one session: its bookkeeping and every stored turn (a summary first), or, with
    --context, the messages the next prompt would get.

    Exits with 4 when the session is not stored (or has expired), so a mistyped id is not
    mistaken for an empty session.
    """
    if max_tokens is not None and not as_context:
        raise click.UsageError("--max-tokens needs --context")
    _reachable()
    tenant = tenant_id or DEFAULT_TENANT_ID
    info, turns = read_session(user_id, session_id, agent_name=agent_name, tenant_id=tenant)
    if info is None:
        _nothing(session_id, user_id, agent_name)
    if as_context:
        context = session_context(
            user_id, session_id, agent_name=agent_name, tenant_id=tenant, max_tokens=max_tokens
        )
        if as_json:
            echo_json(
                {
                    "messages": context.messages,
                    "summary": context.summary,
                    "omitted": context.omitted,
                    "tokens": context.tokens,
                }
            )
            return
        echo_table(
            ("ROLE", "CONTENT"), [(message["role"], message["content"]) for message in context.messages]
        )
        click.echo(
            f"{len(context.messages)} message(s), {context.tokens} tokens; "
            f"{context.omitted} older turn(s) left out by the budget"
        )
        return
    if as_json:
        echo_json({"session": info_dict(info), "turns": [turn_dict(turn) for turn in turns]})
        return
    click.echo(_heading(info))
    rows = [
        (
            turn.seq,
            "summary" if turn.summary else turn.role,
            turn.tokens,
            (iso(turn.created_at) or "")[:19],
            turn.content,
        )
        for turn in turns
    ]
    echo_table(("SEQ", "ROLE", "TOKENS", "CREATED", "CONTENT"), rows)


def _heading(info: SessionInfo) -> str:
    who = _label(str(info.key.user_id), info.key.agent_name)
    return (
        f"session {info.key.session_id} of {who}: {info.turn_count} turn(s), {info.token_count} tokens, "
        f"{info.compressions} compression(s); updated {(iso(info.updated_at) or '')[:19]}, "
        f"expires {(iso(info.expires_at) or '')[:19]}"
    )


@sessions.command("clear")
@session_argument
@user_option
@agent_option
@TENANT_OPTION
@yes_option
def clear_command(
    session_id: str, user_id: str, agent_name: str | None, tenant_id: str | None, yes: bool
) -> None:
    """Delete one session: its turns and summary. Long-term facts learned from it stay.

    Exits with 4 when there was no such session (usually a mistyped id).
    """
    question = f"Clear session {session_id!r} of {_label(user_id, agent_name)}? This cannot be undone"
    confirm_deletion("clear a session", question, yes=yes)
    _reachable()
    if not clear_session(
        user_id, session_id, agent_name=agent_name, tenant_id=tenant_id or DEFAULT_TENANT_ID
    ):
        _nothing(session_id, user_id, agent_name)
    click.echo(f"cleared session {session_id} of {_label(user_id, agent_name)}")
