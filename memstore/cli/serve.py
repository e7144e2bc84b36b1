"""``memstore serve``: the ``/api/memory`` HTTP API stand-alone, without a gateway around it.

A gateway mounts ``memstore.integrations.fastapi.create_memory_router`` behind its own
authentication. Stand-alone there is none, so the operator must say explicitly who the caller
is: one fixed user, or a header that a trusted reverse proxy sets. What the app refuses on its
own (foreign Host names, oversized bodies, repeated identity headers) is in ``serve_app.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import click

from memstore.cli.listening import ALLOWED_HOST, allowed_hosts_or_fail, header_name, listen
from memstore.cli.params import TENANT_OPTION, roles_option, strict_user_id
from memstore.document import MAX_DOCUMENT_BYTES
from memstore.storage.loader import get_memory_storage

T = TypeVar("T")


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535), help="Port.")
@click.option(
    "--user",
    "user_id",
    callback=strict_user_id,
    help="Serve this one user's memory: every request acts as this user.",
)
@click.option(
    "--user-header",
    callback=header_name,
    help="Take the user from this request header (external ids pass through make_safe_user_id). "
    "Only behind a reverse proxy that authenticates callers and replaces any copy a client sent.",
)
@TENANT_OPTION
@click.option(
    "--tenant-header",
    callback=header_name,
    help="Take the tenant from this request header (set by the proxy; an invalid tenant is a 400). "
    "Without it and --tenant, every request is in the default tenant.",
)
@click.option("--roles", "roles", callback=roles_option, help="Every request has these roles (a,b).")
@click.option(
    "--roles-header",
    callback=header_name,
    help="Take the roles from this request header, comma-separated (set by the proxy; absent: none).",
)
@ALLOWED_HOST
@click.option(
    "--console",
    is_flag=True,
    help="Also serve the operator console at /console: every user's memory, the queue and the "
    "lifecycle, for callers with the admin role (docs/console.md). Needs the SQL provider.",
)
def serve(
    host: str,
    port: int,
    user_id: str | None,
    user_header: str | None,
    tenant_id: str | None,
    tenant_header: str | None,
    roles: frozenset[str] | None,
    roles_header: str | None,
    allowed_hosts: tuple[str, ...],
    console: bool,
) -> None:
    """Serve the /api/memory endpoints over HTTP (needs the 'server' extra)."""
    if (user_id is None) == (user_header is None):
        raise click.UsageError(
            "say who the caller is: --user ID (one user's memory) or --user-header NAME "
            "(a header set by an authenticating reverse proxy)"
        )
    if tenant_id is not None and tenant_header is not None:
        raise click.UsageError("--tenant and --tenant-header exclude each other")
    if roles is not None and roles_header is not None:
        raise click.UsageError("--roles and --roles-header exclude each other")
    try:
        import uvicorn

        from memstore.cli.serve_app import create_app, fixed_user, header_roles, header_tenant, header_user
    except ImportError as exc:
        raise click.ClickException(
            f"memstore serve needs FastAPI and uvicorn: pip install 'memstore[server]' ({exc})"
        ) from exc

    hosts = allowed_hosts_or_fail(host, allowed_hosts)
    if user_id is not None:
        identity = fixed_user(user_id)
        who = f"every request acts as user {user_id!r}"
    else:
        identity = header_user(str(user_header))
        who = (
            f"the user is taken from the {user_header} header; anyone who can reach this port without "
            "going through your reverse proxy can claim any user"
        )
    if tenant_header is not None:
        who += f"; the tenant is taken from the {tenant_header} header"
    elif tenant_id is not None:
        who += f" in tenant {tenant_id!r}"
    if roles_header is not None:
        who += f"; the roles are taken from the {roles_header} header"
    storage = get_memory_storage()  # fail now, with one line, on a bad database or storage setting
    from memstore.storage.sql import SqlMemoryStorage

    if console and not isinstance(storage, SqlMemoryStorage):
        raise click.UsageError(f"--console needs the SQL provider; storage_class is {type(storage).__name__}")
    app = create_app(
        identity,
        allowed_hosts=hosts,
        max_body_bytes=MAX_DOCUMENT_BYTES,
        tenant=header_tenant(tenant_header) if tenant_header is not None else _fixed(tenant_id),
        roles=header_roles(roles_header) if roles_header is not None else _fixed(roles or frozenset()),
        console=console,
    )
    listener = listen(host, port)  # before saying "serving": a busy port is reported once, here
    console_note = f"; the operator console at http://{host}:{port}/console/ (admin role)" if console else ""
    click.echo(
        f"memstore: serving http://{host}:{port}/api/memory (OpenAPI docs at /docs){console_note}; {who}; "
        f"accepting Host {', '.join(hosts)}"
    )
    uvicorn.Server(uvicorn.Config(app, host=host, port=port)).run(sockets=[listener])


def _fixed(value: T) -> Callable[[], T]:
    """A dependency that always answers ``value`` (a fixed tenant or roles)."""

    def fixed() -> T:
        return value

    return fixed
