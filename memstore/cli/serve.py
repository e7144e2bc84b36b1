"""``memstore serve``: the ``/api/memory`` HTTP API stand-alone, without a gateway around it.

A gateway mounts ``memstore.integrations.fastapi.create_memory_router`` behind its own
authentication. Stand-alone there is none, so the operator must say explicitly who the caller
is: one fixed user, or a header that a trusted reverse proxy sets. What the app refuses on its
own (foreign Host names, oversized bodies, repeated identity headers) is in ``serve_app.py``.
"""

from __future__ import annotations

import click

from memstore.cli.listening import ALLOWED_HOST, allowed_hosts_or_fail, header_name, listen
from memstore.cli.params import strict_user_id
from memstore.document import MAX_DOCUMENT_BYTES
from memstore.storage.loader import get_memory_storage


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
@ALLOWED_HOST
def serve(
    host: str, port: int, user_id: str | None, user_header: str | None, allowed_hosts: tuple[str, ...]
) -> None:
    """Serve the /api/memory endpoints over HTTP (needs the 'server' extra)."""
    if (user_id is None) == (user_header is None):
        raise click.UsageError(
            "say who the caller is: --user ID (one user's memory) or --user-header NAME "
            "(a header set by an authenticating reverse proxy)"
        )
    try:
        import uvicorn

        from memstore.cli.serve_app import create_app, fixed_user, header_user
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
    get_memory_storage()  # fail now, with one line, on a bad database or storage setting
    app = create_app(identity, allowed_hosts=hosts, max_body_bytes=MAX_DOCUMENT_BYTES)
    listener = listen(host, port)  # before saying "serving": a busy port is reported once, here
    click.echo(
        f"memstore: serving http://{host}:{port}/api/memory (OpenAPI docs at /docs); {who}; "
        f"accepting Host {', '.join(hosts)}"
    )
    uvicorn.Server(uvicorn.Config(app, host=host, port=port)).run(sockets=[listener])
