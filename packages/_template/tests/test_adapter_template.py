"""Run the shared conformance kit against the TEMPLATE_FRAMEWORK adapter."""

from __future__ import annotations

from typing import Any

import pytest

from agentlightning.testing import AdapterConformanceTests
from agentlightning_template import TemplateAdapter


class TestTemplateConformance(AdapterConformanceTests):
    supports_tools = True  # set False if the framework has no tools; see the kit for every flag

    @pytest.fixture
    def adapter(self) -> TemplateAdapter:
        return TemplateAdapter.default()

    @pytest.fixture
    def agent(self) -> Any:
        async def run(base_url: str, task: str) -> str:
            # Build a small TEMPLATE_FRAMEWORK agent with one tool named `add` (see the kit's tool_name),
            # pointed at base_url (an OpenAI-compatible endpoint), run it on `task`, return its answer.
            raise NotImplementedError

        return run
