"""``memstore mcp``: the memory tools for any MCP client, over stdio or streamable HTTP.

Identity is the operator's decision, never the client's: ``--user`` fixes the user (the only
choice on stdio, where the client is whoever started the process), and over HTTP
``--user-header`` takes it from a header that an authenticating reverse proxy sets. The tenant
and roles likewise: ``--tenant`` and ``--roles``, or over HTTP ``--tenant-header`` and
``--roles-header``. The trust
model is in ``docs/integrations.md``.
"""

from __future__ import annotations

from typing import Literal

import click

from memstore.cli.listening import ALLOWED_HOST, allowed_hosts_or_fail, header_name, listen
from memstore.cli.params import TENANT_OPTION, agent_name_option, roles_option, strict_user_id
from memstore.storage.loader import get_memory_storage

DEFAULT_MCP_PORT = 8001  # next to memstore serve's 8000, so both can run on one host


@click.command()
@click.option(
    "--transport",
    type=click.Choice(["stdio", "http"]),
    default="stdio",
    show_default=True,
    help="stdio: the client runs this command; http: streamable HTTP at /mcp.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="HTTP: address.")
@click.option(
    "--port",
    default=DEFAULT_MCP_PORT,
    show_default=True,
    type=click.IntRange(1, 65535),
    help="HTTP: port.",
)
@click.option("--user", "user_id", callback=strict_user_id, help="Every tool call acts as this user.")
@click.option(
    "--user-header",
    callback=header_name,
    help="HTTP: take the user from this request header (through make_safe_user_id). Only behind a "
    "reverse proxy that authenticates callers and replaces any copy a client sent.",
)
@click.option(
    "--agent",
    "agent_name",
    callback=agent_name_option,
    help="Use this agent's memory instead of the user's own.",
)
@TENANT_OPTION
@click.option("--tenant-header", callback=header_name, help="HTTP: take the tenant from this request header.")
@click.option("--roles", "roles", callback=roles_option, help="Every tool call has these roles (a,b).")
@click.option(
    "--roles-header",
    callback=header_name,
    help="HTTP: take the roles from this request header, comma-separated (absent: none).",
)
@ALLOWED_HOST
def mcp(
    transport: Literal["stdio", "http"],
    host: str,
    port: int,
    user_id: str | None,
    user_header: str | None,
    agent_name: str | None,
    tenant_id: str | None,
    tenant_header: str | None,
    roles: frozenset[str] | None,
    roles_header: str | None,
    allowed_hosts: tuple[str, ...],
) -> None:
    """Serve the memory tools over MCP (needs the 'mcp' extra): memory_search, memory_add,
    memory_update, memory_delete, memory_context, the session_* tools and the agent's memory
    files (memory_ls, memory_read_file, memory_write_file, memory_edit_file, memory_delete_file)."""
    if (user_id is None) == (user_header is None):
        raise click.UsageError(
            "say who the caller is: --user ID (one user's memory) or, with --transport http, "
            "--user-header NAME (a header set by an authenticating reverse proxy)"
        )
    for given, name in (
        (user_header, "--user-header"),
        (tenant_header, "--tenant-header"),
        (roles_header, "--roles-header"),
    ):
        if given is not None and transport == "stdio":
            raise click.UsageError(f"{name} needs --transport http: stdio carries no headers")
    if (tenant_header is not None or roles_header is not None) and user_header is None:
        raise click.UsageError("--tenant-header and --roles-header need --user-header")
    if tenant_id is not None and tenant_header is not None:
        raise click.UsageError("--tenant and --tenant-header exclude each other")
    if roles is not None and roles_header is not None:
        raise click.UsageError("--roles and --roles-header exclude each other")
    try:
        import uvicorn

        from memstore.integrations.mcp import (
            MCP_PATH,
            create_mcp_http_app,
            create_mcp_server,
            fixed_identity,
            header_identity,
        )
    except ImportError as exc:
        raise click.ClickException(
            f"memstore mcp needs the MCP SDK: pip install 'memstore[mcp]' ({exc})"
        ) from exc

    identity = (
        fixed_identity(user_id, tenant_id=tenant_id, roles=roles)
        if user_id is not None
        else header_identity(
            str(user_header),
            tenant_header=tenant_header,
            roles_header=roles_header,
            tenant_id=tenant_id,
            roles=roles,
        )
    )
    server = create_mcp_server(identity, agent_name=agent_name)
    get_memory_storage()  # fail now, with one line, on a bad database or storage setting
    if transport == "stdio":
        server.run("stdio")  # stdout is the protocol's: nothing else may be printed there
        return
    hosts = allowed_hosts_or_fail(host, allowed_hosts)
    app = create_mcp_http_app(
        server, allowed_hosts=hosts, user_header=user_header, tenant_header=tenant_header
    )
    listener = listen(host, port)
    who = (
        f"every call acts as user {user_id!r}"
        if user_id is not None
        else f"the user is taken from the {user_header} header; anyone who can reach this port without "
        "going through your reverse proxy can claim any user"
    )
    click.echo(f"memstore: MCP at http://{host}:{port}{MCP_PATH}; {who}; accepting Host {', '.join(hosts)}")
    uvicorn.Server(uvicorn.Config(app, host=host, port=port)).run(sockets=[listener])
