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


def _lists_holding(obj: object) -> list[str]:
    """Every list reachable from a loaded ``litellm`` module attribute that holds ``obj`` (by identity)."""
    import sys

    found: list[str] = []
    for module_name, module in list(sys.modules.items()):
        if module is None or not (module_name == "litellm" or module_name.startswith("litellm.")):
            continue
        for name, value in list(vars(module).items()):
            if isinstance(value, list) and any(entry is obj for entry in value):  # pyright: ignore[reportUnknownVariableType]
                found.append(f"{module_name}.{name}")
    return found


async def test_uninstrument_leaves_no_callback_in_litellm() -> None:
    """LiteLLM copies ``litellm.callbacks`` into its per-event lists on a call; uninstrument takes ours out of all."""
    from agentlightning.testing import ScriptedModelServer

    adapter = LiteLLMAdapter.default()
    adapter.uninstrument()
    with ScriptedModelServer() as server:
        messages = [{"role": "user", "content": "hi"}]
        adapter.instrument()
        callback: Any = adapter._callback  # pyright: ignore[reportPrivateUsage] - the object LiteLLM was given
        try:
            await litellm.acompletion(model="openai/toy", api_base=server.base_url, api_key="b", messages=messages)
            litellm.completion(model="openai/toy", api_base=server.base_url, api_key="b", messages=messages)
            assert await adapter.adrain()
            assert len(_lists_holding(callback)) > 1, "LiteLLM spread the callback over its per-event lists"
        finally:
            adapter.uninstrument()
        assert _lists_holding(callback) == []
        adapter.instrument()  # a later cycle registers it again, once
        try:
            await litellm.acompletion(model="openai/toy", api_base=server.base_url, api_key="b", messages=messages)
            assert await adapter.adrain()
            held = _lists_holding(callback)
            assert "litellm.success_callback" in held and len(held) == len(set(held))
            assert sum(entry is callback for entry in litellm.success_callback) == 1  # not twice
        finally:
            adapter.uninstrument()
        assert _lists_holding(callback) == []
