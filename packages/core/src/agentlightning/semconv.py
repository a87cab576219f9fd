"""Span attribute names: OpenTelemetry GenAI conventions (``gen_ai.*``) plus our own ``agentlightning.*``.

Every adapter writes these names and the transition builder reads only these names, so they are the
contract between the two.
"""

from __future__ import annotations

__all__ = [
    "ADAPTER_NAME",
    "ANNOTATION_PREFIX",
    "ATTEMPT_ID",
    "EVENT_EXCEPTION",
    "GEN_AI_AGENT_NAME",
    "GEN_AI_OPERATION",
    "GEN_AI_REQUEST_MODEL",
    "GEN_AI_RESPONSE_ID",
    "GEN_AI_RESPONSE_MODEL",
    "GEN_AI_SYSTEM",
    "GEN_AI_TOOL_NAME",
    "GEN_AI_USAGE_INPUT_TOKENS",
    "GEN_AI_USAGE_OUTPUT_TOKENS",
    "KIND_AGENT",
    "KIND_ANNOTATION",
    "KIND_JUDGE",
    "KIND_LLM",
    "KIND_REWARD",
    "KIND_ROLLOUT",
    "KIND_TOOL",
    "PROMPT_TOKEN_IDS",
    "RESPONSE_LOGPROBS",
    "RESPONSE_TOKEN_IDS",
    "REWARD_FINAL",
    "REWARD_NAME",
    "REWARD_VALUE",
    "ROLLOUT_ID",
    "SPAN_KIND",
    "SPAN_SOURCE",
]

# Which rollout/attempt a span belongs to (set by the tracer from the current rollout context).
ROLLOUT_ID = "agentlightning.rollout_id"
ATTEMPT_ID = "agentlightning.attempt_id"

# What a span represents; the transition builder keys off this attribute.
SPAN_KIND = "agentlightning.span.kind"
KIND_AGENT = "agent"
KIND_LLM = "llm"
KIND_TOOL = "tool"
KIND_REWARD = "reward"
KIND_ANNOTATION = "annotation"
KIND_ROLLOUT = "rollout"
KIND_JUDGE = "judge"
"""A judge's verdict on a finished rollout or one of its steps (`agentlightning.judge`): the one kind of span a
store accepts for an attempt that has ended."""

# OpenTelemetry GenAI semantic conventions.
GEN_AI_OPERATION = "gen_ai.operation.name"
GEN_AI_SYSTEM = "gen_ai.system"
GEN_AI_AGENT_NAME = "gen_ai.agent.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_RESPONSE_ID = "gen_ai.response.id"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_TOOL_NAME = "gen_ai.tool.name"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"

# Token ids carried on an LLM span when the adapter sees them directly (the proxy's LLMCall is preferred).
PROMPT_TOKEN_IDS = "agentlightning.llm.prompt_token_ids"
RESPONSE_TOKEN_IDS = "agentlightning.llm.response_token_ids"
RESPONSE_LOGPROBS = "agentlightning.llm.response_logprobs"

# Rewards: a span of kind "reward" carries the value; final=True marks the episode's final reward.
REWARD_VALUE = "agentlightning.reward.value"
REWARD_NAME = "agentlightning.reward.name"
REWARD_FINAL = "agentlightning.reward.final"

# Annotations: attributes under this prefix on a span of kind "annotation".
ANNOTATION_PREFIX = "agentlightning.annotation."

# Which adapter produced the span (langchain, openai_agents, autogen, openai, litellm, manual).
ADAPTER_NAME = "agentlightning.adapter"

# On a span recorded by another GenAI instrumentation (OpenLLMetry, OpenTelemetry's openai-v2) and read as ours:
# the span source's name. Where such a span and one of our adapters' spans record the same call, ours is kept.
SPAN_SOURCE = "agentlightning.span.source"

# OpenTelemetry's exception event name.
EVENT_EXCEPTION = "exception"
