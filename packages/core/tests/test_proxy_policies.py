"""Policy routing: each call reaches the policy of the agent that makes it, with no agent code passing anything new.

The agent is named by the header our openai instrumentation adds under an agent span; the proxy asks the backend
for that policy's adapter (its name as the model) or the base model (``frozen``), records the policy and agent on
the call, and serves calls of unknown agents with the default policy, counted in ``/admin/status``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest
from openai import AsyncOpenAI

from agentlightning import AGENT_HEADER, FROZEN, PolicyMap, instrument_openai, semconv, uninstrument_openai
from agentlightning.adapters import lightning_tracer
from agentlightning.proxy import LLMProxy
from agentlightning.store import MemoryStore
from agentlightning.testing import ScriptedModelServer, start_attempts
from agentlightning.tracing import rollout_context

ADMIN = "admin-token-for-tests"
POLICIES = PolicyMap(agents={"writer": "writer", "rewrite*": "rewriter", "checker": FROZEN})


# ---------------------------------------------------------------------------------------------- the map itself
def test_exact_names_patterns_model_names_and_the_default() -> None:
    assert POLICIES.resolve("writer", "gpt") == ("writer", True)
    assert POLICIES.resolve("rewriter_2", None) == ("rewriter", True)
    assert POLICIES.resolve("checker", "toy") == (FROZEN, True)
    assert POLICIES.resolve("stranger", "toy") == (FROZEN, False)
    assert POLICIES.resolve(None, "toy") == (FROZEN, False)
    # an agent that names a model per sub-agent is routed by that name
    assert POLICIES.resolve(None, "rewriter") == ("rewriter", True)
    assert POLICIES.trained == ["writer", "rewriter"]


def test_parse_reads_agl_train_entries_and_refuses_bad_ones() -> None:
    parsed = PolicyMap.parse(["writer=writer", "checker=frozen"], default="writer")
    assert parsed.agents == {"writer": "writer", "checker": FROZEN} and parsed.default == "writer"
    with pytest.raises(ValueError, match="AGENT=POLICY"):
        PolicyMap.parse(["writer"])
    with pytest.raises(ValueError, match="mapped twice"):
        PolicyMap.parse(["a=x", "a=y"])
    with pytest.raises(ValueError, match="policy name"):
        PolicyMap.parse(["a=../etc"])


# ---------------------------------------------------------------------------------------------- through the proxy
@pytest.fixture
def backend() -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer(model="base") as server:
        yield server


@pytest.fixture
async def proxy(backend: ScriptedModelServer) -> AsyncIterator[LLMProxy]:
    store = MemoryStore()
    await start_attempts(store, ["ro-1"])
    async with LLMProxy(store, [backend.url], served_model="base", policies=POLICIES, admin_token=ADMIN) as running:
        yield running


async def _attempt(proxy: LLMProxy) -> str:
    (attempt,) = await proxy.store.query_attempts("ro-1")
    return attempt.attempt_id


async def _status(proxy: LLMProxy) -> dict[str, object]:
    headers = {"Authorization": f"Bearer {ADMIN}"}
    async with aiohttp.ClientSession() as http, http.get(f"{proxy.url}/admin/status", headers=headers) as resp:
        assert resp.status == 200
        return await resp.json()


async def test_the_agent_header_picks_the_policy_and_the_call_records_it(
    proxy: LLMProxy, backend: ScriptedModelServer
) -> None:
    client = AsyncOpenAI(base_url=proxy.base_url("ro-1", await _attempt(proxy)), api_key="k", max_retries=0)
    for agent in ("writer", "rewriter_1", "checker", "stranger", None):
        headers = {AGENT_HEADER: agent} if agent else {}
        await client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}], extra_headers=headers
        )
    # the backend was asked for the adapter of each policy, or the base model
    assert [r["model"] for r in backend.requests] == ["writer", "rewriter", "base", "base", "base"]
    calls = await proxy.store.query_llm_calls("ro-1")
    assert [(c.agent_name, c.policy) for c in calls] == [
        ("writer", "writer"),
        ("rewriter_1", "rewriter"),
        ("checker", FROZEN),
        ("stranger", FROZEN),
        (None, FROZEN),
    ]
    assert [c.request["model"] for c in calls] == ["gpt-4o"] * 5  # what the agent sent, unchanged
    status = await _status(proxy)
    assert status["policy_calls"] == {"writer": 1, "rewriter": 1, FROZEN: 3}
    assert status["unmapped_calls"] == 2
    assert status["unmapped_agents"] == {"stranger": 1, "<no agent header>": 1}


async def test_per_policy_versions_are_recorded_for_a_backend_that_reports_none(proxy: LLMProxy) -> None:
    proxy.model_version = 0
    proxy.resume(policy_versions={"writer": 4})
    client = AsyncOpenAI(base_url=proxy.base_url("ro-1", await _attempt(proxy)), api_key="k", max_retries=0)
    for agent in ("writer", "checker"):
        await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], extra_headers={AGENT_HEADER: agent}
        )
    calls = await proxy.store.query_llm_calls("ro-1")
    assert [(c.policy, c.model_version) for c in calls] == [("writer", 4), (FROZEN, 0)]


async def test_a_non_ascii_agent_name_survives_the_header(proxy: LLMProxy) -> None:
    from agentlightning._policies import encode_agent_header

    client = AsyncOpenAI(base_url=proxy.base_url("ro-1", await _attempt(proxy)), api_key="k", max_retries=0)
    headers = {AGENT_HEADER: encode_agent_header("rédacteur")}
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], extra_headers=headers)
    (call,) = await proxy.store.query_llm_calls("ro-1")
    assert call.agent_name == "rédacteur" and call.policy == FROZEN


async def test_instrumented_openai_calls_name_their_agent_span(proxy: LLMProxy, backend: ScriptedModelServer) -> None:
    """No agent code passes the name: the openai instrumentation reads it from the enclosing agent span."""
    attempt = await _attempt(proxy)
    client = AsyncOpenAI(base_url=proxy.base_url("ro-1", attempt), api_key="k", max_retries=0)
    tracer = lightning_tracer("test")
    instrument_openai()
    try:
        with rollout_context(proxy.store, "ro-1", attempt):
            for name in ("writer", "checker"):
                attributes = {semconv.SPAN_KIND: semconv.KIND_AGENT, semconv.GEN_AI_AGENT_NAME: name}
                with (
                    tracer.start_as_current_span(f"invoke_agent {name}", attributes=attributes),
                    tracer.start_as_current_span("a step inside the agent"),  # the name is inherited
                ):
                    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "outside"}])
    finally:
        uninstrument_openai()
    calls = await proxy.store.query_llm_calls("ro-1")
    assert [(c.agent_name, c.policy) for c in calls] == [("writer", "writer"), ("checker", FROZEN), (None, FROZEN)]
    assert [r["model"] for r in backend.requests] == ["writer", "base", "base"]
