"""A small user app exercised through dtq.testing (tests/sdk/test_testing_helpers.py)."""

from __future__ import annotations

from dtq import App, Fail, current_task

app = App()
sent: list[str] = []


@app.task(name="send_email")
async def send_email(to: str, subject: str = "hi") -> str:
    current_task().progress(1, 1, "sent")
    sent.append(to)
    return f"sent to {to}"


@app.task(name="signup")
def signup(email: str) -> str:
    send_email.enqueue(to=email, subject="welcome")
    return email


@app.task(name="asignup")
async def asignup(email: str) -> str:
    await send_email.aenqueue(to=email, subject="welcome")
    return email


@app.task(name="flaky_once", max_retries=2)
async def flaky_once() -> int:
    if current_task().attempt == 1:
        raise RuntimeError("first try fails")
    return current_task().attempt


@app.task(name="broken")
async def broken() -> None:
    raise Fail("bad input")


@app.task(name="always_errs", max_retries=5)
async def always_errs() -> None:
    raise RuntimeError("still down")


@app.task(name="slow", timeout=0.05)
async def slow() -> None:
    import asyncio

    await asyncio.sleep(5)
