"""A Django management command running a dtq worker for the project's tasks
(docs/integrations/django.md). Copy it to ``<your_app>/management/commands/dtq_worker.py``
and run ``python manage.py dtq_worker``: Django is set up first, so tasks can use the ORM.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from dtq_worker.main import main as run_worker


class Command(BaseCommand):
    help = "Run a dtq worker for this project's tasks (flags as for dtq-worker)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--queues", help="comma-separated queues, in order")
        parser.add_argument("--concurrency", type=int, help="tasks in flight")

    def handle(self, *args: Any, **options: Any) -> None:
        argv = [settings.DTQ_APP]  # e.g. "myproject.tasks:app"
        if options["queues"]:
            argv += ["--queues", options["queues"]]
        if options["concurrency"]:
            argv += ["--concurrency", str(options["concurrency"])]
        run_worker(argv)  # returns only by SystemExit: 0 stopped, 1 Redis lost, 2 config
