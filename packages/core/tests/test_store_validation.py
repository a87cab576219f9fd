"""Bad input to either local store fails with an error naming the problem and leaves the store unchanged."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentlightning import MemoryStore, PostgresStore, SqliteStore
from agentlightning.store import (
    ConflictError,
    InvalidRequestError,
    LightningStore,
    NotFoundError,
    RolloutRequest,
    StoreStats,
)
from agentlightning.testing._store_kit import make_call, make_span


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[LightningStore]:
    backend: LightningStore
    if request.param == "memory":
        backend = MemoryStore()
    elif request.param == "sqlite":
        backend = SqliteStore(tmp_path / "v.db")
    else:
        backend = PostgresStore(request.getfixturevalue("agl_postgres").new_schema(), pool_size=2)
    yield backend
    await backend.close()


async def _running(store: LightningStore) -> tuple[str, str]:
    await store.enqueue_rollout("task", rollout_id="r1")
    claim = await store.dequeue_rollout()
    assert claim is not None
    return claim.rollout.rollout_id, claim.attempt.attempt_id


async def _snapshot(store: LightningStore, rollout_id: str) -> tuple[StoreStats, list[Any], list[Any], list[Any]]:
    return (
        await store.stats(),
        await store.query_spans(rollout_id),
        await store.query_llm_calls(rollout_id),
        await store.query_rollouts(),
    )


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("span_id", "XYZ", "2.span_id"),
        ("trace_id", "0" * 31, "2.trace_id"),
        ("sequence_id", -1, "2.sequence_id"),
        ("end_time", 0.0, "end_time"),
        ("attributes", {"k": {"nested": "dict"}}, "2.attributes.k"),
        ("surprise", 1, "2.surprise"),
    ],
)
async def test_malformed_span_rejects_whole_batch(store: LightningStore, field: str, value: Any, expected: str) -> None:
    rid, aid = await _running(store)
    await store.add_spans([make_span(rid, aid, 100)])
    before = await _snapshot(store, rid)
    bad = make_span(rid, aid, 2).model_dump()
    bad[field] = value
    batch: list[Any] = [make_span(rid, aid, 0), make_span(rid, aid, 1).model_dump(), bad, make_span(rid, aid, 3)]
    with pytest.raises(InvalidRequestError) as info:
        await store.add_spans(batch)
    assert expected in str(info.value)
    assert await _snapshot(store, rid) == before


async def test_span_batch_must_be_a_sequence(store: LightningStore) -> None:
    rid, aid = await _running(store)
    with pytest.raises(InvalidRequestError, match="sequence"):
        await store.add_spans(make_span(rid, aid, 0))  # type: ignore[arg-type]
    assert await store.query_spans(rid) == []


async def test_dict_spans_are_validated_into_models(store: LightningStore) -> None:
    rid, aid = await _running(store)
    assert await store.add_spans([make_span(rid, aid, 0).model_dump(mode="json")]) == 1  # type: ignore[list-item]
    assert await store.query_spans(rid) == [make_span(rid, aid, 0)]


async def test_malformed_llm_call_rejects_whole_batch(store: LightningStore) -> None:
    rid, aid = await _running(store)
    bad = make_call(rid, aid, 1, 2.0).model_dump()
    bad["prompt_token_ids"] = ["not", "ints"]
    with pytest.raises(InvalidRequestError, match=r"1\.prompt_token_ids"):
        await store.add_llm_calls([make_call(rid, aid, 0, 1.0), bad])  # type: ignore[list-item]
    assert await store.query_llm_calls(rid) == []
    assert (await store.stats()).llm_calls == 0


async def test_malformed_enqueue_rejects_whole_batch(store: LightningStore) -> None:
    with pytest.raises(InvalidRequestError, match="inptu"):
        await store.enqueue_rollouts([RolloutRequest(rollout_id="a"), {"inptu": 1}])  # type: ignore[list-item]
    with pytest.raises(InvalidRequestError, match="rollout_id"):
        await store.enqueue_rollout("x", rollout_id="")
    assert await store.query_rollouts() == []


async def test_bad_ids_and_statuses(store: LightningStore) -> None:
    rid, aid = await _running(store)
    with pytest.raises(ValueError, match="rollout_id"):
        await store.get_rollout("")
    with pytest.raises(ValueError, match="attempt_id"):
        await store.heartbeat(rid, None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'done'"):
        await store.finish_attempt(rid, aid, "done")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'sleeping'"):
        await store.query_rollouts(status=["sleeping"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="timeout"):
        await store.wait_for_rollouts([rid], timeout=-1)
    with pytest.raises(NotFoundError, match="at-other"):
        await store.finish_attempt(rid, "at-other", "succeeded")
    assert (await store.get_rollout(rid)).status == "running"
    assert [a.status for a in await store.query_attempts(rid)] == ["running"]


async def test_conflicting_finish_changes_nothing(store: LightningStore) -> None:
    rid, aid = await _running(store)
    await store.finish_attempt(rid, aid, "succeeded")
    before = await store.query_attempts(rid)
    with pytest.raises(ConflictError, match="succeeded"):
        await store.finish_attempt(rid, aid, "failed", error="late")
    assert await store.query_attempts(rid) == before
    assert (await store.get_rollout(rid)).status == "succeeded"


async def test_bad_resources_rejected(store: LightningStore) -> None:
    with pytest.raises(InvalidRequestError, match="kind"):
        await store.add_resources({"resources_id": "r", "items": {"x": {"kind": "gpu"}}})  # type: ignore[arg-type]
    assert await store.get_resources() is None
    assert (await store.stats()).resources == 0
