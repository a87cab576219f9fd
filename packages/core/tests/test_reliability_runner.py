"""Runners under faults (issue 12): a store that goes down and comes back, workers that die, agents that raise.

Real parts: a real ``agl store serve`` process stopped and restarted on the same port and file, real worker
processes that ``os._exit``. Waits are on events (ports, counters, log records), never on clocks.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider

import agentlightning as agl
from agentlightning.credit import build_training_batch
from agentlightning.runner import ROOT_SPAN_NAME
from agentlightning.runner import _execute as execute_module  # pyright: ignore[reportPrivateUsage]
from agentlightning.store import SqliteStore, StoreClient
from agentlightning.testing import StoreServerProcessForTests, wait_until
from agentlightning.tracing import get_span_processor

TOKEN = "runner-reliability-token-42"


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


# --------------------------------------------------------------------------------------- store outage


def test_spans_written_while_the_store_is_down_are_kept_and_written_when_it_is_back(tmp_path: Path) -> None:
    served = StoreServerProcessForTests(tmp_path / "outage.db", token=TOKEN).start()
    started, store_down = threading.Event(), threading.Event()

    @agl.rollout
    async def agent(task: dict[str, int]) -> float:
        started.set()
        await asyncio.to_thread(store_down.wait)
        tracer = agl.get_tracer()
        for i in range(task["spans"]):
            with tracer.start_as_current_span(f"step-{i}", attributes={"i": i}):
                pass
        return 1.0

    # The client gives up after 1 s, so surviving the outage is the span writer's job (retry_for: a minute).
    store = StoreClient(served.url, token=TOKEN, retry_for=1.0, backoff_max=0.2)
    processor = get_span_processor()
    retries_before = processor.write_retries
    rollout_id = asyncio.run(_enqueue(store, {"spans": 40}))
    runner = agl.Runner(agent, store, heartbeat_interval=0.5, poll_interval=0.05, stop_when_idle=True)
    errors: list[BaseException] = []
    thread = threading.Thread(target=lambda: _run(runner, errors))
    thread.start()
    try:
        wait_until(started.is_set, "the agent to start")
        served.stop()
        wait_until(lambda: not _port_open(served.port), "the store's port to close")
        store_down.set()  # the agent ends now: its 42 spans and its end meet a dead store
        # well past the client's own retries: the span writer has found the store unavailable three times
        wait_until(lambda: processor.write_retries >= retries_before + 3, "the span writer to retry")
        served.start()
        thread.join(180)
        assert not thread.is_alive(), "the runner did not finish after the store came back"
    finally:
        runner.stop()
        thread.join(30)
    try:
        assert errors == []

        async def check() -> None:
            client = StoreClient(served.url, token=TOKEN)
            assert (await client.get_rollout(rollout_id)).status == "succeeded"
            names = [s.name for s in await client.query_spans(rollout_id)]
            assert sorted(names) == sorted([*(f"step-{i}" for i in range(40)), ROOT_SPAN_NAME, "agentlightning.reward"])
            await client.close()

        asyncio.run(check())
    finally:
        served.stop()


async def _enqueue(store: agl.LightningStore, task: object) -> str:
    rollout = await store.enqueue_rollout(task)
    if isinstance(store, StoreClient):
        await store.close()
    return rollout.rollout_id


def _run(runner: agl.Runner, errors: list[BaseException]) -> None:
    try:
        runner.run()
    except BaseException as exc:
        errors.append(exc)


def test_the_span_buffer_is_bounded_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    processor = agl.tracing.LightningSpanProcessor(max_buffered_spans=3, max_delay=10.0, max_batch_size=1000)
    store = agl.MemoryStore()
    claim = asyncio.run(_claim(store))
    provider = TracerProvider()  # its own provider: the process-wide one keeps its own processor
    provider.add_span_processor(processor)
    try:
        with caplog.at_level(logging.WARNING), agl.rollout_context(store, claim[0], claim[1], None):
            tracer = provider.get_tracer("buffer-test")
            for i in range(5):
                with tracer.start_as_current_span(f"s{i}"):
                    pass
        assert processor.spans_dropped_buffer_full >= 2
        assert any("span buffer full" in r.getMessage() for r in caplog.records)
        with pytest.raises(agl.tracing.SpanWriteError, match="were already waiting"):
            processor.flush(30, claim[1])
    finally:
        processor.shutdown()


async def _claim(store: agl.LightningStore) -> tuple[str, str]:
    await store.enqueue_rollout("t")
    claim = await store.dequeue_rollout()
    assert claim is not None
    return claim.rollout.rollout_id, claim.attempt.attempt_id


# --------------------------------------------------------------------------------------- dead workers


@agl.rollout
def crashing_agent(task: dict[str, bool]) -> float:
    if task["crash"]:
        os._exit(3)  # what a segfault or the OOM killer does to a worker: no exception, no cleanup
    return 1.0


def test_dead_worker_processes_are_replaced_and_their_attempts_failed_at_once(tmp_path: Path) -> None:
    # A heartbeat timeout far beyond the test: only the runner noticing the death can end those attempts.
    policy = agl.RetryPolicy(max_attempts=2, heartbeat_timeout=3600.0)
    store = SqliteStore(tmp_path / "crash.db", retry_policy=policy)

    async def enqueue() -> list[str]:
        tasks = [{"crash": i == 0} for i in range(5)]
        return [(await store.enqueue_rollout(task)).rollout_id for task in tasks]

    ids = asyncio.run(enqueue())
    runner = agl.Runner(
        crashing_agent, store, n_workers=2, worker_mode="process", poll_interval=0.05, stop_when_idle=True
    )
    runner.run()  # returns: the crash cost two workers (one per attempt), both replaced

    async def check() -> None:
        crashed = await store.get_rollout(ids[0])
        assert crashed.status == "failed"
        attempts = await store.query_attempts(ids[0])
        assert [a.status for a in attempts] == ["failed", "failed"]
        assert all(a.error is not None and "died with exit code 3" in a.error for a in attempts)
        for rollout_id in ids[1:]:
            assert (await store.get_rollout(rollout_id)).status == "succeeded"
        await store.close()

    asyncio.run(check())
    assert runner.workers_replaced == 2


# --------------------------------------------------------------------------------------- agents that raise


@agl.rollout
async def raising_agent(task: int) -> float:
    raise ValueError(f"tool output could not be parsed (task {task})")


def test_an_agent_that_raises_is_warned_about_with_its_exception_and_a_count(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the process's failure log starts afresh: agents that raised in earlier tests used up its first warnings, and
    # whether its interval had passed since then depended on how long those tests took
    monkeypatch.setattr(execute_module, "agent_failures", execute_module._FailureLog())  # pyright: ignore[reportPrivateUsage]
    store = agl.MemoryStore(agl.RetryPolicy(max_attempts=1))

    async def enqueue() -> None:
        for i in range(8):
            await store.enqueue_rollout(i)

    asyncio.run(enqueue())
    with caplog.at_level(logging.WARNING, logger="agentlightning.runner._execute"):
        agl.Runner(raising_agent, store, n_workers=4, poll_interval=0.01, stop_when_idle=True).run()
    warnings = [r.getMessage() for r in caplog.records if "the agent raised" in r.getMessage()]
    assert warnings, "a failing agent must not show up only as a failed status"
    assert "ValueError: tool output could not be parsed (task" in warnings[0]
    assert "agent failure(s) in this process" in warnings[-1]
    assert len(warnings) <= 5  # rate-limited: the first few, then one per interval with a count
    statuses = asyncio.run(store.stats()).rollouts
    assert statuses["failed"] == 8


class ProxyRefusal(Exception):
    """Stands for an HTTP client's error (openai's AuthenticationError) that a framework re-raises with a note."""


@agl.rollout
async def noted_agent(task: int) -> float:
    error = ProxyRefusal("Error code: 401 - this LLM proxy needs 'Authorization: Bearer <token>'")
    error.add_note("During task with name 'assistant' and id 'a1b2'")  # what LangGraph adds to a node's exception
    raise error


def test_the_warning_names_the_exception_and_its_message_before_a_frameworks_note(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(execute_module, "agent_failures", execute_module._FailureLog())  # pyright: ignore[reportPrivateUsage]
    store = agl.MemoryStore(agl.RetryPolicy(max_attempts=1))
    asyncio.run(store.enqueue_rollout(0))
    with caplog.at_level(logging.WARNING, logger="agentlightning.runner._execute"):
        agl.Runner(noted_agent, store, n_workers=1, poll_interval=0.01, stop_when_idle=True).run()
    [warning] = [r.getMessage() for r in caplog.records if "the agent raised" in r.getMessage()]
    error = f"{__name__}.ProxyRefusal: Error code: 401 - this LLM proxy needs 'Authorization: Bearer <token>'"
    assert f"{error} [During task with name 'assistant' and id 'a1b2']" in warning


# --------------------------------------------------------------------------------------- group estimators


def test_one_rollout_per_task_with_a_group_estimator_is_refused_or_warned(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ValueError, match="samples_per_task=1 with estimator='grpo'"):
        agl.LoopConfig(samples_per_task=1, estimator="grpo")
    transitions = [
        agl.Transition(
            rollout_id=f"ro-{i}",
            attempt_id="at",
            group_id=f"task-{i}",
            step_index=0,
            prompt_token_ids=[1],
            response_token_ids=[2],
            response_mask=[1],
            final_reward=float(i % 2),
        )
        for i in range(4)
    ]
    with caplog.at_level(logging.WARNING, logger="agentlightning.credit._batch"):
        batch = build_training_batch(transitions, estimator="rloo")
    assert all(sample.advantage == 0.0 for sample in batch.samples)
    assert batch.metrics["single_rollout_groups"] == 4
    assert any("holds ONE rollout" in r.getMessage() for r in caplog.records)


# --------------------------------------------------------------------------------------- adapters


def test_instrument_all_warns_about_an_unsupported_framework_version(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentlightning.adapters import get_adapter

    adapter_class = type(get_adapter("openai"))
    monkeypatch.setattr(adapter_class, "SUPPORTED_RANGE", ">=999")  # the installed openai is now "too old"
    installed = adapter_class.installed_version()
    assert installed is not None
    with caplog.at_level(logging.INFO, logger="agentlightning.adapters._base"):
        assert agl.instrument_all(include=["openai"]) == []
    [record] = [r for r in caplog.records if "NOT instrumented" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert f"openai {installed}" in record.getMessage() and ">=999" in record.getMessage()
