"""Agent Lightning adapter for AutoGen AgentChat.

One line records agent turns, tool calls and model calls::

    import agentlightning_autogen
    agentlightning_autogen.instrument()
"""

from agentlightning_autogen._adapter import SUPPORTED_RANGE, AutoGenAdapter, instrument, uninstrument

__all__ = ["SUPPORTED_RANGE", "AutoGenAdapter", "instrument", "uninstrument"]
