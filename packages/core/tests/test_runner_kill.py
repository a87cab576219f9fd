"""A worker process killed with SIGKILL mid-rollout: the store notices the silence, another worker finishes it.

Real parts only: a SQLite file shared by real worker processes, a real ``kill -9``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path

import agentlightning as agl
from agentlightning.runner import ROOT_SPAN_NAME
from agentlightning.store import SqliteStore


@agl.rollout
def victim(task):
    with agl.get_tracer().start_as_current_span("acked", attributes={"task": task["id"]}):
        pass
    agl.flush(30)  # from here on the store has acknowledged the span
    if task["hang"]:
        try:
            with open(task["marker"], "x") as f:  # only the first attempt creates the marker...
                f.write(str(os.getpid()))
        except FileExistsError:
            pass
        else:
            time.sleep(600)  # ...and waits here to be killed
    return 1.0


def test_sigkilled_worker_is_detected_and_its_rollout_finished_elsewhere(tmp_path: Path) -> None:
    policy = agl.RetryPolicy(max_attempts=2, heartbeat_timeout=1.0)
    store = SqliteStore(tmp_path / "kill.db", retry_policy=policy)
    marker = tmp_path / "victim.pid"

    async def enqueue() -> list[str]:
        ids = []
        for i in range(6):
            task = {"id": f"t{i}", "hang": i == 0, "marker": str(marker)}
            ids.append((await store.enqueue_rollout(task)).rollout_id)
        return ids

    ids = asyncio.run(enqueue())
    runner = agl.Runner(
        victim,
        store,
        n_workers=2,
        worker_mode="process",
        heartbeat_interval=0.1,
        poll_interval=0.05,
        stop_when_idle=True,
    )
    errors: list[BaseException] = []

    def run() -> None:
        try:
            runner.run()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        deadline = time.monotonic() + 120
        while not (marker.exists() and marker.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        pid = int(marker.read_text())
        assert pid in runner.worker_pids
        os.kill(pid, signal.SIGKILL)
        thread.join(180)
        assert not thread.is_alive(), "the surviving worker did not finish the queue"
    finally:
        runner.stop()
        thread.join(30)
    assert errors == []

    async def check() -> None:
        for rid in ids:
            assert (await store.get_rollout(rid)).status == "succeeded"
        hung = ids[0]
        first, second = await store.query_attempts(hung)
        # the runner sees its worker die and fails the attempt at once; the store's heartbeat timeout is the backstop
        assert first.status in ("failed", "unresponsive")
        if first.status == "failed":
            assert first.error is not None and "died with exit code -9" in first.error
        assert second.status == "succeeded"
        assert first.worker_id is not None and first.worker_id.split(":")[1] == str(pid)
        assert second.worker_id is not None and second.worker_id.split(":")[1] != str(pid)
        # the span acknowledged before the kill survived; the root span of the killed attempt never ended
        killed_spans = await store.query_spans(hung, first.attempt_id)
        assert [(s.name, s.attributes["task"]) for s in killed_spans] == [("acked", "t0")]
        names = sorted(s.name for s in await store.query_spans(hung, second.attempt_id))
        assert names == sorted(["acked", ROOT_SPAN_NAME, "agentlightning.reward"])
        for rid in ids[1:]:
            [attempt] = await store.query_attempts(rid)
            assert attempt.status == "succeeded"
            assert {s.name for s in await store.query_spans(rid)} == {"acked", ROOT_SPAN_NAME, "agentlightning.reward"}
        await store.close()

    asyncio.run(check())
