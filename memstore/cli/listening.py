"""What ``memstore serve`` and ``memstore mcp`` share about listening: the socket and the Host names.

A page on another site can point its own name at 127.0.0.1 (DNS rebinding) and then talk to a
local server as a same-origin page; its requests still carry that site's name as ``Host``. So
each HTTP server accepts only the Host names it was told to serve, and a wildcard bind has no
safe default.
"""

from __future__ import annotations

import re
import socket

import click

from memstore.cli.exit_codes import EXIT_CANNOT_LISTEN
from memstore.cli.output import echo_error

HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 token
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
ANY_ADDRESS = ("0.0.0.0", "::", "")


def _host_names(_ctx: click.Context, param: click.Parameter, names: tuple[str, ...]) -> tuple[str, ...]:
    """An empty ``--allowed-host`` (an unset shell variable) matches no request: refused, not served."""
    if any(not name.strip() for name in names):
        raise click.BadParameter("a Host name must not be empty", param=param)
    return names


ALLOWED_HOST = click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME",
    callback=_host_names,
    help="A Host name requests may carry (repeatable; IPv6 in brackets; '*' accepts any). "
    "Default: the --host address, plus localhost, 127.0.0.1 and [::1] for a loopback address.",
)


def header_name(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """``--user-header`` must be a header a proxy can set: an empty or spaced name matches nothing."""
    if value is not None and not HEADER_NAME.fullmatch(value):
        raise click.BadParameter(f"{value!r} is not an HTTP header name (such as X-Forwarded-User)")
    return value


def default_allowed_hosts(bind_host: str) -> list[str] | None:
    """The Host names to accept when none are given; ``None`` for a wildcard bind (no safe default)."""
    if bind_host in ANY_ADDRESS:
        return None
    name = f"[{bind_host}]" if ":" in bind_host else bind_host
    if name in LOOPBACK_HOSTS or bind_host.startswith("127."):
        return sorted({name, *LOOPBACK_HOSTS})
    return [name]


def allowed_hosts_or_fail(bind_host: str, given: tuple[str, ...]) -> list[str]:
    """The ``--allowed-host`` names, or the default for ``bind_host``; a usage error when there is none."""
    hosts = list(given) or default_allowed_hosts(bind_host)
    if hosts is None:
        raise click.UsageError(
            f"--host {bind_host!r} listens on every address: name the Host headers to accept with "
            "--allowed-host NAME (repeatable), or --allowed-host '*' to accept any"
        )
    return hosts


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port``; exit 5 with one line when the address cannot be had."""
    listener: socket.socket | None = None
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
    except OSError as exc:
        if listener is not None:
            listener.close()
        echo_error(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
        raise SystemExit(EXIT_CANNOT_LISTEN) from exc
    return listener
