"""The ``dtq`` CLI where a new user found it lacking: dlq lists, --version, enqueue's checks and
options, clean --json, cancel with a reason and in bulk."""

from __future__ import annotations

import json
import signal
from importlib.metadata import version
from typing import Any

import redis

from dtq import Client, Settings
from tests.conftest import wait_until
from tests.helpers import make_dead_letters


def test_dlq_alone_lists_dead_letters(dtq: Any, client: Client) -> None:
    ids = make_dead_letters(client, 2)
    r = dtq("dlq")
    assert r.code == 0, r.err
    assert all(i in r.out for i in ids), r.out
    assert "Usage" not in r.out


def test_version(dtq: Any) -> None:
    r = dtq("--version")
    assert r.code == 0
    assert r.out.strip() == f"dtq {version('dtq')}"


def test_enqueue_refuses_arguments_of_the_wrong_shape_as_usage_errors(dtq: Any) -> None:
    for argv in (["--args", "1"], ["--args", '{"a": 1}'], ["--kwargs", "[1]"],
                 ["--metadata", "3"], ["--expires", "tomorrow"]):  # fmt: skip
        r = dtq("enqueue", "add", *argv)
        assert r.code == 2, (argv, r.err)
        assert argv[0] in r.err


def test_enqueue_expires_metadata_unique(dtq: Any, client: Client) -> None:
    argv = ["enqueue", "add", "--args", "[1, 2]", "--expires", "60", "--metadata",
            '{"tenant": "acme"}', "--unique", "--json"]  # fmt: skip
    first = dtq(*argv)
    assert first.code == 0, first.err
    d = first.json()
    assert d["created"] is True
    info = client.get(d["id"])
    assert info.metadata == {"tenant": "acme"}
    assert info.expires_at is not None and info.enqueued_at is not None
    assert 59 <= (info.expires_at - info.enqueued_at).total_seconds() <= 61
    again = dtq(*argv)
    assert again.json()["id"] == d["id"] and again.json()["created"] is False
    r = dtq("enqueue", "add", "--expires", "2030-01-01T00:00:00+00:00", "--json")
    assert client.get(r.json()["id"]).expires_at is not None


def test_purge_json_prints_only_json_on_stdout_and_nothing_on_stderr(
    dtq: Any,
    client: Client,
) -> None:
    for i in range(3):
        client.enqueue("add", [i, i])
    r = dtq("purge", "default", "--yes", "--json")
    assert r.code == 0
    assert r.json()["done"] == 3
    assert r.err == ""
    client.enqueue("add", [9, 9])
    r = dtq("purge", "default", "--json", stdin="y\n")  # the prompt goes to stderr
    assert r.code == 0 and r.json()["done"] == 1, (r.out, r.err)
    ids = make_dead_letters(client, 2)
    r = dtq("dlq", "discard", *ids, "--json")
    assert r.code == 0 and r.json()["done"] == 2 and r.err == ""


def test_cancel_with_a_reason_several_ids_and_in_bulk(dtq: Any, client: Client) -> None:
    a = client.enqueue("add", [1, 1], delay=60)
    b = client.enqueue("add", [2, 2], delay=60)
    r = dtq("cancel", a.id, b.id, "--reason", "duplicate order")
    assert r.code == 0, r.err
    for h in (a, b):
        info = client.get(h.id)
        assert info.status == "cancelled" and info.error == "duplicate order"
    others = [client.enqueue("mul", [i, i]) for i in range(3)]
    keep = client.enqueue("add", [3, 3])
    r = dtq("cancel", "--name", "mul", "--yes", "--reason", "bad batch", "--json")
    assert r.code == 0 and r.json() == {"cancelled": 3, "requested": 0}
    assert all(client.get(h.id).error == "bad batch" for h in others)
    assert client.get(keep.id).status == "queued"
    assert dtq("cancel").code == 2
    assert dtq("cancel", a.id, "--queue", "default").code == 2


def test_enqueue_warns_when_no_worker_declares_the_name(
    dtq: Any,
    settings: Settings,
    r: redis.Redis,
    spawn_worker: Any,
) -> None:
    res = dtq("enqueue", "echo")
    assert res.code == 0 and "no live worker consumes queue 'default'" in res.err
    w = spawn_worker("tests.apps.lifecycle:app", settings)
    wait_until(lambda: any(r.hget(k, "tasks") for k in r.keys(f"{settings.key_prefix}:worker:*")))
    res = dtq("enqueue", "nosuch.task")
    assert res.code == 0
    assert "no live worker of queue 'default' declares task 'nosuch.task'" in res.err
    res = dtq("enqueue", "echo", "--args", "[1]", "--json")
    assert res.code == 0 and res.err == ""
    assert json.loads(res.out)["created"] is True
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0
