"""``client.enqueue(task, ...)``: the client the user built sends it, arguments checked by mypy,
the handle typed by the task's result (``TaskHandle[dict]``), the task's defaults applied."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis
from mypy import api as mypy_api

from dtq import App, AsyncClient, Client, Settings
from dtq.store.keys import Keys
from tests.conftest import ROOT, running_worker
from tests.redis_server import free_port

TYPED = """
from typing import Any, assert_type

from dtq import App, AsyncClient, Client
from dtq.models import TaskHandle

app = App()


@app.task(queue="mail", max_retries=1)
async def send_email(to: str, subject: str) -> dict[str, str]:
    return {"sent": to}


@app.task
def build(day: str) -> int:
    return 1


def sync_use(client: Client) -> None:
    h = client.enqueue(send_email, to="a@b.c", subject="hi")
    assert_type(h, TaskHandle[dict[str, str]])
    assert_type(client.result(h, timeout=1), dict[str, str])
    assert_type(client.result(client.enqueue(build, "2026-11-30")), int)
    assert_type(client.enqueue("reports.build", args=["x"], queue="q"), TaskHandle[Any])
    assert_type(client.result("mail:0"), Any)
    later = client.enqueue(send_email.options(delay=5), "a@b.c", subject="hi")
    assert_type(later, TaskHandle[dict[str, str]])
    assert_type(send_email.enqueue(to="a@b.c", subject="hi"), TaskHandle[dict[str, str]])


async def async_use(c: AsyncClient) -> None:
    h = await c.enqueue(send_email, to="a@b.c", subject="hi")
    assert_type(await c.result(h), dict[str, str])
    assert_type(await send_email.aenqueue("a@b.c", "hi"), TaskHandle[dict[str, str]])
"""

WRONG = """
from dtq import App, Client

app = App()


@app.task
async def send_email(to: str, subject: str) -> dict[str, str]:
    return {"sent": to}


def use(client: Client) -> None:
    client.enqueue(send_email, to=1, subject="hi")  # E: wrong type
    client.enqueue(send_email, too="a@b.c", subject="hi")  # E: unknown argument
    client.enqueue(send_email, "a@b.c")  # E: missing argument
    n: int = client.result(client.enqueue(send_email, "a", "b"))  # E: dict, not int
"""


def _mypy(tmp_path: Path, source: str) -> tuple[str, int]:
    f = tmp_path / "snippet.py"
    f.write_text(source)
    out, err, code = mypy_api.run(
        [
            "--strict",
            "--no-error-summary",
            "--cache-dir",
            str(ROOT / ".mypy_cache"),
            "--config-file",
            str(ROOT / "pyproject.toml"),
            str(f),
        ]
    )
    return out + err, code


def test_typed_enqueue_checks_out(tmp_path: Path) -> None:
    out, code = _mypy(tmp_path, TYPED)
    assert code == 0, out


def test_typed_enqueue_catches_wrong_calls(tmp_path: Path) -> None:
    out, code = _mypy(tmp_path, WRONG)
    assert code == 1
    lines = {int(line.split(":")[1]) for line in out.splitlines() if ": error:" in line}
    marked = {i for i, line in enumerate(WRONG.splitlines(), 1) if "# E:" in line}
    assert len(marked) == 4 and lines == marked, out


async def test_enqueue_through_a_task_uses_the_clients_redis_and_the_tasks_defaults(
    settings: Settings, r: redis.Redis
) -> None:
    # The App's own settings point at a Redis that is not there: the client's must be used.
    app = App(redis_url=f"redis://127.0.0.1:{free_port()}/0", key_prefix=settings.key_prefix)

    @app.task(queue="mail", priority=8, max_retries=1)
    async def send_email(to: str, subject: str) -> dict[str, str]:
        return {"sent": to, "subject": subject}

    with Client(settings=settings) as client:  # knows nothing of the app
        h = client.enqueue(send_email, "a@b.c", subject="hi")
        info = client.get(h.id)
        assert h.queue == "mail" and info.name == send_email.name
        assert (info.priority, info.max_retries) == (8, 1)
        assert info.args == ["a@b.c"] and info.kwargs == {"subject": "hi"}
        later = client.enqueue(send_email.options(delay=60, priority=2), "x@y.z", "later")
        linfo = client.get(later.id)
        assert linfo.status == "scheduled" and linfo.priority == 2
        assert send_email.call_options is None  # the registered task is unchanged
    assert r.exists(Keys(settings.key_prefix).queue("mail").task(h.id.split(":")[1]))

    worker_settings = settings.model_copy(update={"queues": ["mail"]})
    async with running_worker(app, worker_settings), AsyncClient(settings=settings) as c:
        h2 = await c.enqueue(send_email, to="q@r.s", subject="typed")
        assert await c.result(h2, timeout=20) == {"sent": "q@r.s", "subject": "typed"}


async def test_arguments_that_cannot_bind_raise_typeerror_and_store_nothing(
    settings: Settings, r: redis.Redis
) -> None:
    app = App(settings=settings)

    @app.task(queue="bind")
    async def send_email(to: str, subject: str) -> None: ...

    qk = Keys(settings.key_prefix).queue("bind")
    calls: list[Any] = [
        lambda c: c.enqueue(send_email, "a@b.c"),  # a missing argument
        lambda c: c.enqueue(send_email, "a", "b", "c"),  # one too many
        lambda c: c.enqueue(send_email, "a", subject="s", cc="x"),  # an unknown keyword
        lambda c: c.enqueue(send_email.options(delay=5), to="a"),
    ]
    with Client(settings=settings) as client:
        for call in calls:
            with pytest.raises(TypeError, match=r"task '.*send_email'"):
                call(client)
    async with AsyncClient(settings=settings) as ac:
        with pytest.raises(TypeError, match="missing a required argument: 'subject'"):
            await ac.enqueue(send_email, "a@b.c")
    assert not [k for k in r.scan_iter(match=f"{qk.task_base}*")]
    assert sum(r.xlen(s) for s in qk.streams) == 0 and r.zcard(qk.sched) == 0
