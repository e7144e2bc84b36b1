"""Each mutation the console offers, clicked through in a real Chromium and read back from the
database: a fact edited and deleted (after a cancelled confirmation), an edit of a fact another
writer changed meanwhile refused, dead conversations retried and purged, the lifecycle's dry run
applied."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import expect
from sqlalchemy import select

from memstore.config import MemoryConfig
from memstore.ops.facts import update_memory_fact
from memstore.storage.loader import reset_memory_storage
from memstore.storage.records import FactFilter
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import dispose_engines, get_engine
from memstore.storage.sql.schema.models import queue_table
from tests.browser.conftest import Console, Watched


@pytest.fixture
def stored(console: Console) -> Iterator[SqlMemoryStorage]:
    """The console's database, read by this process as memstore reads it."""
    yield SqlMemoryStorage(console.url)
    dispose_engines()


def _facts(storage: SqlMemoryStorage, user: str) -> dict[str, str]:
    return {fact["id"]: fact["content"] for fact in storage.reload(user_id=user)["facts"]}


def _dialog(page: Any, title: str) -> Any:
    return page.locator("dialog[open]", has_text=title)


def test_editing_a_fact_is_saved_and_audited(
    admin: Watched, console: Console, stored: SqlMemoryStorage
) -> None:
    page, fact = admin.page, console.seeded.carol_fact
    page.goto(console.shell + "#/user/carol")
    page.get_by_role("button", name=f"Edit fact {fact}").click()
    editor = _dialog(page, f"Edit fact {fact}")
    editor.get_by_label("Content").fill("Carol prefers aisle seats")
    editor.get_by_label("Importance").fill("0.9")
    editor.get_by_role("button", name="Save").click()
    _dialog(page, "Save this change?").get_by_role("button", name="Save").click()
    expect(page.locator("#status")).to_have_text(f"Fact {fact} saved.")
    expect(page.locator("main")).to_contain_text("Carol prefers aisle seats")

    assert _facts(stored, "carol")[fact] == "Carol prefers aisle seats"
    [held] = [f for f in stored.reload(user_id="carol")["facts"] if f["id"] == fact]
    assert held["importance"] == 0.9
    last = stored.history(FactFilter(user_id="carol"), fact_id=fact, limit=10)[-1]
    operator = page.request.get(console.shell + "api/me").json()["user_id"]  # the header's id, made safe
    assert (last.action, last.origin) == ("update", f"console:{operator}")

    page.get_by_role("link", name=f"History of fact {fact}").click()
    expect(page.locator("h1")).to_have_text(f"History of fact {fact}")
    expect(page.locator("main del").first).to_have_text("window")
    expect(page.locator("main ins").first).to_have_text("aisle")
    assert admin.errors == [], admin.errors


def test_deleting_a_fact_asks_first(admin: Watched, console: Console, stored: SqlMemoryStorage) -> None:
    page, fact = admin.page, console.seeded.dave_fact
    page.goto(console.shell + "#/user/dave")
    page.get_by_role("button", name=f"Delete fact {fact}").click()
    _dialog(page, "Delete this fact?").get_by_role("button", name="Cancel").click()
    expect(page.locator("dialog[open]")).to_have_count(0)
    assert fact in _facts(stored, "dave")

    page.get_by_role("button", name=f"Delete fact {fact}").click()
    _dialog(page, "Delete this fact?").get_by_role("button", name="Delete").click()
    expect(page.locator("#status")).to_have_text(f"Fact {fact} deleted.")
    expect(page.locator("main")).not_to_contain_text("Dave has a dog named Rex")
    assert fact not in _facts(stored, "dave")
    assert stored.history(FactFilter(user_id="dave"), fact_id=fact, limit=10)[-1].action == "delete"
    assert admin.errors == [], admin.errors


def test_an_edit_of_a_fact_changed_meanwhile_is_refused(
    admin: Watched, console: Console, stored: SqlMemoryStorage, isolated_config: MemoryConfig
) -> None:
    page, fact = admin.page, console.seeded.gina_fact
    page.goto(console.shell + "#/user/gina")
    page.get_by_role("button", name=f"Edit fact {fact}").click()
    isolated_config.database_url = console.url
    reset_memory_storage()
    # Another writer (the updater, a colleague) changes the fact while the dialog is open.
    update_memory_fact(fact, "Gina lives in Lisbon", user_id="gina")
    editor = _dialog(page, f"Edit fact {fact}")
    editor.get_by_label("Content").fill("Gina lives in Braga")
    editor.get_by_role("button", name="Save").click()
    _dialog(page, "Save this change?").get_by_role("button", name="Save").click()
    expect(page.locator("#status")).to_contain_text(f"fact {fact} changed since you opened it")
    assert _facts(stored, "gina")[fact] == "Gina lives in Lisbon"
    editor.get_by_role("button", name="Cancel").click()
    page.reload()
    expect(page.locator("main")).to_contain_text("Gina lives in Lisbon")
    assert admin.errors == ["Failed to load resource: the server responded with a status of 409 (Conflict)"]


def _queue_states(console: Console) -> dict[int, str]:
    try:
        with get_engine(console.url).connect() as conn:
            return {
                row_id: state for row_id, state in conn.execute(select(queue_table.c.id, queue_table.c.state))
            }
    finally:
        dispose_engines()


def test_dead_conversations_are_retried_and_purged(admin: Watched, console: Console) -> None:
    page = admin.page
    retried, purged = console.seeded.dead_rows
    page.goto(console.shell + "#/queue")
    expect(page.locator("h1")).to_have_text("Queue")
    page.get_by_label(f"Select conversation {retried}").check()
    page.get_by_role("button", name="Retry selected").click()
    _dialog(page, "Retry 1 dead conversation(s)?").get_by_role("button", name="Retry").click()
    expect(page.locator("#status")).to_have_text("Queued 1 conversation(s) again.")
    assert _queue_states(console)[retried] != "dead"

    page.get_by_label(f"Select conversation {purged}").check()
    page.get_by_role("button", name="Purge selected").click()
    confirm = _dialog(page, "Purge 1 dead conversation(s)?")
    expect(confirm).to_contain_text("1 conversation(s) of user bob")
    confirm.get_by_role("button", name="Purge").click()
    expect(page.locator("#status")).to_have_text("Purged 1 conversation(s).")
    assert purged not in _queue_states(console)
    assert admin.errors == [], admin.errors


def test_the_lifecycle_dry_run_is_applied(admin: Watched, console: Console, stored: SqlMemoryStorage) -> None:
    page, seeded = admin.page, console.seeded
    page.goto(console.shell + "#/lifecycle")
    page.get_by_label("User (optional)").fill("erin")
    page.get_by_role("button", name="Dry run").click()
    expect(page.locator("main")).to_contain_text("Erin once mentioned a rainy day")
    assert seeded.erin_stale in _facts(stored, "erin")  # a dry run changes nothing

    page.get_by_role("button", name="Apply: expire 1 fact(s)").click()
    _dialog(page, "Expire 1 fact(s)?").get_by_role("button", name="Expire").click()
    expect(page.locator("#status")).to_have_text("Expired 1 fact(s).")
    assert list(_facts(stored, "erin")) == [seeded.erin_fresh]
    last = stored.history(FactFilter(user_id="erin"), fact_id=seeded.erin_stale, limit=10)[-1]
    assert (last.action, last.origin) == ("delete", "lifecycle")
    assert admin.errors == [], admin.errors
