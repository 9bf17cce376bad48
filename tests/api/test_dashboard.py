"""The dashboard clicked through in a real headless browser (Debian chromium via Playwright)
against a running dtq-api and worker. A screenshot of each view is kept under build/screenshots/.

Playwright never downloads a browser here: it drives /usr/bin/chromium, which the test installs
with apt-get when missing (or skips, saying why).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from dtq import Client, Settings
from tests.api_proc import ApiProc
from tests.conftest import wait_until
from tests.helpers.browser import SHOTS, TOKEN, rendered, shot


@pytest.mark.slow
def test_dashboard_click_through(settings: Settings, spawn_worker: Any, browser_page: Any) -> None:
    from playwright.sync_api import expect

    from dtq.schedules import Schedule, add_schedule

    # The page runs under dtq-api's Content-Security-Policy: any violation fails the test.
    csp_violations: list[str] = []
    browser_page.on("console", lambda m: csp_violations.append(m.text)
                    if "Content Security Policy" in m.text else None)  # fmt: skip
    # A slower heartbeat than the suite's 0.2 s: a loaded machine must not flip it to stale.
    settings = settings.model_copy(update={"heartbeat_interval_s": 1.0, "visibility_timeout_s": 10})
    spawn_worker("tests.apps.basic:app", settings, "--worker-id", "w-dash")
    api = ApiProc(settings, DTQ_API_TOKEN=TOKEN)
    page = browser_page
    hdr = {"Authorization": f"Bearer {TOKEN}"}
    try:
        with Client(settings=settings) as c:
            done = [c.enqueue("add", [i, 10]) for i in range(5)]
            dead = [c.enqueue("fail_now") for _ in range(3)]
            held = [c.enqueue("add", [0, 0], queue="held") for _ in range(4)]
            later = c.enqueue("add", [7, 7], delay=3600)
            add_schedule(c, Schedule(name="nightly", task="add", cron="0 3 * * *", args=[1, 2]))
            for h in done:
                c.result(h.id, timeout=30)
            for h in dead:
                with pytest.raises(Exception, match="failed"):
                    c.result(h.id, timeout=30)

            # --- token, overview -----------------------------------------------------------
            page.goto(api.url + "/")
            page.wait_for_selector("#token-dialog[open]")
            page.fill("#token-input", "wrong")
            page.click("#token-ok")
            page.wait_for_selector("#token-error:not([hidden])")  # refused, asked again
            page.fill("#token-input", TOKEN)
            page.click("#token-ok")
            page.wait_for_selector("[data-testid=stat-dlq]")
            assert page.inner_text("[data-testid=stat-dlq] .num") == "3"
            assert page.inner_text("[data-testid=stat-live] .num") == "1"
            assert page.inner_text("[data-testid=stat-queued] .num") == "4"
            page.wait_for_selector("[data-testid=throughput-chart] svg polyline")
            # The charts read the history (GET /api/v1/stats): its last hour, day or week.
            page.wait_for_selector("[data-testid=runtime-chart] svg polyline")
            page.click("[data-testid=chart-range] button[data-range=week]")
            page.wait_for_selector("[data-testid=throughput-chart] h3:has-text('60 min')")
            page.click("[data-testid=chart-range] button[data-range=hour]")
            page.wait_for_selector("[data-testid=throughput-chart] h3:has-text('1 min')")
            page.wait_for_selector("#live.live")
            # Live update: a task enqueued now shows up through the event stream.
            fresh = c.enqueue("add", [100, 1])
            page.wait_for_selector(f"[data-testid=events] li:has-text('{fresh.id}')")
            shot(page, "overview")

            # --- queues: pause / resume / purge with confirmation --------------------------
            page.click("nav a[data-view=queues]")
            row = "tr[data-queue=default]"
            page.click(f"{row} button[data-act=pause]")
            page.wait_for_selector(f"{row} .badge.paused")
            assert httpx.get(api.url + "/api/v1/queues/default", headers=hdr).json()["paused"]
            page.click(f"{row} button[data-act=resume]")
            page.wait_for_selector(f"{row} button[data-act=pause]")
            assert not httpx.get(api.url + "/api/v1/queues/default", headers=hdr).json()["paused"]
            held_row = "tr[data-queue=held]"
            page.click(f"{held_row} button[data-act=purge]")
            page.wait_for_selector("#confirm-dialog[open]")
            assert "held" in page.inner_text("#confirm-text")
            page.click("#confirm-cancel")  # declined: nothing purged
            assert c.get(held[0].id).status.value == "queued"
            page.click(f"{held_row} button[data-act=purge]")
            page.click("#confirm-ok")
            # Locator waits, not wait_for_function: the page's CSP forbids evaluating strings.
            expect(page.locator("tr[data-queue=held] td:nth-child(3)")).to_have_text("0")
            with pytest.raises(Exception, match="no task"):
                c.get(held[0].id)
            shot(page, "queues")

            # --- tasks: filter, detail, cancel, retry ---------------------------------------
            wait_until(lambda: c.get(fresh.id).status.value == "succeeded", timeout=30)
            page.click("nav a[data-view=tasks]")
            rendered(page, "tasks")
            page.select_option("#task-filters select[name=status]", "succeeded")
            page.click("#task-filters button[type=submit]")
            # The page marks which filter it rendered: no race with the unfiltered table.
            rendered(page, "tasks?status=succeeded")
            rows = page.locator("[data-testid=tasks-table] tr[data-task]")
            ids = [rows.nth(i).get_attribute("data-task") for i in range(rows.count())]
            assert ids == [fresh.id, *[h.id for h in done][::-1]]  # newest first
            assert page.locator("[data-testid=tasks-table] .badge.failed").count() == 0
            shot(page, "tasks")
            page.click(f"tr[data-task='{done[2].id}']")
            page.wait_for_selector("[data-testid=task-fields]")
            assert page.inner_text("[data-testid=task-result]").strip() == "12"
            assert page.inner_text("[data-testid=task-runtime]").strip() not in ("", "-")
            hist = page.inner_text("[data-testid=history]")
            assert "enqueued" in hist and "started" in hist and "succeeded" in hist
            shot(page, "task-detail")
            page.goto(api.url + f"/#task/{later.id}")
            page.wait_for_selector("button[data-act=cancel]")
            page.click("button[data-act=cancel]")
            page.click("#confirm-ok")
            page.wait_for_selector("h2 .badge.cancelled")
            assert c.get(later.id).status.value == "cancelled"
            page.click("button[data-act=retry]")
            page.wait_for_selector("h2 .badge.queued, h2 .badge.running, h2 .badge.succeeded")
            wait_until(lambda: c.get(later.id).status.value == "succeeded", timeout=30)
            assert c.get(later.id).result == 14

            # --- dead letters: requeue, discard -------------------------------------------
            page.click("nav a[data-view=dlq]")
            page.wait_for_selector(f"tr[data-task='{dead[0].id}']")
            assert "permanent problem" in page.inner_text("[data-testid=dlq-table]")
            shot(page, "dead-letters")
            page.click(f"tr[data-task='{dead[0].id}'] button[data-act=requeue]")
            page.wait_for_selector("#flash:has-text('Requeued')")
            # fail_now fails again on its second run (same id): back in the dead letters.
            wait_until(lambda: c.get(dead[0].id).attempt == 2, timeout=30)
            wait_until(lambda: c.get(dead[0].id).status.value == "failed", timeout=30)
            page.click(f"tr[data-task='{dead[1].id}'] button[data-act=discard]")
            page.click("#confirm-ok")
            page.wait_for_selector(f"tr[data-task='{dead[1].id}']", state="detached")
            with pytest.raises(Exception, match="no task"):
                c.get(dead[1].id)

            # --- workers, schedules -------------------------------------------------------
            # A long task with progress: running on the tasks page, in flight on its worker.
            long = c.enqueue("progress_steps", [60])
            wait_until(lambda: (c.get(long.id).progress or {}).get("current", 0) >= 1, 30)
            page.goto(api.url + "/#tasks")
            rendered(page, "tasks")
            running = f"[data-testid=running-table] tr[data-task='{long.id}']"
            page.wait_for_selector(f"{running} progress")
            shot(page, "tasks-running")
            page.click("nav a[data-view=workers]")
            page.wait_for_selector("tr[data-worker=w-dash] .badge.live")
            assert "default" in page.inner_text("tr[data-worker=w-dash]")
            page.wait_for_selector(f"tr[data-worker=w-dash] li[data-inflight='{long.id}'] a")
            assert page.inner_text("tr[data-worker=w-dash] [data-testid=uptime]") != "-"
            shot(page, "workers")
            c.cancel(long.id)
            # The overview's events name their tasks and fold progress reports into one line.
            page.click("nav a[data-view=overview]")
            rendered(page, "overview")
            line = f"[data-testid=events] li:has-text('{long.id}')"
            page.wait_for_selector(f"{line} >> text=progress_steps")
            progress_lines = page.locator(f"{line}:has(.badge.progress)")
            assert progress_lines.count() == 1  # folded: one line, its latest report
            assert int(progress_lines.locator("[data-testid=folded]").inner_text()[1:]) > 1
            shot(page, "overview")
            c.enqueue("add", [1, 1], delay=1800)
            page.click("nav a[data-view=schedules]")
            page.wait_for_selector("[data-testid=periodic-table] td:has-text('nightly')")
            assert "0 3 * * *" in page.inner_text("[data-testid=periodic-table]")
            page.wait_for_selector("[data-testid=delayed-table] .badge.scheduled")
            srow = "tr[data-schedule=nightly]"
            page.click(f"{srow} button[data-act=disable-schedule]")
            page.wait_for_selector(f"{srow} .badge.paused:has-text('disabled')")
            page.click(f"{srow} button[data-act=run-schedule]")
            page.wait_for_selector("#flash:has-text('Ran nightly now')")
            newest = httpx.get(api.url + "/api/v1/tasks?limit=1", headers=hdr).json()["items"]
            assert newest[0]["metadata"]["schedule"] == "nightly" and newest[0]["args"] == [1, 2]
            shot(page, "schedules")
            page.click(f"{srow} button[data-act=enable-schedule]")
            page.wait_for_selector(f"{srow} button[data-act=disable-schedule]")

            # --- enqueue form, lookup by id -------------------------------------------------
            page.click("nav a[data-view=tasks]")
            rendered(page, "tasks")
            page.click("details.enqueue summary")
            page.fill("#enqueue-form input[name=name]", "add")
            page.fill("#enqueue-form input[name=args]", "[20, 22]")
            shot(page, "enqueue-form")
            page.click("#enqueue-form button[type=submit]")
            page.wait_for_selector("#view[data-rendered^='task/']")
            new_id = page.get_attribute("#view", "data-rendered").split("/", 1)[1]
            new_id = new_id.replace("%3A", ":")
            wait_until(lambda: c.get(new_id).status.value == "succeeded", timeout=30)
            assert c.get(new_id).result == 42
            page.click("nav a[data-view=tasks]")
            rendered(page, "tasks")
            page.fill("#task-lookup input[name=task_id]", done[1].id)
            page.press("#task-lookup input[name=task_id]", "Enter")
            page.wait_for_selector(f"h2:has-text('{done[1].id}')")

            # --- /docs: Swagger UI from the wheel, under the same CSP ------------------------
            page.goto(api.url + "/docs")
            page.wait_for_selector(".swagger-ui .opblock-tag", timeout=60_000)
            shot(page, "api-docs")
        names = ("overview", "queues", "tasks", "tasks-running", "task-detail", "dead-letters",
                 "workers", "schedules", "enqueue-form", "api-docs")  # fmt: skip
        for name in names:
            for size in ("", "-phone"):
                assert (SHOTS / f"{name}{size}.png").stat().st_size > 5000
        assert not csp_violations, csp_violations
    except Exception:
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / f"failure-{int(time.time())}.png"), full_page=True)
        print(api.output()[-3000:])
        raise
    finally:
        api.close()


@pytest.mark.slow
def test_dashboard_filter_choice_survives_a_live_refresh(
    settings: Settings, browser_page: Any
) -> None:
    """A filter chosen but not yet applied is not wiped by the live refresh that events bring
    (it re-renders the view a second after an event unless the page is busy). Playwright's
    select_option leaves the focus elsewhere, as a user clicking away from the select does."""
    api = ApiProc(settings, DTQ_API_TOKEN=TOKEN)
    page = browser_page
    try:
        with Client(settings=settings) as c:
            c.enqueue("add", [1, 1])
            page.goto(api.url + "/#tasks")
            page.wait_for_selector("#token-dialog[open]")
            page.fill("#token-input", TOKEN)
            page.click("#token-ok")
            page.wait_for_selector("#live.live")
            rendered(page, "tasks")
            page.select_option("#task-filters select[name=status]", "succeeded")
            page.locator("h2").first.click()  # the focus leaves the select
            # An event now schedules a refresh one second later; give it time to land.
            c.enqueue("add", [2, 2])
            time.sleep(2.5)
            assert page.input_value("#task-filters select[name=status]") == "succeeded"
            page.click("#task-filters button[type=submit]")
            rendered(page, "tasks?status=succeeded")
    finally:
        api.close()


def test_dashboard_is_served_without_a_build_step(settings: Settings) -> None:
    api_dir = Path(__import__("dtq_api").__file__).parent / "static"
    for f in ("index.html", "app.js", "style.css"):
        assert (api_dir / f).stat().st_size > 500
    html = (api_dir / "index.html").read_text()
    assert "/static/app.js" in html and "http://" not in html and "https://" not in html
