"""The runner and the ``@rollout`` decorator for the user's agent function."""

from agentlightning.runner._agent import RolloutAgent, as_agent, reward_from_result, rollout
from agentlightning.runner._execute import ROOT_SPAN_NAME, Outcome
from agentlightning.runner._load import load_agent
from agentlightning.runner._runner import Runner, WorkerMode
from agentlightning.runner._slots import SlotRegistrar

__all__ = [
    "ROOT_SPAN_NAME",
    "Outcome",
    "RolloutAgent",
    "Runner",
    "SlotRegistrar",
    "WorkerMode",
    "as_agent",
    "load_agent",
    "reward_from_result",
    "rollout",
]
