"""The proxy's policy routing: each call goes to the policy of the agent that makes it (`agentlightning.PolicyMap`).

`PolicyRouter` resolves a call's policy from its agent header and requested model, names the model the backend
serves for it (the LoRA adapter's name, or the base model for `FROZEN`), keeps the model version of each policy
for backends that report none (vLLM), and counts calls per policy and calls that no entry matched, by agent name.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

from agentlightning._policies import FROZEN, PolicyMap

__all__ = ["PolicyRouter", "RoutedCall"]

_MAX_UNMAPPED_NAMES = 1000
_NO_AGENT = "<no agent header>"


class RoutedCall(NamedTuple):
    """Where a call goes: its policy and the model name to ask the backend for (``None``: leave it as sent)."""

    policy: str
    model: str | None


class PolicyRouter:
    """Routes calls to policies and counts them (what ``/admin/status`` reports).

    Args:
        policies: Which agent uses which policy.
        base_model: The model name the backend serves the base under (the proxy's ``served_model``); ``None``
            leaves a frozen call's model as the agent sent it.
    """

    def __init__(self, policies: PolicyMap, base_model: str | None = None) -> None:
        self.policies = policies
        self.base_model = base_model
        self.calls: dict[str, int] = {}
        """Calls routed to each policy since the start."""
        self.unmapped_calls = 0
        """Calls whose agent matched no entry (or was not named): served by the default policy."""
        self.unmapped_agents: dict[str, int] = {}
        """Those calls by agent name (the first 1,000 names; ``<no agent header>`` for calls naming none)."""
        self.versions: dict[str, int] = {}
        """Per policy, the version recorded on its calls when the backend reports none (set after a sync)."""
        self._lock = threading.Lock()

    def route(self, agent: str | None, model: object) -> RoutedCall:
        """The policy of a call by ``agent`` asking for ``model``, counted."""
        policy, matched = self.policies.resolve(agent, model)
        with self._lock:
            self.calls[policy] = self.calls.get(policy, 0) + 1
            if not matched:
                self.unmapped_calls += 1
                name = agent if agent is not None else _NO_AGENT
                if name in self.unmapped_agents or len(self.unmapped_agents) < _MAX_UNMAPPED_NAMES:
                    self.unmapped_agents[name] = self.unmapped_agents.get(name, 0) + 1
        if policy == FROZEN:
            return RoutedCall(policy, self.base_model)
        return RoutedCall(policy, policy)

    def version(self, policy: str, fallback: int | None) -> int | None:
        """The version recorded on ``policy``'s calls when the backend reports none."""
        return self.versions.get(policy, fallback)

    def status(self) -> dict[str, object]:
        """Counters for ``/admin/status``."""
        with self._lock:
            return {
                "policy_calls": dict(self.calls),
                "unmapped_calls": self.unmapped_calls,
                "unmapped_agents": dict(self.unmapped_agents),
                "policy_versions": dict(self.versions),
            }
