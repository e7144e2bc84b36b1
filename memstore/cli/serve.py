"""``memstore serve``: the ``/api/memory`` HTTP API stand-alone, without a gateway around it.

A gateway mounts ``memstore.integrations.fastapi.create_memory_router`` behind its own
authentication. Stand-alone there is none, so the operator must say explicitly who the caller
is: one fixed user, or a header that a trusted reverse proxy sets.
"""

from __future__ import annotations

from collections.abc import Callable

import click

from memstore.scope import make_safe_user_id, validate_user_id
from memstore.storage.loader import get_memory_storage


def _header_user(name: str) -> Callable[..., str]:
    from fastapi import Header, HTTPException

    def user_from_header(raw: str = Header(default="", alias=name)) -> str:
        if not raw.strip():
            raise HTTPException(401, f"missing {name} header")
        return make_safe_user_id(raw.strip())

    return user_from_header


def _fixed_user(user_id: str) -> Callable[[], str]:
    def fixed() -> str:
        return user_id

    return fixed


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535), help="Port.")
@click.option("--user", "user_id", help="Serve this one user's memory: every request acts as this user.")
@click.option(
    "--user-header",
    help="Take the user from this request header (external ids pass through make_safe_user_id). "
    "Only behind a reverse proxy that authenticates callers, sets it and drops any copy a client sent.",
)
def serve(host: str, port: int, user_id: str | None, user_header: str | None) -> None:
    """Serve the /api/memory endpoints over HTTP (needs the 'server' extra)."""
    if (user_id is None) == (user_header is None):
        raise click.UsageError(
            "say who the caller is: --user ID (one user's memory) or --user-header NAME "
            "(a header set by an authenticating reverse proxy)"
        )
    try:
        import uvicorn
        from fastapi import FastAPI

        from memstore.integrations.fastapi import create_memory_router
    except ImportError as exc:
        raise click.ClickException(
            f"memstore serve needs FastAPI and uvicorn: pip install 'memstore[server]' ({exc})"
        ) from exc

    if user_id is not None:
        validate_user_id(user_id)
        identity = _fixed_user(user_id)
        who = f"every request acts as user {user_id!r}"
    else:
        identity = _header_user(str(user_header))
        who = (
            f"the user is taken from the {user_header} header; anyone who can reach this port without "
            "going through your reverse proxy can claim any user"
        )
    get_memory_storage()  # fail now, with one line, on a bad database or storage setting
    app = FastAPI(title="memstore", summary="Long-term memory API")
    app.include_router(create_memory_router(identity))
    click.echo(f"memstore: serving http://{host}:{port}/api/memory (OpenAPI docs at /docs); {who}")
    uvicorn.run(app, host=host, port=port)
