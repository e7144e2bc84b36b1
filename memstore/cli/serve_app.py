"""The ASGI app ``memstore serve`` runs: the memory router behind a Host check and a body limit.

Stand-alone there is no gateway in front, so the app itself refuses what a gateway would:

- a ``Host`` header it was not told to serve (400): DNS rebinding, see ``cli/listening.py``.
- a request body over ``max_body_bytes`` (413), checked against ``Content-Length`` before
  reading and against the bytes actually received for chunked bodies.
- with a trusted identity header, a request without it (401) or with more than one copy of it
  (400): a proxy that appends its header instead of replacing the client's would otherwise let
  the client's copy through. The same for a tenant header, and an invalid tenant is a 400; a
  roles header may be absent (no roles) but not repeated.

``/docs``, ``/redoc``, ``/openapi.json``, ``/healthz``, ``/readyz`` and ``/metrics`` need no
identity: they hold no memory. The documentation pages load Swagger UI and ReDoc from the
installed package (``fastapi-offline``), never from a CDN, so they work on an air-gapped host.
``/console`` (with ``console=True``) is the operator console; its own rules (the ``admin`` role,
CSRF, CSP) are in ``memstore/console/security.py``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager

from fastapi import FastAPI, Header, HTTPException, Request
from fastapi_offline import FastAPIOffline
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from memstore import aio
from memstore.console.app import create_console_app
from memstore.integrations.fastapi import create_memory_router
from memstore.integrations.health import create_health_router
from memstore.integrations.identity import (
    IdentityHeaderError,
    roles_from_header,
    tenant_from_header,
    user_from_header,
)
from memstore.integrations.metrics import create_metrics_router


def header_user(name: str) -> Callable[..., str]:
    """The caller is the one value of header ``name`` (``integrations.identity.user_from_header``)."""

    # The Header parameter only documents the header in /docs; the check reads every copy.
    def user_from_request(request: Request, _documented: str = Header(default="", alias=name)) -> str:
        try:
            return user_from_header(name, request.headers.getlist(name))
        except IdentityHeaderError as exc:
            raise HTTPException(exc.status_code, exc.detail) from exc

    return user_from_request


def header_tenant(name: str) -> Callable[..., str]:
    """The caller's tenant is the one value of header ``name`` (missing: 401, invalid: 400)."""

    def tenant_from_request(request: Request, _documented: str = Header(default="", alias=name)) -> str:
        try:
            return tenant_from_header(name, request.headers.getlist(name))
        except IdentityHeaderError as exc:
            raise HTTPException(exc.status_code, exc.detail) from exc

    return tenant_from_request


def header_roles(name: str) -> Callable[..., frozenset[str]]:
    """The caller's roles are header ``name``'s comma-separated names (absent: none)."""

    def roles_from_request(
        request: Request, _documented: str = Header(default="", alias=name)
    ) -> frozenset[str]:
        try:
            return roles_from_header(name, request.headers.getlist(name))
        except IdentityHeaderError as exc:
            raise HTTPException(exc.status_code, exc.detail) from exc

    return roles_from_request


def fixed_user(user_id: str) -> Callable[[], str]:
    def fixed() -> str:
        return user_id

    return fixed


def create_app(
    identity: Callable[..., str],
    *,
    allowed_hosts: Sequence[str],
    max_body_bytes: int,
    tenant: Callable[..., str | None] | None = None,
    roles: Callable[..., frozenset[str]] | None = None,
    console: bool = False,
) -> FastAPI:
    """``identity`` names the user; ``tenant`` and ``roles`` (dependencies, default: the default
    tenant and no roles) the rest of the caller's identity. ``console`` mounts the operator console
    (``memstore.console``) under ``/console``, for the same callers with the ``admin`` role."""
    # /docs and /redoc from assets in the wheel (fastapi-offline), not a CDN: air-gapped installs.
    app = FastAPIOffline(title="memstore", summary="Long-term memory API", lifespan=_closing_the_loop)
    app.include_router(create_memory_router(identity, current_tenant_id=tenant, current_roles=roles))
    app.include_router(create_health_router())
    app.include_router(create_metrics_router())
    if console:
        app.mount("/console", create_console_app(identity, tenant=tenant, roles=roles))
    # Added last, so it runs first: a refused Host never reaches the body limit or the router.
    app.add_middleware(BodyLimit, max_body_bytes=max_body_bytes)
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts), www_redirect=False)
    return app


@asynccontextmanager
async def _closing_the_loop(_app: FastAPI) -> AsyncIterator[None]:
    """At shutdown, close the connections the async face opened on the server's loop."""
    yield
    await aio.aclose()


class BodyLimit:
    """Answer 413 to a request whose body is over ``max_body_bytes``, before the app parses it."""

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            await self._refuse(scope, receive, send)
            return
        received = 0
        over = False
        started = False

        async def limited_receive() -> Message:
            nonlocal received, over
            if over:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    # The app sees a client that went away and stops reading; its answer is
                    # replaced by the 413 below.
                    over = True
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if over:
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if not over:
                raise
        if over and not started:
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = JSONResponse({"detail": f"Request body over {self.max_body_bytes} bytes"}, status_code=413)
        await response(scope, receive, send)
