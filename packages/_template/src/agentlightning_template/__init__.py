"""Agent Lightning adapter for TEMPLATE_FRAMEWORK (generated from packages/_template)."""

from agentlightning_template._adapter import SUPPORTED_RANGE, TemplateAdapter, instrument, uninstrument

__all__ = ["SUPPORTED_RANGE", "TemplateAdapter", "instrument", "uninstrument"]
