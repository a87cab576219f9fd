"""Policies: which weights serve (and train on) each agent's LLM calls, chosen by the agent's name.

A run may train several policies on one base model (LoRA adapters) while other agents use the frozen base. A
`PolicyMap` says which agent uses which policy: agent names or glob patterns (``writer``, ``sql_*``) mapped to
policy names. The agent's code does not change: our ``openai`` client instrumentation sends the name of the agent
making each call (`AGENT_HEADER`, from the adapter's agent span) and the LLM proxy picks the policy from it
(`PolicyMap.resolve`), asks the backend for that policy's model (an adapter is served under its policy's name, the
frozen base under the base model's name), and records the policy on the call's `LLMCall`. An agent that already
names a model per sub-agent (``model="writer"``) is routed by that name when it names a policy.

A call whose agent is unknown (no header, or a name no entry matches) is served by the default policy and counted
(the proxy's ``/admin/status``), never dropped.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from typing import NamedTuple
from urllib.parse import quote, unquote

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

__all__ = ["AGENT_HEADER", "FROZEN", "PolicyMap", "PolicyRoute", "decode_agent_header", "encode_agent_header"]

FROZEN = "frozen"
"""The policy name of the frozen base model: served as it is, never trained."""

AGENT_HEADER = "x-agentlightning-agent"
"""The HTTP header naming the agent that makes an LLM call (percent-encoded UTF-8)."""

_POLICY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_GLOB = re.compile(r"[*?\[]")


def encode_agent_header(name: str) -> str:
    """An agent name as `AGENT_HEADER`'s value (HTTP headers carry ASCII: anything else is percent-encoded)."""
    return quote(name, safe="")


def decode_agent_header(value: str | None) -> str | None:
    """The agent name an `AGENT_HEADER` value carries (``None`` for no header or an empty one)."""
    if not value:
        return None
    return unquote(value) or None


class PolicyRoute(NamedTuple):
    """Where one call goes (`PolicyMap.resolve`).

    Attributes:
        policy: The policy that serves the call.
        matched: Whether an entry matched (the call's model or its agent); ``False``: the default policy served it.
    """

    policy: str
    matched: bool


class PolicyMap(BaseModel):
    """Which policy serves each agent: agent names or glob patterns mapped to policy names.

    Attributes:
        agents: Agent name or glob pattern (``fnmatch``: ``*``, ``?``, ``[...]``) -> policy name. Exact names are
            tried first, then patterns in the order given. `FROZEN` maps an agent to the untrained base model.
        default: The policy of calls whose agent matches no entry, or is not known (default: `FROZEN`).

    Example:
        >>> PolicyMap(agents={"writer": "writer", "rewriter": "rewriter", "checker": FROZEN}).resolve("writer", None)
        PolicyRoute(policy='writer', matched=True)
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    agents: dict[str, str] = Field(default_factory=dict[str, str])
    default: str = FROZEN

    @field_validator("agents")
    @classmethod
    def _check_agents(cls, value: dict[str, str]) -> dict[str, str]:
        for agent, policy in value.items():
            if not agent:
                raise ValueError("an agent name or pattern must not be empty")
            _check_policy_name(policy)
        return value

    @field_validator("default")
    @classmethod
    def _check_default(cls, value: str) -> str:
        return _check_policy_name(value)

    _exact: dict[str, str] = PrivateAttr(default_factory=dict[str, str])
    _patterns: list[tuple[re.Pattern[str], str]] = PrivateAttr(default_factory=list[tuple[re.Pattern[str], str]])

    def model_post_init(self, context: object, /) -> None:
        """Split exact names from patterns once (a lookup runs per LLM call)."""
        self._exact = {k: v for k, v in self.agents.items() if not _GLOB.search(k)}
        self._patterns = [(re.compile(fnmatch.translate(k)), v) for k, v in self.agents.items() if _GLOB.search(k)]

    @classmethod
    def parse(cls, entries: Iterable[str], default: str | None = None) -> PolicyMap:
        """A map from ``AGENT=POLICY`` strings (what ``agl train --policy`` takes).

        Raises:
            ValueError: An entry is not ``AGENT=POLICY``, names an agent twice, or a policy name is not valid.
        """
        agents: dict[str, str] = {}
        for entry in entries:
            agent, sep, policy = entry.partition("=")
            agent, policy = agent.strip(), policy.strip()
            if not sep or not agent or not policy:
                raise ValueError(
                    f"a policy entry is AGENT=POLICY (e.g. writer=writer, checker={FROZEN}), got {entry!r}"
                )
            if agent in agents:
                raise ValueError(f"agent {agent!r} is mapped twice ({agents[agent]!r} and {policy!r})")
            agents[agent] = policy
        return cls(agents=agents, default=default or FROZEN)

    @property
    def policies(self) -> list[str]:
        """Every policy named (the default included), in the order first named."""
        return list(dict.fromkeys([*self.agents.values(), self.default]))

    @property
    def trained(self) -> list[str]:
        """The policies that train (every one but `FROZEN`): one LoRA adapter each."""
        return [p for p in self.policies if p != FROZEN]

    def policy_of(self, agent: str | None) -> str | None:
        """The policy an entry maps ``agent`` to, or ``None`` when none matches."""
        if agent is None:
            return None
        found = self._exact.get(agent)
        if found is not None:
            return found
        for pattern, policy in self._patterns:
            if pattern.fullmatch(agent):
                return policy
        return None

    def resolve(self, agent: str | None, model: object) -> PolicyRoute:
        """The policy of a call by ``agent`` asking for ``model``.

        A request whose ``model`` names a policy (an agent that names a model per sub-agent) goes there; otherwise
        the agent's entry decides; otherwise the default policy serves it (``matched=False``).
        """
        if isinstance(model, str) and model in self.policies:
            return PolicyRoute(model, True)
        found = self.policy_of(agent)
        if found is not None:
            return PolicyRoute(found, True)
        return PolicyRoute(self.default, False)

    def model_for(self, policy: str, base_model: str | None) -> str | None:
        """The model name to ask the backend for: the adapter's name, or ``base_model`` for `FROZEN`."""
        return base_model if policy == FROZEN else policy

    def to_mapping(self) -> Mapping[str, str]:
        """The entries as a plain dict (for configs and logs)."""
        return dict(self.agents)


def _check_policy_name(name: str) -> str:
    if not _POLICY_NAME.match(name):
        raise ValueError(
            f"a policy name is 1-64 letters, digits, '_', '.' or '-' starting with a letter or digit (it names a LoRA "
            f"adapter and a folder), got {name!r}"
        )
    return name
