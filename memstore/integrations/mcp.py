"""memstore as an MCP server: any MCP client can search, add, update and delete facts, fetch the
memory context for a query, keep a conversation's short-term session memory, and let the agent
keep its own memory documents under ``/memories/`` (``mcp_agent_docs.py``).

Built on the official ``mcp`` SDK (``MCPServer``, the SDK's own high-level server): it is the
protocol's reference implementation, moves with the specification, and brings only what the
stdio and streamable HTTP transports need; FastMCP would add a second framework on top of it.

Each tool is a thin wrapper over the tool-mode function of the same name (``gateway.tools``, and
``gateway.session_tools`` for the ``session_*`` tools), so validation, caps, descriptions and
error wording are tool mode's. The wrappers exist for the scope: the user, tenant and roles come
from the server's ``CallerOf`` (a fixed ``--user``, ``--tenant``, ``--roles``, or the headers an
authenticating proxy sets), never from a tool argument, so a model cannot name another user,
tenant or role.
A tool-mode ``{"error": ...}`` becomes an MCP tool error (``isError``) with the same text.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from importlib.metadata import version
from inspect import getdoc
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import Field
from starlette.datastructures import Headers
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from memstore.document import DEFAULT_CATEGORY, MANUAL_CONFIDENCE
from memstore.gateway import session_tools, tools
from memstore.integrations.identity import (
    IdentityHeaderError,
    roles_from_header,
    tenant_from_header,
    user_from_header,
)
from memstore.integrations.mcp_agent_docs import add_agent_doc_tools
from memstore.ops.facts import Visibility
from memstore.ops.record_fields import MemoryType, SourceKind
from memstore.ops.validation import MAX_GRANTS
from memstore.record import MAX_RAW_CHARS, MAX_TAGS
from memstore.scope import Identity, normalize_agent_name
from memstore.session import MAX_TURNS_PER_APPEND
from memstore.storage.records import SearchMode

MCP_PATH = "/mcp"
# Tool arguments are short (a fact is at most 2,000 characters); the SDK's default is 4 MiB.
MAX_MCP_BODY_BYTES = 256 * 1024

CallerOf = Callable[[Context], Identity]
# Checked before tool mode sees them, as the HTTP API checks its query: no "5", no true for 1.
Limit = Annotated[int, Field(strict=True, ge=1, le=100)]
Confidence = Annotated[float, Field(strict=True, ge=0.0, le=1.0)]
"""A number from 0 to 1: a confidence, or an importance."""
Grantees = Annotated[list[str], Field(max_length=MAX_GRANTS)]
Tags = Annotated[list[str], Field(max_length=MAX_TAGS)]
Raw = Annotated[str, Field(max_length=MAX_RAW_CHARS)]
Turns = Annotated[list[dict[str, Any]], Field(min_length=1, max_length=MAX_TURNS_PER_APPEND)]
MaxTokens = Annotated[int, Field(strict=True, ge=1, le=session_tools.MAX_CONTEXT_TOKENS)]
Offset = Annotated[int, Field(strict=True, ge=0, le=session_tools.MAX_LIST_OFFSET)]

INSTRUCTIONS = (
    "Long-term memory about the user. Call memory_context with the user's message to get what is "
    "known about them; memory_search to find facts; memory_add, memory_update and memory_delete "
    "to keep them true. Short-term memory of a conversation: session_append its turns as they "
    "happen, session_context to get it back (older turns summarised), session_clear to forget it. "
    "Your own memory as an agent (your role, what you learned about the work): Markdown documents "
    "under /memories/, /memories/agent.md first; memory_ls and memory_read_file show them, "
    "memory_edit_file and memory_write_file keep them current (pass the version you read), "
    "memory_delete_file removes one."
)


def fixed_identity(
    user_id: str, *, tenant_id: str | None = None, roles: Iterable[str] | None = None
) -> CallerOf:
    """Every call acts as ``user_id`` in ``tenant_id`` with ``roles`` (stdio, or HTTP reachable only
    by that user)."""
    identity = Identity.of(user_id, tenant_id=tenant_id, roles=roles)

    def fixed(_ctx: Context) -> Identity:
        return identity

    return fixed


def header_identity(
    name: str,
    *,
    tenant_header: str | None = None,
    roles_header: str | None = None,
    tenant_id: str | None = None,
    roles: Iterable[str] | None = None,
) -> CallerOf:
    """Each call acts as the user named by header ``name`` of the HTTP request that carried it, in
    the tenant of ``tenant_header`` (else ``tenant_id``) with the roles of ``roles_header`` (else
    ``roles``)."""
    fixed = Identity.of(None, tenant_id=tenant_id, roles=roles)

    def from_header(ctx: Context) -> Identity:
        headers = ctx.headers
        if not isinstance(headers, Headers):  # stdio: no HTTP request behind the call
            raise ToolError(f"no {name} header: this transport carries no HTTP headers")
        try:
            return Identity(
                tenant_from_header(tenant_header, headers.getlist(tenant_header))
                if tenant_header is not None
                else fixed.tenant_id,
                user_from_header(name, headers.getlist(name)),
                roles_from_header(roles_header, headers.getlist(roles_header))
                if roles_header is not None
                else fixed.roles,
            )
        except IdentityHeaderError as exc:
            raise ToolError(exc.detail) from exc

    return from_header


def _scope(identity: Identity) -> dict[str, Any]:
    """The tool-mode keywords for ``identity``."""
    return {"user_id": identity.user_id, "tenant_id": identity.tenant_id, "roles": identity.roles}


def _session_scope(identity: Identity) -> dict[str, Any]:
    """The session tools' keywords for ``identity`` (roles decide nothing about a session)."""
    return {"user_id": identity.user_id, "tenant_id": identity.tenant_id}


def _answer(result: str) -> dict[str, Any]:
    payload: dict[str, Any] = json.loads(result)
    if "error" in payload:
        raise ToolError(str(payload["error"]))
    return payload


def create_mcp_server(identity: CallerOf, *, agent_name: str | None = None) -> MCPServer:
    """The memory, session and memory-document tools over ``identity``'s user (in its tenant, with its
    roles) and the given agent's memory, sessions and documents."""
    agent_name = normalize_agent_name(agent_name)  # a bad name fails here, not on every call
    server: MCPServer = MCPServer(
        "memstore", version=version("memstore"), instructions=INSTRUCTIONS, log_level="WARNING"
    )

    def memory_search(
        query: str,
        ctx: Context,
        category: str | None = None,
        limit: Limit = 10,
        mode: SearchMode | None = None,
    ) -> dict[str, Any]:
        scope = _scope(identity(ctx))
        return _answer(tools.memory_search(query, category, limit, agent_name=agent_name, mode=mode, **scope))

    def memory_add(
        content: str,
        ctx: Context,
        category: str = DEFAULT_CATEGORY,
        confidence: Confidence = MANUAL_CONFIDENCE,
        visibility: Visibility = "private",
        allowed_users: Grantees | None = None,
        allowed_roles: Grantees | None = None,
        memory_type: MemoryType | None = None,
        importance: Confidence | None = None,
        tags: Tags | None = None,
        source_kind: SourceKind | None = None,
        raw: Raw | None = None,
        structured: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        scope = _scope(identity(ctx))
        return _answer(
            tools.memory_add(
                content,
                category,
                confidence,
                visibility,
                allowed_users,
                allowed_roles,
                memory_type,
                importance,
                tags,
                source_kind,
                raw,
                structured,
                agent_name=agent_name,
                **scope,
            )
        )

    def memory_update(
        fact_id: str,
        ctx: Context,
        content: str | None = None,
        category: str | None = None,
        confidence: Confidence | None = None,
        visibility: Visibility | None = None,
        allowed_users: Grantees | None = None,
        allowed_roles: Grantees | None = None,
        memory_type: MemoryType | None = None,
        importance: Confidence | None = None,
        tags: Tags | None = None,
        source_kind: SourceKind | None = None,
        raw: Raw | None = None,
        structured: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        scope = _scope(identity(ctx))
        return _answer(
            tools.memory_update(
                fact_id,
                content,
                category,
                confidence,
                visibility,
                allowed_users,
                allowed_roles,
                memory_type,
                importance,
                tags,
                source_kind,
                raw,
                structured,
                agent_name=agent_name,
                **scope,
            )
        )

    def memory_delete(fact_id: str, ctx: Context) -> dict[str, Any]:
        return _answer(tools.memory_delete(fact_id, agent_name=agent_name, **_scope(identity(ctx))))

    def memory_context(query: str, ctx: Context) -> dict[str, Any]:
        return _answer(tools.memory_context(query, agent_name=agent_name, **_scope(identity(ctx))))

    def session_append(session_id: str, turns: Turns, ctx: Context) -> dict[str, Any]:
        scope = _session_scope(identity(ctx))
        return _answer(session_tools.session_append(session_id, turns, agent_name=agent_name, **scope))

    def session_context(session_id: str, ctx: Context, max_tokens: MaxTokens | None = None) -> dict[str, Any]:
        scope = _session_scope(identity(ctx))
        return _answer(session_tools.session_context(session_id, max_tokens, agent_name=agent_name, **scope))

    def session_clear(session_id: str, ctx: Context) -> dict[str, Any]:
        scope = _session_scope(identity(ctx))
        return _answer(session_tools.session_clear(session_id, agent_name=agent_name, **scope))

    def session_list(ctx: Context, limit: Limit = 20, offset: Offset = 0) -> dict[str, Any]:
        return _answer(session_tools.session_list(limit, offset, **_session_scope(identity(ctx))))

    for wrapper, shared in (
        (memory_search, tools.memory_search),
        (memory_add, tools.memory_add),
        (memory_update, tools.memory_update),
        (memory_delete, tools.memory_delete),
        (memory_context, tools.memory_context),
        (session_append, session_tools.session_append),
        (session_context, session_tools.session_context),
        (session_clear, session_tools.session_clear),
        (session_list, session_tools.session_list),
    ):
        server.add_tool(wrapper, name=shared.__name__, description=getdoc(shared))
    add_agent_doc_tools(server, identity, agent_name)
    return server


def create_mcp_http_app(
    server: MCPServer,
    *,
    allowed_hosts: Sequence[str],
    user_header: str | None,
    tenant_header: str | None = None,
) -> ASGIApp:
    """The streamable HTTP app at ``/mcp``, refusing in this order what ``memstore serve`` refuses:

    a ``Host`` it does not serve (400, DNS rebinding), then, with ``user_header``, a request
    without exactly one non-blank copy of it (401 or 400); then the SDK's own checks: a browser
    ``Origin`` of another site (403), a body over ``MAX_MCP_BODY_BYTES`` (413). Stateless: every
    request stands alone, so a session id is nothing another caller could take over, and any
    replica can answer it.
    """
    app: ASGIApp = server.streamable_http_app(
        streamable_http_path=MCP_PATH,
        stateless_http=True,
        max_request_body_size=MAX_MCP_BODY_BYTES,
        transport_security=_transport_security(allowed_hosts),
    )
    if user_header is not None:
        app = RequireIdentityHeader(app, user_header)
    if tenant_header is not None:
        app = RequireIdentityHeader(app, tenant_header, tenant_from_header)
    return TrustedHostMiddleware(app, allowed_hosts=list(allowed_hosts), www_redirect=False)


def _transport_security(allowed_hosts: Sequence[str]) -> TransportSecuritySettings:
    """The SDK's DNS-rebinding check (Host and Origin) for the same names; ``'*'`` turns it off."""
    if "*" in allowed_hosts:
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[form for host in allowed_hosts for form in (host, f"{host}:*")],
        allowed_origins=[
            form
            for host in allowed_hosts
            for scheme in ("http", "https")
            for form in (f"{scheme}://{host}", f"{scheme}://{host}:*")
        ],
    )


class RequireIdentityHeader:
    """Refuse an HTTP request that lacks exactly one valid, non-blank copy of an identity header
    (the user's, or the tenant's with ``tenant_from_header``)."""

    def __init__(
        self, app: ASGIApp, name: str, check: Callable[[str, Sequence[str]], object] = user_from_header
    ) -> None:
        self.app = app
        self.name = name
        self.check = check

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            try:
                self.check(self.name, Headers(scope=scope).getlist(self.name))
            except IdentityHeaderError as exc:
                await JSONResponse({"detail": exc.detail}, status_code=exc.status_code)(scope, receive, send)
                return
        await self.app(scope, receive, send)
