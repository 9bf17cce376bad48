"""Tasks that log through their own loggers (tests/worker/test_worker_logs.py)."""

from __future__ import annotations

import logging

from dtq import App

app = App()
log = logging.getLogger("tests.apps.logging_app")


@app.task(name="chatty")
async def chatty(word: str) -> str:
    log.debug("debug %s", word)
    log.info("info %s", word, extra={"customer": "acme"})
    log.warning("warning %s", word)
    return word


@app.task(name="sync_chatty")
def sync_chatty(word: str) -> str:
    log.info("sync info %s", word)
    return word


@app.task(name="boom", max_retries=0)
async def boom() -> None:
    raise ValueError("the body broke")


@app.task(name="boom_once", max_retries=1)
async def boom_once() -> None:
    raise ValueError("retry me")
