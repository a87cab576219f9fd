"""The RL loop's one line per iteration about failed rollouts counts them by reason (`failure_reasons`)."""

from __future__ import annotations

import agentlightning as agl
from agentlightning.loop._rollouts import failure_reasons
from agentlightning.store import MemoryStore


async def test_failed_rollouts_are_counted_by_reason() -> None:
    store = MemoryStore(retry_policy=agl.RetryPolicy(max_attempts=1))
    errors = [
        ("failed", "ValueError: Exceeds the limit (4300 digits) for integer string conversion"),
        ("failed", "ValueError: something else"),
        ("timeout", "the agent blocked its worker for 130 s in spin (/app/tool.py:12)"),
        ("timeout", "the agent blocked its worker for 21 s in spin (/app/tool.py:12)"),
        ("failed", None),
        ("succeeded", None),
    ]
    for i, _ in enumerate(errors):
        await store.enqueue_rollout({"i": i})
    for status, error in errors:
        claim = await store.dequeue_rollout("worker")
        assert claim is not None
        await store.finish_attempt(claim.rollout.rollout_id, claim.attempt.attempt_id, status, error)
    rollouts = await store.query_rollouts()
    reasons = await failure_reasons(store, rollouts)
    assert reasons == {
        "failed: ValueError": 2,
        "timeout: the agent blocked its worker for N s": 2,
        "failed: no error recorded": 1,
    }
    await store.close()
