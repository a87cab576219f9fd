"""`RefusalConformanceTests`: every backend refuses the same bad input to every method the same way, keeping nothing.

Part of `StoreConformanceTests`. Each case of `BAD_INPUTS` calls one store method with one bad argument (an id with
NUL, an empty or over-long id, a dot segment, a wrong type, a status that does not exist, a NaN, a malformed record,
a bad request id...). Every backend must raise `InvalidRequestError` with a one-line message naming the argument,
the very message a fresh `MemoryStore` gives for the same call, and must store nothing.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

from agentlightning._models import LLMCall, Span
from agentlightning.store import InvalidRequestError, LightningStore

__all__ = ["BAD_INPUTS", "RefusalConformanceTests", "refusal_of"]

BadCall = Callable[[LightningStore, str, str], Awaitable[Any]]
"""``(store, rollout_id, attempt_id) -> the call``, given a running attempt's ids."""


def _span(rid: str, aid: str, **change: Any) -> dict[str, Any]:
    span = Span(
        rollout_id=rid, attempt_id=aid, sequence_id=0, trace_id="0" * 31 + "1", span_id="0" * 15 + "1",
        name="step", start_time=1.0, end_time=2.0,
    )  # fmt: skip
    return {**span.model_dump(), **change}


def _call(rid: str, aid: str, **change: Any) -> dict[str, Any]:
    call = LLMCall(call_id="call-refused", rollout_id=rid, attempt_id=aid, response_token_ids=[1, 2],
                   response_logprobs=[-0.5, -0.25], start_time=1.0)  # fmt: skip
    return {**call.model_dump(), **change}


_NUL, _LONG = "a\x00b", "x" * 257


def _bad(value: Any) -> Any:
    """An argument of the wrong type, passed on purpose."""
    return value


BAD_INPUTS: list[tuple[str, BadCall, str]] = [
    # ---- ids given as arguments
    ("dequeue worker_id NUL", lambda s, r, a: s.dequeue_rollout(worker_id=_NUL), "worker_id"),
    ("dequeue worker_id empty", lambda s, r, a: s.dequeue_rollout(worker_id=""), "worker_id"),
    ("dequeue request_id empty", lambda s, r, a: s.dequeue_rollout(request_id=""), "request_id"),
    ("dequeue request_id long", lambda s, r, a: s.dequeue_rollout(request_id="r" * 129), "request_id"),
    ("dequeue_many worker NUL", lambda s, r, a: s.dequeue_many(["w", _NUL]), "worker_ids.1"),
    ("dequeue_many not a list", lambda s, r, a: s.dequeue_many(_bad("w")), "worker_ids"),
    ("dequeue_many too many", lambda s, r, a: s.dequeue_many([None] * 1025), "at most"),
    ("dequeue_many request_id NUL", lambda s, r, a: s.dequeue_many(["w"], request_id=_NUL), "request_id"),
    ("heartbeat attempt_id NUL", lambda s, r, a: s.heartbeat(r, _NUL), "attempt_id"),
    ("heartbeat rollout_id None", lambda s, r, a: s.heartbeat(_bad(None), a), "rollout_id"),
    ("heartbeat rollout_id tab", lambda s, r, a: s.heartbeat("r\tx", a), "rollout_id"),
    ("finish rollout_id long", lambda s, r, a: s.finish_attempt(_LONG, a, "failed"), "rollout_id"),
    ("finish status running", lambda s, r, a: s.finish_attempt(r, a, "running"), "'running'"),
    ("finish status unknown", lambda s, r, a: s.finish_attempt(r, a, _bad("done")), "'done'"),
    ("finish error not text", lambda s, r, a: s.finish_attempt(r, a, "failed", error=_bad(3)), "error"),
    ("finish error NUL", lambda s, r, a: s.finish_attempt(r, a, "failed", error=_NUL), "error"),
    ("release attempt_id empty", lambda s, r, a: s.release_claim(r, ""), "attempt_id"),
    ("cancel rollout_id NUL", lambda s, r, a: s.cancel_rollout("r\x00"), "rollout_id"),
    ("cancel rollout_id dot", lambda s, r, a: s.cancel_rollout("."), "rollout_id"),
    ("get rollout_id empty", lambda s, r, a: s.get_rollout(""), "rollout_id"),
    ("get rollout_id dotdot", lambda s, r, a: s.get_rollout(".."), "rollout_id"),
    ("query_attempts rollout_id int", lambda s, r, a: s.query_attempts(_bad(3)), "rollout_id"),
    ("query status unknown", lambda s, r, a: s.query_rollouts(status=_bad(["sleeping"])), "'sleeping'"),
    ("query ids a string", lambda s, r, a: s.query_rollouts(rollout_ids="abc"), "rollout_ids"),
    ("query ids NUL", lambda s, r, a: s.query_rollouts(rollout_ids=[r, _NUL]), "rollout_ids.1"),
    ("wait timeout negative", lambda s, r, a: s.wait_for_rollouts([r], timeout=-1), "timeout"),
    ("wait timeout NaN", lambda s, r, a: s.wait_for_rollouts([r], timeout=math.nan), "timeout"),
    ("wait ids NUL", lambda s, r, a: s.wait_for_rollouts([_NUL]), "rollout_ids.0"),
    ("query_spans attempt_id NUL", lambda s, r, a: s.query_spans(r, _NUL), "attempt_id"),
    ("query_llm_calls rollout_id empty", lambda s, r, a: s.query_llm_calls("", a), "rollout_id"),
    ("get_resources resources_id NUL", lambda s, r, a: s.get_resources(_NUL), "resources_id"),
    # ---- rollout requests
    ("enqueue group_id NUL", lambda s, r, a: s.enqueue_rollouts([_bad({"group_id": _NUL})]), "requests.0.group_id"),
    ("enqueue resources_id long", lambda s, r, a: s.enqueue_rollouts([_bad({"resources_id": _LONG})]),
     "requests.0.resources_id"),
    ("enqueue mode unknown", lambda s, r, a: s.enqueue_rollouts([_bad({"mode": "nonsense"})]), "requests.0.mode"),
    ("enqueue input NaN", lambda s, r, a: s.enqueue_rollouts([_bad({"input": {"x": math.nan}})]), "input"),
    ("enqueue not a list", lambda s, r, a: s.enqueue_rollouts(_bad({"rollout_id": "x"})), "requests"),
    ("enqueue_rollout group_id NUL", lambda s, r, a: s.enqueue_rollout("t", group_id=_NUL), "group_id"),
    ("enqueue_rollout rollout_id empty", lambda s, r, a: s.enqueue_rollout("t", rollout_id=""), "rollout_id"),
    # ---- records
    ("spans rollout_id NUL", lambda s, r, a: s.add_spans([_bad(_span(r, a, rollout_id="r\x00"))]),
     "spans.0.rollout_id"),
    ("spans attempt_id long", lambda s, r, a: s.add_spans([_bad(_span(r, a, attempt_id=_LONG))]),
     "spans.0.attempt_id"),
    ("spans span_id", lambda s, r, a: s.add_spans([_bad(_span(r, a, span_id="XYZ"))]), "spans.0.span_id"),
    ("spans attribute NaN", lambda s, r, a: s.add_spans([_bad(_span(r, a, attributes={"x": math.nan}))]),
     "spans.0.attributes"),
    ("spans not a list", lambda s, r, a: s.add_spans(_bad(_span(r, a))), "spans"),
    ("spans request_id empty", lambda s, r, a: s.add_spans([_bad(_span(r, a))], request_id=""), "request_id"),
    ("spans request_id NUL", lambda s, r, a: s.add_spans([_bad(_span(r, a))], request_id=_NUL), "request_id"),
    ("calls call_id NUL", lambda s, r, a: s.add_llm_calls([_bad(_call(r, a, call_id=_NUL))]), "calls.0.call_id"),
    ("calls logprob NaN", lambda s, r, a: s.add_llm_calls([_bad(_call(r, a, response_logprobs=[0.0, math.nan]))]),
     "calls.0.response_logprobs"),
    ("calls request_id long", lambda s, r, a: s.add_llm_calls([_bad(_call(r, a))], request_id="r" * 129),
     "request_id"),
    ("resources id NUL", lambda s, r, a: s.add_resources(_bad({"resources_id": _NUL})), "resources.resources_id"),
    ("resources value Infinity",
     lambda s, r, a: s.add_resources(_bad({"resources_id": "res", "items": {"v": {"kind": "value",
                                                                                      "value": math.inf}}})),
     "resources.items"),
    # ---- dashboard queries
    ("list_rollouts limit 0", lambda s, r, a: s.list_rollouts(_bad({"limit": 0})), "query.limit"),
    ("run_stats unknown field", lambda s, r, a: s.run_stats(_bad({"unknown": 1})), "query.unknown"),
]  # fmt: skip
"""(case, the bad call, a fragment its message must hold): the same input for every backend."""


async def refusal_of(store: LightningStore, call: BadCall, rollout_id: str, attempt_id: str) -> str:
    """The message of the `InvalidRequestError` that ``call`` raises (`AssertionError` when it raises another)."""
    try:
        await call(store, rollout_id, attempt_id)
    except InvalidRequestError as exc:
        return str(exc)
    except Exception as exc:
        raise AssertionError(f"refused with {type(exc).__name__}, not InvalidRequestError: {exc}") from exc
    raise AssertionError("accepted")


async def _snapshot(store: LightningStore, rollout_id: str) -> tuple[Any, ...]:
    return (
        await store.stats(),
        await store.query_rollouts(),
        await store.query_attempts(rollout_id),
        await store.query_spans(rollout_id),
        await store.query_llm_calls(rollout_id),
        await store.query_resources(),
    )


async def _running(store: LightningStore) -> tuple[str, str]:
    await store.enqueue_rollout("refusals", rollout_id="refusals-1")
    claim = await store.dequeue_rollout(worker_id="kit")
    assert claim is not None
    return claim.rollout.rollout_id, claim.attempt.attempt_id


class RefusalConformanceTests:
    """Bad input: one refusal, the same on every backend (part of `StoreConformanceTests`)."""

    async def test_every_method_refuses_bad_input_the_same_way(self, store: LightningStore) -> None:
        from agentlightning.store import MemoryStore  # the reference

        reference = MemoryStore()
        ref_rid, ref_aid = await _running(reference)
        rid, aid = await _running(store)
        before = await _snapshot(store, rid)
        problems: list[str] = []
        for case, call, fragment in BAD_INPUTS:
            try:
                message = await refusal_of(store, call, rid, aid)
            except AssertionError as exc:
                problems.append(f"{case}: {exc}")
                continue
            expected = await refusal_of(reference, call, ref_rid, ref_aid)
            if "\n" in message or fragment not in message:
                problems.append(f"{case}: the message must be one line naming {fragment!r}: {message!r}")
            elif message != expected:
                problems.append(f"{case}: {message!r} differs from the reference's {expected!r}")
            if await _snapshot(store, rid) != before:
                problems.append(f"{case}: the store changed")
                before = await _snapshot(store, rid)
        assert not problems, "\n".join(problems)
