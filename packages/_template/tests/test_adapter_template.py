"""Run the shared conformance kit against the TEMPLATE_FRAMEWORK adapter.

The fixtures ``agl_harness``, ``agl_proxy``, ``agl_model_server``, ``agl_store`` come from the core's pytest
plugin (installed with ``agentlightning-core[test]``); nothing to import or configure.
"""

from __future__ import annotations

from typing import Any

import pytest

from agentlightning.testing import AdapterConformanceTests, KitHarness
from agentlightning_template import TemplateAdapter


async def run_agent(base_url: str, task: str) -> Any:
    """Build a small TEMPLATE_FRAMEWORK agent with one tool named `add` (the kit's ``tool_name``), pointed at
    ``base_url`` (an OpenAI-compatible endpoint), run it on ``task`` and return its answer."""
    raise NotImplementedError


class TestTemplateConformance(AdapterConformanceTests):
    supports_tools = True  # set False if the framework has no tools; see the kit for every flag

    @pytest.fixture
    def adapter(self) -> TemplateAdapter:
        return TemplateAdapter.default()

    @pytest.fixture
    def agent(self) -> Any:
        return run_agent


@pytest.fixture
def agl_script() -> Any:
    """The plugin's model server answers like the kit's (a tool call, then an answer)."""
    return TestTemplateConformance().script


async def test_every_call_is_a_transition(agl_harness: KitHarness) -> None:
    """Checks of your own use the same harness as the kit."""
    with agl_harness.instrumented(TemplateAdapter.default()):
        record = await agl_harness.collect(await agl_harness.run(run_agent, "What is 2 + 3?"))
    assert record.transitions is not None
    assert len(record.transitions.transitions) == len(agl_harness.server.served) > 0
