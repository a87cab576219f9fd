"""Agent Lightning adapter for LangChain and LangGraph.

One line records a graph's nodes (as agents), model calls and tools::

    import agentlightning_langchain
    agentlightning_langchain.instrument()
"""

from agentlightning_langchain._adapter import SUPPORTED_RANGE, LangChainAdapter, instrument, uninstrument
from agentlightning_langchain._handler import LightningCallbackHandler

__all__ = ["SUPPORTED_RANGE", "LangChainAdapter", "LightningCallbackHandler", "instrument", "uninstrument"]
