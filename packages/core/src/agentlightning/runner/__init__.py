"""The runner and the ``@rollout`` decorator for the user's agent function."""

from agentlightning.runner._agent import RolloutAgent, as_agent, reward_from_result, rollout
from agentlightning.runner._command import CommandAgent, CommandAgentError, command_environment, parse_reward_line
from agentlightning.runner._execute import ROOT_SPAN_NAME, Outcome
from agentlightning.runner._load import load_agent
from agentlightning.runner._runner import Runner, WorkerMode
from agentlightning.runner._slots import SlotRegistrar

__all__ = [
    "ROOT_SPAN_NAME",
    "CommandAgent",
    "CommandAgentError",
    "Outcome",
    "RolloutAgent",
    "Runner",
    "SlotRegistrar",
    "WorkerMode",
    "as_agent",
    "command_environment",
    "load_agent",
    "parse_reward_line",
    "reward_from_result",
    "rollout",
]
