"""The LiteLLM adapter passes the conformance kit (LiteLLM's openai-compatible provider against the proxy)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from agentlightning.adapters import Adapter, LiteLLMAdapter
from agentlightning.testing import AdapterConformanceTests

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network fetch at import
litellm = pytest.importorskip("litellm")


class TestLiteLLMConformance(AdapterConformanceTests):
    supports_tools = False
    supports_agent_spans = False
    concurrency = 8

    @pytest.fixture
    def adapter(self) -> Adapter:
        return LiteLLMAdapter.default()

    @pytest.fixture
    def agent(self) -> Any:
        async def run(base_url: str, task: str) -> str:
            messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
            reply = await litellm.acompletion(model="openai/toy", api_base=base_url, api_key="kit", messages=messages)
            return str(reply.choices[0].message.content)

        return run
