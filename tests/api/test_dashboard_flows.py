"""The dashboard draws a workflow as a tree with each step's status (renderFlowTree in
apps/api/dtq_api/static/app.js), in a real headless browser (Debian chromium via Playwright,
as tests/api/test_dashboard.py) against a running dtq-api."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from dtq import Client, Settings, chain, group, sig
from tests.api_proc import ApiProc
from tests.helpers.browser import SHOTS, shot
from tests.helpers.flows import claim, complete

TOKEN = "flow-token-123"


@pytest.mark.slow
def test_a_flows_detail_page_shows_its_tree_with_each_steps_status(
    r: redis.Redis, settings: Settings, browser_page: Any
) -> None:
    from playwright.sync_api import expect

    csp_violations: list[str] = []
    browser_page.on("console", lambda m: csp_violations.append(m.text)
                    if "Content Security Policy" in m.text else None)  # fmt: skip
    api = ApiProc(settings, DTQ_API_TOKEN=TOKEN)
    page = browser_page
    try:
        with Client(settings=settings) as c:
            h = c.enqueue_workflow(chain(sig("a"), group(sig("b"), sig("c")), sig("d")))
            [a] = claim(r, settings, "default")
            assert complete(r, settings, "default", a, 1)
            info = c.get(h.id)
            assert info.steps is not None
            ids = [s["id"] for s in info.steps]
        page.goto(api.url + f"/#task/{h.id}")
        page.wait_for_selector("#token-dialog[open]")
        page.fill("#token-input", TOKEN)
        page.click("#token-ok")
        tree = page.locator("[data-testid=flow-tree]")
        expect(tree).to_be_visible()
        steps = tree.locator("li.flow-step")
        expect(steps).to_have_count(4)
        want = ["succeeded", "queued", "queued", "waiting"]
        for i, status in enumerate(want):
            step = tree.locator(f"li.flow-step[data-step='{i}']")
            expect(step.locator(".badge")).to_have_text(status)
            expect(step).to_contain_text(["a", "b", "c", "d"][i])
            expect(step.locator("a")).to_have_attribute(
                "href", f"#task/{ids[i].replace(':', '%3A')}"
            )
        # The shape: a chain whose second element is a group of steps 1 and 2.
        kinds = tree.locator(".flow-kind").all_inner_texts()
        assert [k.strip().lower() for k in kinds] == ["chain", "group"]
        group_node = tree.locator("li.flow-node li.flow-node")
        expect(group_node.locator("li.flow-step")).to_have_count(2)
        shot(page, "flow-detail")
        # A step's link opens the step's own task page.
        tree.locator("li.flow-step[data-step='0'] a").click()
        expect(page.locator("[data-testid=task-result]")).to_have_text("1")
        assert not csp_violations, csp_violations
    except Exception:
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / f"failure-flow-{int(time.time())}.png"), full_page=True)
        print(api.output()[-3000:])
        raise
    finally:
        api.close()
