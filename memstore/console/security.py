"""Who may use the console, which tenants it reaches, and how its requests are guarded.

The console shows every user's memory, private facts and summaries included (what the CLI shows
an operator), so it is stricter than ``/api/memory``, where the tenant's ``admin`` never reads
another user's private facts:

- the caller is the API's (``memstore serve``'s identity dependencies: the proxy's headers or a
  fixed user) and must hold the ``admin`` role; every ``/console/api`` call is a 403 otherwise;
- an admin of the default tenant is the deployment's operator and may open any tenant (and the
  queue, which crosses tenants); an admin of another tenant sees only its own;
- a mutation needs the double-submit token: the shell sets it in an ``HttpOnly``,
  ``SameSite=Strict`` cookie and hands the same value to the script in a ``<meta>`` element, and
  the script sends it back as ``X-CSRF-Token``. A page on another site can neither read the value
  nor make the browser send the header; a foreign ``Origin`` or a cross-site ``Sec-Fetch-Site`` is
  refused as well, so a token leaked some other way is still not enough from another site;
- a read is refused when the browser says another site's page made it (``Sec-Fetch-Site``
  ``cross-site`` or ``same-site``): such a page cannot read the answer anyway, but it could make an
  operator's browser run the costly ones (a lifecycle dry run over every tenant) or time them;
- every console response carries a strict Content-Security-Policy (no inline script or style,
  nothing from another origin), so even markup that slipped into the page could not run.
"""

# No ``from __future__ import annotations``: FastAPI evaluates ``operator_of``'s annotations,
# which name the factory's local dependencies.

import hmac
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Annotated
from urllib.parse import urlsplit

from fastapi import Depends, HTTPException, Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from memstore.errors import InvalidScopeError
from memstore.scope import ADMIN_ROLE, DEFAULT_TENANT_ID, validate_roles, validate_tenant_id

CSRF_COOKIE = "memstore_console_csrf"
CSRF_HEADER = "X-CSRF-Token"
TOKEN_BYTES = 32
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"permissions-policy", b"camera=(), microphone=(), geolocation=()"),
)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


@dataclass(frozen=True)
class Operator:
    """The console's caller: an admin, in its own tenant."""

    user_id: str
    tenant_id: str
    roles: frozenset[str]

    @property
    def crosses_tenants(self) -> bool:
        """The default tenant's admin operates the whole deployment; another tenant's, its own."""
        return self.tenant_id == DEFAULT_TENANT_ID

    def tenant(self, asked: str | None) -> str:
        """The tenant a request works in: ``asked`` (default: the caller's own) when it may."""
        if asked is None or asked == "":
            return self.tenant_id
        try:
            tenant = validate_tenant_id(asked)
        except InvalidScopeError as exc:
            raise HTTPException(422, str(exc)) from exc
        if tenant != self.tenant_id and not self.crosses_tenants:
            raise HTTPException(403, "an admin of one tenant sees only that tenant")
        return tenant

    def require_operator(self, what: str) -> None:
        """Refuse work that crosses tenants (the queue) to another tenant's admin."""
        if not self.crosses_tenants:
            raise HTTPException(403, f"{what} crosses tenants: only the default tenant's admin sees it")


def _none() -> None:
    return None


def operator_dependency(
    identity: Callable[..., str],
    tenant: Callable[..., str | None] | None,
    roles: Callable[..., Iterable[str]] | None,
) -> Callable[..., Operator]:
    """A FastAPI dependency that resolves the API's identity and refuses a caller without ``admin``."""

    def operator_of(
        user_id: Annotated[str, Depends(identity)],
        tenant_id: Annotated[str | None, Depends(tenant or _none)],
        role_names: Annotated[Iterable[str] | None, Depends(roles or _none)],
    ) -> Operator:
        try:
            held = validate_roles(role_names)
            own = validate_tenant_id(DEFAULT_TENANT_ID if tenant_id is None else tenant_id)
        except InvalidScopeError as exc:
            raise HTTPException(400, str(exc)) from exc
        if ADMIN_ROLE not in held:
            raise HTTPException(403, f"the console needs the {ADMIN_ROLE} role")
        return Operator(user_id, own, held)

    return operator_of


def csrf_token(request: Request) -> str:
    """The request's token cookie when it is one of ours, else a new random token."""
    held = request.cookies.get(CSRF_COOKIE, "")
    if len(held) == 43 and all(char.isalnum() or char in "-_" for char in held):
        return held
    return secrets.token_urlsafe(TOKEN_BYTES)


def check_fetch_site(request: Request) -> None:
    """Refuse an API call that the browser says another site's page made (Fetch Metadata).

    ``same-origin`` is the console's script, ``none`` an operator opening the URL; a browser that
    sends no such header (an old one, ``curl``) is judged by the other checks alone.
    """
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in {"same-origin", "none"}:
        raise HTTPException(403, "cross-site request refused")


def check_mutation(request: Request) -> None:
    """Refuse a state-changing request that is not the console's own script on this origin."""
    cookie = request.cookies.get(CSRF_COOKIE, "")
    header = request.headers.get(CSRF_HEADER, "")
    if not cookie or not header or not hmac.compare_digest(cookie.encode(), header.encode()):
        raise HTTPException(403, "missing or wrong CSRF token: reload the console")
    origin = request.headers.get("origin")
    if origin is not None and urlsplit(origin).netloc != request.headers.get("host", ""):
        raise HTTPException(403, "cross-origin request refused")
    site = request.headers.get("sec-fetch-site")
    if site is not None and site != "same-origin":
        raise HTTPException(403, "cross-site request refused")
    if not request.headers.get("content-type", "").startswith("application/json"):
        raise HTTPException(415, "the console's mutations take application/json")


class SecurityHeaders:
    """Adds the CSP and its companions to every response of the console, errors included; JSON
    answers are never cached (they hold memory)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path, mounted_at = str(scope.get("path", "")), str(scope.get("root_path", ""))
        static = path.removeprefix(mounted_at).startswith("/static/")

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    (name, value)
                    for name, value in message.get("headers", [])
                    if name.lower() not in {header for header, _ in SECURITY_HEADERS}
                ]
                headers.extend(SECURITY_HEADERS)
                if not static:
                    headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)
