"""The console as an ASGI app that ``memstore serve --console`` mounts under ``/console``.

``/`` is the HTML shell (no data in it: the CSRF token only), ``/static/`` the script modules and
the stylesheet shipped in the wheel (``memstore/console/static``: no CDN, no build step), and
``/api/`` the JSON the pages read and write (``memory_routes``, ``ops_routes``, ``more_routes``).
Its own sub-app, so the security headers (``security.SecurityHeaders``) cover every one of its
answers, errors included, and nothing else of the server.
"""

from collections.abc import Callable, Iterable
from html import escape
from pathlib import Path
from typing import Annotated

from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from starlette.types import ASGIApp

from memstore.console.inputs import no_nul
from memstore.console.memory_routes import memory_router
from memstore.console.more_routes import more_router
from memstore.console.ops_routes import ops_router
from memstore.console.security import (
    CSRF_COOKIE,
    SecurityHeaders,
    check_fetch_site,
    csrf_token,
    operator_dependency,
)

STATIC_DIR = Path(__file__).parent / "static"
TOKEN_PLACEHOLDER = "__CSRF_TOKEN__"


class ConsoleApp(FastAPI):
    """The console's FastAPI app, with ``SecurityHeaders`` outside everything Starlette adds.

    ``add_middleware`` puts a middleware inside Starlette's ``ServerErrorMiddleware``, whose 500
    goes straight to the server: an unexpected error would have gone out without the CSP and
    ``no-store``. Wrapping the whole stack covers that answer too.
    """

    def build_middleware_stack(self) -> ASGIApp:
        return SecurityHeaders(super().build_middleware_stack())


def create_console_app(
    identity: Callable[..., str],
    *,
    tenant: Callable[..., str | None] | None = None,
    roles: Callable[..., Iterable[str]] | None = None,
) -> FastAPI:
    """The console for callers named by the API's own identity dependencies."""
    app = ConsoleApp(
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
        title="memstore console",
        dependencies=[Depends(no_nul)],
    )
    operator = operator_dependency(identity, tenant, roles)
    api = [Depends(check_fetch_site)]
    app.include_router(memory_router(operator), prefix="/api", dependencies=api)
    app.include_router(ops_router(operator), prefix="/api", dependencies=api)
    app.include_router(more_router(operator), prefix="/api", dependencies=api)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    shell = (STATIC_DIR / "index.html").read_text(encoding="utf-8")

    # The shell needs an identity (as the API does) but not the admin role: it holds no data, and
    # it tells a caller without the role that the console refuses them.
    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def page(request: Request, _caller: Annotated[str, Depends(identity)]) -> HTMLResponse:
        token = csrf_token(request)
        response = HTMLResponse(shell.replace(TOKEN_PLACEHOLDER, escape(token)))
        response.set_cookie(
            CSRF_COOKIE,
            token,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path=request.scope.get("root_path") or "/",
        )
        return response

    return app
