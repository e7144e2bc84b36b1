"""Every console page in a real Chromium, and the console's security: stored markup stays text, the
CSP blocks inline script, a caller without the admin role is refused, a forged mutation is refused.

Nothing here changes memory (the mutations are ``test_console_mutations.py``'s, on their own server),
so the checks that something was *not* changed can read the seeded database as it was.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from playwright.sync_api import expect
from sqlalchemy import func, select

from memstore.console.security import CONTENT_SECURITY_POLICY
from memstore.storage.sql.engine import dispose_engines, get_engine
from memstore.storage.sql.schema.models import queue_table
from tests.browser.conftest import (
    ADMIN,
    ROLES_HEADER,
    SCREENSHOTS_ENV,
    USER_HEADER,
    Console,
    Watched,
    open_page,
)
from tests.browser.seed import IMG_FACT, QUEUE_ERROR, SCRIPT_FACT, SUMMARY

NARROW = (375, 800)
SCREENSHOTS = frozenset(
    {
        "users",
        "memory",
        "history",
        "search",
        "queue",
        "lifecycle",
        "sessions",
        "session",
        "documents",
        "document",
        "memory-phone",
        "queue-phone",
    }
)
"""The pages docs/console.md shows."""


def _pages(console: Console) -> list[tuple[str, str, str, str]]:
    """``(name, hash, heading, text the page must show)`` for every page."""
    fact = console.seeded.alice_fact
    return [
        ("users", "#/users", "Tenants and users", "alice"),
        ("tenant", "#/users?tenant=acme", "Tenants and users", "zoe"),
        ("memory", "#/user/alice", "Memory of alice", "Alice works at Acme Corp as an engineer"),
        (
            "history",
            f"#/fact/alice/{fact}?agent=_",
            f"History of fact {fact}",
            "memory updater (conversation thread-42)",
        ),
        ("search", "#/search?q=Acme", "Search across users", "Alice works at Acme Corp"),
        ("queue", "#/queue", "Queue", QUEUE_ERROR),
        ("queue-pending", "#/queue?state=pending", "Queue", "pending conversations"),
        (
            "lifecycle",
            "#/lifecycle?user=erin&below=0.3&run=1",
            "Lifecycle",
            "Erin once mentioned a rainy day",
        ),
        ("sessions", "#/sessions/alice", "Sessions of alice", "s-1"),
        ("session", "#/session/alice/s-1?agent=_", "Session s-1", "Hi, <i>I live</i> in Lisbon."),
        ("documents", "#/docs", "Agent documents", "coder"),
        (
            "document",
            "#/doc?agent=coder&path=/memories/agent.md",
            "/memories/agent.md · coder",
            "Review <script>x()</script>",
        ),
    ]


def _unlabelled(page: Any) -> list[str]:
    """Controls without an accessible name: every input, select and textarea needs a label."""
    found: list[str] = page.evaluate(
        """() => [...document.querySelectorAll("input, select, textarea, button")]
            .filter((c) => !(c.labels && c.labels.length))
            .filter((c) => !c.getAttribute("aria-label") && !c.textContent.trim())
            .map((c) => c.outerHTML.slice(0, 80))"""
    )
    return found


def test_every_page_loads_without_errors_wide_and_narrow(browser: Any, console: Console) -> None:
    shots = os.environ.get(SCREENSHOTS_ENV) if console.backend == "sqlite" else None
    for viewport in ((1280, 900), NARROW):
        watched = open_page(browser, ADMIN, viewport)
        page = watched.page
        try:
            page.goto(console.shell)
            for name, route, title, shown in _pages(console):
                page.goto(console.shell + route)
                expect(page.locator("h1")).to_have_text(title)
                expect(page.locator("main")).to_contain_text(shown)
                assert not _unlabelled(page), (route, _unlabelled(page))
                overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
                assert overflow <= 0, f"{route} scrolls sideways at {viewport[0]} px"
                shot = name if viewport[0] > NARROW[0] else f"{name}-phone"
                if shots and shot in SCREENSHOTS:
                    page.screenshot(path=str(Path(shots) / f"{shot}.png"), full_page=True)
            assert watched.errors == [], watched.errors
        finally:
            page.context.close()


def test_pages_are_reached_and_paged_with_the_keyboard(admin: Watched, console: Console) -> None:
    page = admin.page
    page.goto(console.shell + "#/user/frank")
    expect(page.locator("h1")).to_have_text("Memory of frank")
    expect(page.locator("main")).to_contain_text("1–50 of 90")
    page.get_by_role("button", name="Next").focus()
    page.keyboard.press("Enter")
    expect(page.locator("main")).to_contain_text("51–90 of 90")
    expect(page.locator("h1")).to_be_focused()  # a new page puts the keyboard on its heading
    page.get_by_role("link", name="Queue", exact=True).focus()
    page.keyboard.press("Enter")
    expect(page.locator("h1")).to_have_text("Queue")
    page.get_by_label("Tenant").select_option("acme")
    expect(page.locator("main")).to_contain_text("Users of tenant acme")
    assert admin.errors == [], admin.errors


def test_the_tenant_picker_is_walked_with_the_arrow_keys(admin: Watched, console: Console) -> None:
    page = admin.page
    page.goto(console.shell + "#/users")
    expect(page.locator("h1")).to_have_text("Tenants and users")
    picker = page.get_by_label("Tenant", exact=True)
    picker.focus()
    page.keyboard.press("ArrowDown")
    expect(page.locator("main")).to_contain_text("Users of tenant acme")
    expect(picker).to_be_focused()  # each step renders the tenant's page; the walk goes on
    page.keyboard.press("ArrowUp")
    expect(page.locator("main")).to_contain_text("Users of tenant default")
    expect(picker).to_be_focused()
    assert admin.errors == [], admin.errors


def test_stored_markup_is_shown_as_text_and_never_runs(admin: Watched, console: Console) -> None:
    page = admin.page
    page.goto(console.shell + "#/user/alice")
    expect(page.locator("main")).to_contain_text(SCRIPT_FACT)
    expect(page.locator("main")).to_contain_text(IMG_FACT)
    expect(page.locator("main")).to_contain_text(SUMMARY)
    page.get_by_label("Query (the user's next message)").fill("tea <script>")
    page.get_by_role("button", name="Show").click()
    expect(page.locator("pre.block")).to_contain_text("&lt;script&gt;")  # the prompt's own escaping
    for route, shown in (
        ("#/queue", QUEUE_ERROR),
        ("#/session/alice/s-1?agent=_", "<i>I live</i>"),
        ("#/doc?agent=coder&path=/memories/agent.md", "Review <script>x()</script>"),
    ):
        page.goto(console.shell + route)
        expect(page.locator("main")).to_contain_text(shown)
    page.goto(console.shell + "#/search?q=Alice")
    expect(page.locator("main")).to_contain_text(IMG_FACT)
    assert page.evaluate("window.__pwned") is None
    assert page.locator("main img, main script, main b, main i").count() == 0
    assert admin.errors == [], admin.errors


def test_the_csp_is_on_every_answer_and_blocks_inline_script(admin: Watched, console: Console) -> None:
    page = admin.page
    response = page.goto(console.shell)
    assert response is not None and response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    for path in ("static/app.js", "static/app.css", "api/me", "api/no-such-route"):
        answer = page.request.get(console.shell + path)
        assert answer.headers["content-security-policy"] == CONTENT_SECURITY_POLICY, path
        assert answer.headers["x-frame-options"] == "DENY", path
    expect(page.locator("h1")).to_have_text("Tenants and users")
    blocked = page.evaluate(
        """() => new Promise((resolve) => {
            const seen = [];
            document.addEventListener("securitypolicyviolation", (event) => {
                seen.push(event.effectiveDirective);
                if (seen.length === 2) setTimeout(() => resolve(seen), 100);
            });
            const script = document.createElement("script");
            script.textContent = "window.__inline = 'ran'";
            document.body.append(script);
            const holder = document.createElement("div");
            holder.innerHTML = '<img src="data:," onerror="window.__inline = \\'handler\\'">';
            document.body.append(holder);
        })"""
    )
    assert sorted(blocked) == ["script-src-attr", "script-src-elem"]
    assert page.evaluate("window.__inline") is None


def _dead_rows(console: Console) -> int:
    try:
        with get_engine(console.url).connect() as conn:
            return int(conn.execute(select(func.count()).where(queue_table.c.state == "dead")).scalar_one())
    finally:
        dispose_engines()


def test_a_caller_without_the_admin_role_is_refused(browser: Any, console: Console) -> None:
    for roles in ("editor", ""):
        watched = open_page(browser, {USER_HEADER: "mallory@example.com", ROLES_HEADER: roles})
        page = watched.page
        try:
            page.goto(console.shell)
            expect(page.locator("h1")).to_have_text("Access refused")
            token = page.locator('meta[name="memstore-csrf"]').get_attribute("content")
            for path in (
                "me",
                "tenants",
                "users",
                "users/alice/facts",
                "queue",
                "lifecycle",
                "search?q=Alice",
            ):
                assert page.request.get(f"{console.shell}api/{path}").status == 403, path
            purge = page.request.post(
                f"{console.shell}api/queue/purge",
                data={"all": True},
                headers={"X-CSRF-Token": token or "", "Content-Type": "application/json"},
            )
            assert purge.status == 403
        finally:
            page.context.close()
    nobody = open_page(browser, {})
    try:
        assert nobody.page.request.get(f"{console.shell}api/me").status == 401
    finally:
        nobody.page.context.close()
    assert _dead_rows(console) == 2


def test_a_mutation_needs_the_token_from_this_origin(admin: Watched, console: Console) -> None:
    page = admin.page
    page.goto(console.shell)
    token = page.locator('meta[name="memstore-csrf"]').get_attribute("content") or ""
    purge = f"{console.shell}api/queue/purge"
    json = {"Content-Type": "application/json"}
    forged = [
        json,  # no token: what a form on another site would send
        {**json, "X-CSRF-Token": "x" * 43},
        {**json, "X-CSRF-Token": token, "Origin": "http://evil.example"},
        {**json, "X-CSRF-Token": token, "Sec-Fetch-Site": "cross-site"},
    ]
    for headers in forged:
        assert page.request.post(purge, data={"all": True}, headers=headers).status == 403, headers
    refused = page.request.post(purge, data="all=true", headers={"X-CSRF-Token": token})
    assert refused.status == 415  # a form-encoded body is not a console call
    assert _dead_rows(console) == 2
