"""Agent Lightning adapter for the OpenAI Agents SDK.

One line records agents, model calls, function tools and handoffs::

    import agentlightning_openai_agents
    agentlightning_openai_agents.instrument()
"""

from agentlightning_openai_agents._adapter import SUPPORTED_RANGE, OpenAIAgentsAdapter, instrument, uninstrument
from agentlightning_openai_agents._processor import LightningTracingProcessor

__all__ = ["SUPPORTED_RANGE", "LightningTracingProcessor", "OpenAIAgentsAdapter", "instrument", "uninstrument"]
