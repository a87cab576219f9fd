"""The runner and the ``@rollout`` decorator for the user's agent function."""

from typing import Any

from agentlightning._deprecation import warn_renamed
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


def __getattr__(name: str) -> Any:
    """Deprecated names: ``final_reward`` is `reward_from_result` (a function, not the `Transition` field)."""
    if name == "final_reward":
        warn_renamed(
            "agentlightning.runner.final_reward", "agentlightning.runner.reward_from_result", removed_in="0.3.0"
        )
        return reward_from_result
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
