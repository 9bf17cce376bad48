"""A FastAPI app that enqueues dtq tasks and reports on them (docs/integrations/fastapi.md).

Run it with ``uvicorn docs.examples.fastapi_app:api`` beside
``dtq-worker docs.examples.fastapi_app:tasks``.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, HTTPException

from dtq import App, BadTaskId, UnknownTask
from dtq.contrib.fastapi import DtqClient, dtq_lifespan

tasks = App()  # settings from DTQ_* environment variables


@tasks.task(name="reports.build", max_retries=2)
def build_report(day: str) -> str:
    return f"report for {day}"


api = FastAPI(lifespan=dtq_lifespan(tasks))


@api.post("/reports/{day}", status_code=202)
async def start_report(day: str, dtq: DtqClient) -> dict[str, str]:
    handle = await dtq.enqueue("reports.build", [day])
    return {"task_id": handle.id}


@api.get("/tasks/{task_id}")
async def task_status(task_id: str, dtq: DtqClient) -> dict[str, Any]:
    try:
        info = await dtq.get(task_id)
    except (UnknownTask, BadTaskId):  # BadTaskId: not of the form <queue>:<tid>
        raise HTTPException(404, "no such task") from None
    return {"status": info.status.value, "result": info.result, "error": info.error}
