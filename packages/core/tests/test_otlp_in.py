"""OTLP in: a command agent's OpenTelemetry spans reach its attempt through the served store's ``POST /v1/traces``.

Real parts: an ``agl store serve`` process, an LLM proxy before a scripted model server, a runner over the served
store, and a command agent in its own process whose OpenTelemetry SDK is configured only by the environment the
runner set (no line of ours in it). Then every kind of bad body, refused with nothing stored.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import sys
import textwrap
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import agentlightning as agl
from agentlightning._otlp_auth import attempt_credential
from agentlightning.proxy import LLMProxy
from agentlightning.testing import ScriptedModelServer, StoreServerProcessForTests

pytest.importorskip("opentelemetry.exporter.otlp.proto.http")

AGENT = """
import json, os, sys
from openai import OpenAI
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

provider = TracerProvider()  # its resource from OTEL_RESOURCE_ATTRIBUTES
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))  # endpoint and credential from the environment
tracer = provider.get_tracer("my-agent")
task = json.load(sys.stdin)
with tracer.start_as_current_span("invoke_agent solver", attributes={
    "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "solver"
}):
    with tracer.start_as_current_span("chat toy", attributes={"gen_ai.operation.name": "chat"}) as span:
        reply = OpenAI().chat.completions.create(
            model=os.environ["OPENAI_MODEL"], messages=[{"role": "user", "content": task["question"]}]
        )
        span.set_attribute("gen_ai.response.id", reply.id)
    with tracer.start_as_current_span("execute_tool calculator", attributes={
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "calculator"
    }):
        pass
    reward = 1.0 if "4" in reply.choices[0].message.content else 0.0
    with tracer.start_as_current_span("reward", attributes={
        "agentlightning.reward.value": reward, "agentlightning.reward.final": True
    }):
        pass
provider.shutdown()  # exports what is left before the process ends
print(json.dumps({"reward": None}))  # the reward went with the spans
"""


@pytest.mark.parametrize("served", [True, False], ids=["served-store", "runner-opened-store"])
def test_spans_of_an_agent_in_another_process_join_their_attempt(tmp_path: Path, served: bool) -> None:
    """Through the store server's route (a served store), or the runner's own receiver (a SQLite file it opened)."""
    (tmp_path / "agent.py").write_text(textwrap.dedent(AGENT))
    agent = agl.CommandAgent(f"{shlex.quote(sys.executable)} -I agent.py", cwd=tmp_path)

    async def main(server: StoreServerProcessForTests) -> tuple[list[agl.Transition], list[agl.Span], str]:
        store = agl.StoreClient(server.url, token=server.token) if served else agl.SqliteStore(tmp_path / "own.db")
        try:
            with ScriptedModelServer(lambda request: "2 + 2 = 4") as model:
                async with LLMProxy(store, [model.base_url]) as proxy:
                    await store.add_resources(agl.Resources(resources_id="v1", items={"llm": proxy.llm_resource("t")}))
                    rollout = await store.enqueue_rollout({"question": "What is 2 + 2?"})
                    await agl.Runner(agent, store=store, stop_when_idle=True).arun()
            (attempt,) = await store.query_attempts(rollout.rollout_id)
            assert attempt.status == "succeeded", attempt.error
            transitions = await agl.transitions_from_store(store, [rollout.rollout_id])
            return transitions, await store.query_spans(rollout.rollout_id), attempt.attempt_id
        finally:
            await store.close()

    with StoreServerProcessForTests() as server:
        transitions, spans, attempt_id = asyncio.run(main(server))
    (transition,) = transitions
    assert transition.agent_name == "solver" and transition.final_reward == 1.0
    assert transition.prompt_token_ids and transition.response_token_ids  # joined to the proxy's record by its id
    kinds = {span.name: span.attributes.get("agentlightning.span.kind") for span in spans}
    assert kinds["chat toy"] == "llm" and kinds["invoke_agent solver"] == "agent"
    assert kinds["execute_tool calculator"] == "tool" and kinds["reward"] == "reward"
    assert all(span.attempt_id == attempt_id for span in spans)


def _otlp_json(rollout_id: str, attempt_id: str, name: str = "chat x") -> bytes:
    ids = [
        {"key": "agentlightning.rollout_id", "value": {"stringValue": rollout_id}},
        {"key": "agentlightning.attempt_id", "value": {"stringValue": attempt_id}},
    ]
    span = {
        "traceId": "5b8efff798038103d269b633813fc60c",
        "spanId": "eee19b7ec3c1b174",
        "name": name,
        "startTimeUnixNano": "1544712660000000000",
        "endTimeUnixNano": "1544712661000000000",
        "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}}],
    }
    body = {"resourceSpans": [{"resource": {"attributes": ids}, "scopeSpans": [{"spans": [span]}]}]}
    return json.dumps(body).encode()


def _post(url: str, body: bytes, credential: str | None, content_type: str = "application/json") -> tuple[int, str]:
    headers = {"Content-Type": content_type}
    if credential is not None:
        headers["Authorization"] = f"Bearer {credential}"
    request = urllib.request.Request(f"{url}/v1/traces", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_bad_otlp_bodies_are_refused_and_nothing_is_stored() -> None:
    with StoreServerProcessForTests(extra_args=["--max-body-mb", "0.05"]) as server:

        async def claims() -> list[agl.Claim]:
            store = agl.StoreClient(server.url, token=server.token)
            try:
                for i in range(3):
                    await store.enqueue_rollout({"i": i})
                found = [await store.dequeue_rollout("w") for _ in range(3)]
                ended = found[2]
                assert ended is not None
                await store.finish_attempt(ended.rollout.rollout_id, ended.attempt.attempt_id, "succeeded")
                return [claim for claim in found if claim is not None]
            finally:
                await store.close()

        mine, other, ended = asyncio.run(claims())
        ids = (mine.rollout.rollout_id, mine.attempt.attempt_id)
        credential = attempt_credential(server.token, *ids)
        good = _otlp_json(*ids)
        others = _otlp_json(other.rollout.rollout_id, other.attempt.attempt_id)
        refusals = {
            "unauthenticated": _post(server.url, good, None),
            "forged": _post(server.url, good, attempt_credential("not-the-token", *ids)),
            "malformed json": _post(server.url, b'{"resourceSpans": [', credential),
            "malformed protobuf": _post(server.url, b"\x0a\xff\xff", credential, "application/x-protobuf"),
            "no attempt named": _post(server.url, good.replace(b"agentlightning.rollout_id", b"x"), credential),
            "no span": _post(server.url, b'{"resourceSpans": []}', credential),
            "oversized": _post(server.url, _otlp_json(*ids, name="x" * 100_000), credential),
            "another attempt": _post(server.url, others, credential),
            "ended attempt": _post(
                server.url,
                _otlp_json(ended.rollout.rollout_id, ended.attempt.attempt_id),
                attempt_credential(server.token, ended.rollout.rollout_id, ended.attempt.attempt_id),
            ),
            "unknown attempt": _post(server.url, _otlp_json("ro-none", "at-none"), server.token),
        }
        statuses = {what: status for what, (status, _) in refusals.items()}
        assert statuses == {
            "unauthenticated": 401,
            "forged": 401,
            "malformed json": 400,
            "malformed protobuf": 400,
            "no attempt named": 400,
            "no span": 400,
            "oversized": 413,
            "another attempt": 403,
            "ended attempt": 409,
            "unknown attempt": 404,
        }, refusals
        assert "agentlightning.rollout_id" in refusals["no attempt named"][1]

        async def stored() -> list[int]:
            store = agl.StoreClient(server.url, token=server.token)
            try:
                return [len(await store.query_spans(c.rollout.rollout_id)) for c in (mine, other, ended)]
            finally:
                await store.close()

        assert asyncio.run(stored()) == [0, 0, 0]
        assert _post(server.url, good, credential)[0] == 200  # the same body with its own credential: stored
        assert asyncio.run(stored()) == [1, 0, 0]
