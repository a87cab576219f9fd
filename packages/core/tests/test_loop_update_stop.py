"""A stop during the engine's update (Ctrl-C, SIGTERM) says in one line that it waits for the update."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from agentlightning.loop._update import update_in_thread


def test_a_stop_during_the_update_says_it_waits_for_it(caplog: pytest.LogCaptureFixture) -> None:
    started, release = threading.Event(), threading.Event()

    def update(batch: list[int]) -> dict[str, float]:
        started.set()
        release.wait(60)  # the test releases it; the timeout only bounds a broken test
        return {"n": float(len(batch))}

    async def main() -> None:
        task = asyncio.ensure_future(update_in_thread(update, [1, 2, 3]))
        await asyncio.to_thread(started.wait, 60)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()  # the thread goes on to its end: the event loop's executor waits for it at shutdown

    with caplog.at_level(logging.WARNING, logger="agentlightning.loop._update"):
        asyncio.run(main())
    assert [r.getMessage() for r in caplog.records] == [
        "stopping: the model update in progress finishes first (its result is not kept)"
    ]


def test_an_update_that_ends_returns_its_metrics_and_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert asyncio.run(update_in_thread(lambda batch: {"n": float(len(batch))}, [1, 2])) == {"n": 2.0}
    assert not caplog.records
