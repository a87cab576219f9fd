"""One validation rule: every backend refuses the same bad record with the same error, and keeps nothing of it.

Records made without validation (``model_construct``, ``model_copy(update=...)``, an unvalidated model inside a
validated one) are validated at the store boundary like dicts; the served store's client refuses them before
sending, with the same error as the local stores, and its server refuses the same data sent as raw JSON (422).
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from pydantic import BaseModel

from agentlightning import LLMCall, LLMResource, MemoryStore, PostgresStore, Resources, Span, SqliteStore
from agentlightning._models import SpanEvent
from agentlightning.store import InvalidRequestError, LightningStore, RolloutRequest, StoreClient
from agentlightning.testing import StoreServerProcessForTests, make_call, make_span

TOKEN = "boundary-token-0123456789"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StoreServerProcessForTests]:
    with StoreServerProcessForTests(tmp_path_factory.mktemp("served") / "s.db", token=TOKEN) as server:
        yield server


@pytest.fixture(params=["memory", "sqlite", "postgres", "served"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[LightningStore]:
    if request.param == "memory":
        backend: LightningStore = MemoryStore()
    elif request.param == "sqlite":
        backend = SqliteStore(tmp_path / "b.db")
    elif request.param == "postgres":
        backend = PostgresStore(request.getfixturevalue("agl_postgres").new_schema(), pool_size=2)
    else:
        backend = StoreClient(request.getfixturevalue("served").url, token=TOKEN)
    yield backend
    await backend.close()


def _span(rid: str, aid: str) -> Span:
    return make_span(rid, aid, 0)


# Each case: (what is added, a function making the bad input from a running rollout/attempt, expected error
# locations). The same input must give the same error type, message locations and kinds on every backend.
Case = tuple[str, Callable[[str, str], Any], list[tuple[Any, ...]]]
CASES: list[Case] = [
    ("spans", lambda r, a: [Span.model_construct(**{**_span(r, a).__dict__, "span_id": "XYZ"})], [(0, "span_id")]),
    (
        "spans",
        lambda r, a: [_span(r, a), _span(r, a).model_copy(update={"end_time": -1.0})],
        [(1,)],  # end before start: the model's own check, which pydantic does not run on model_copy
    ),
    (
        "spans",
        lambda r, a: [
            _span(r, a).model_copy(
                update={"events": [SpanEvent.model_construct(name="e", timestamp=math.nan, attributes={})]}
            )
        ],
        [(0, "events", 0, "timestamp")],
    ),
    (
        "spans",
        lambda r, a: [
            _span(r, a),
            make_span(r, a, 1).model_copy(update={"status": {"code": "weird"}}),  # a dict, never validated
        ],
        [(1, "status", "code")],
    ),
    ("spans", lambda r, a: [{**_span(r, a).model_dump(), "surprise": 1}], [(0, "surprise")]),
    (
        "calls",
        lambda r, a: [LLMCall.model_construct(**{**make_call(r, a, 0, 1.0).__dict__, "response_logprobs": [-1.0]})],
        [(0,)],
    ),
    ("calls", lambda r, a: [make_call(r, a, 0, 1.0).model_copy(update={"model_version": -1})], [(0, "model_version")]),
    (
        "resources",
        lambda r, a: Resources(resources_id="res-bad").model_copy(
            update={
                "items": {
                    "llm": LLMResource.model_construct(
                        endpoint="http://x", model="m", sampling_parameters={"t": math.inf}
                    )
                }
            }
        ),
        [("items", "llm", "llm", "sampling_parameters")],
    ),
    ("requests", lambda r, a: [RolloutRequest.model_construct(rollout_id="")], [(0, "rollout_id")]),
]


async def _running(store: LightningStore) -> tuple[str, str]:
    await store.enqueue_rollout("task")
    claim = await store.dequeue_rollout()
    assert claim is not None
    return claim.rollout.rollout_id, claim.attempt.attempt_id


async def _add(store: LightningStore, kind: str, value: Any) -> Any:
    if kind == "spans":
        return await store.add_spans(value)
    if kind == "calls":
        return await store.add_llm_calls(value)
    if kind == "resources":
        return await store.add_resources(value)
    return await store.enqueue_rollouts(value)


def _signature(error: InvalidRequestError) -> list[tuple[tuple[Any, ...], str]]:
    return sorted((tuple(e["loc"]), e["type"]) for e in error.errors())


@pytest.mark.parametrize("case", range(len(CASES)))
async def test_every_backend_refuses_the_same_bad_record_the_same_way(store: LightningStore, case: int) -> None:
    kind, make, expected = CASES[case]
    rid, aid = await _running(store)
    before = (await store.query_spans(rid), await store.query_llm_calls(rid), await store.query_resources())
    rollouts = len(await store.query_rollouts())
    with pytest.raises(InvalidRequestError) as info:
        await _add(store, kind, make(rid, aid))
    locations = [loc for loc, _ in _signature(info.value)]
    for want in expected:
        assert any(loc[: len(want)] == want for loc in locations), (want, locations)
    # the same signature on a fresh local store: the reference every backend must match
    reference = MemoryStore()
    ref_rid, ref_aid = await _running(reference)
    with pytest.raises(InvalidRequestError) as ref_info:
        await _add(reference, kind, make(ref_rid, ref_aid))
    assert _signature(info.value) == _signature(ref_info.value)
    after = (await store.query_spans(rid), await store.query_llm_calls(rid), await store.query_resources())
    assert after == before and len(await store.query_rollouts()) == rollouts  # nothing of the batch was kept


async def test_every_backend_refuses_a_bad_request_id_the_same_way(store: LightningStore) -> None:
    rid, aid = await _running(store)
    with pytest.raises(InvalidRequestError, match="request_id: String should have at least 1 character"):
        await store.add_spans([_span(rid, aid)], request_id="")
    assert await store.query_spans(rid) == []


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return {k: _plain(v) for k, v in value.__dict__.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]  # pyright: ignore[reportUnknownVariableType]
    return value


@pytest.mark.parametrize("case", [0, 2, 5, 6])
async def test_the_server_refuses_the_same_records_sent_as_raw_json(
    served: StoreServerProcessForTests, case: int
) -> None:
    kind, make, expected = CASES[case]
    client = StoreClient(served.url, token=TOKEN)
    try:
        rid, aid = await _running(client)
        records = _plain(make(rid, aid))
        path, key = ("/v1/spans", "spans") if kind == "spans" else ("/v1/llm_calls", "calls")
        body = json.dumps({key: records}, allow_nan=True)  # NaN as the JSON constant: the server must refuse it
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        async with aiohttp.ClientSession() as http, http.post(served.url + path, data=body, headers=headers) as resp:
            status, answer = resp.status, await resp.json()
        assert status == 422, answer
        for want in expected:
            assert ".".join(str(part) for part in (key, *want)) in answer["message"], answer
        assert await client.query_spans(rid) == [] and await client.query_llm_calls(rid) == []
    finally:
        await client.close()
