"""The dashboard in a real headless browser: Debian's chromium driven by Playwright (never a
downloaded browser), installed with apt-get when missing (or the test skips, saying why), and
screenshots of what it shows under build/screenshots/. The
``chromium`` and ``browser_page`` fixtures are in tests/conftest.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

SHOTS = ROOT / "build" / "screenshots"
TOKEN = "dash-token-123"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip


PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 800}


def rendered(page: Any, state: str) -> None:
    """Wait until the page says it rendered ``state`` (its hash): a state, not a time."""
    page.wait_for_selector(f"#view[data-rendered='{state}']", timeout=60_000)


def shot(page: Any, name: str) -> None:
    """A desktop (1280x800) and a phone (390x844) screenshot of what the page shows."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.set_viewport_size(DESKTOP)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
    page.set_viewport_size(PHONE)
    page.screenshot(path=str(SHOTS / f"{name}-phone.png"), full_page=True)
    # Nothing overflows the phone's width (wide tables scroll inside their own box).
    width = page.evaluate("() => document.documentElement.scrollWidth")
    assert width <= PHONE["width"], f"{name}: {width}px wide at 390 px"
    page.set_viewport_size(DESKTOP)
