"""Apps instrumented with OpenLLMetry the way apps set it up, trained with no line of ours.

``Traceloop.init()`` turns on every installed instrumentation at once (LangChain *and* OpenAI under LangGraph;
Agents *and* OpenAI under the Agents SDK) on a global provider of its own, with the app's exporter; a single
instrumentor runs under the app's own global provider and exporter. For a LangGraph multi-agent graph, an Agents
SDK handoff and a plain OpenAI agent, each run by `agentlightning.Runner` through the LLM proxy: one transition per
served call with the served token ids, each node / agent named (on the transition and in the proxy's agent header),
the rollout's own reward on every transition, ``agent_filter`` picking that agent's calls, the app's provider still
the global one and its exporter still fed.

Each setup runs in a fresh interpreter (`tests/openllmetry_app.py`): the global provider is set once per process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

APP = Path(__file__).with_name("openllmetry_app.py")

# per agent: the agent names of one rollout's calls, in order, and the calls agent_filter keeps
EXPECTED: dict[str, tuple[list[str | None], list[str] | None]] = {
    "langgraph": (["researcher", "researcher", "writer", "critic"], ["writer"]),
    "agents": (["triage", "math", "math"], ["math", "math"]),
    "openai": ([None, None], None),
}
SCOPES = {
    "langgraph": "opentelemetry.instrumentation.langchain",
    "agents": "opentelemetry.instrumentation.openai_agents",
    "openai": "opentelemetry.instrumentation.openai.v1",
}


def run_app(setup: str, *agents: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    done = subprocess.run(
        [sys.executable, str(APP), setup, *agents], capture_output=True, text=True, timeout=840, env=env
    )
    assert done.returncode == 0, done.stderr[-6000:]
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["global_is_the_apps"], "the app's global provider was replaced"
    return report


def check(report: dict[str, Any], agent: str) -> None:
    names, filtered = EXPECTED[agent]
    got = report[agent]
    assert got["served"] == 2 * len(names)
    for rollout in got["rollouts"]:
        assert rollout["calls"] == len(names)
        assert rollout["joined_by_response_id"] == len(names) and rollout["exact_ids"], rollout
        assert rollout["agents"] == names, rollout
        assert rollout["final_rewards"] == [rollout["reward"]] * len(names), rollout
        assert rollout["attempts_without_reward"] == 0
        assert rollout["filtered"] == filtered
        if agent != "openai":  # the proxy heard each call's agent (policies are routed by it)
            assert rollout["call_agents"] == names, rollout
    assert got["exported"].get(SCOPES[agent], 0) > 0, got["exported"]


def test_traceloop_init_apps() -> None:
    """``Traceloop.init()`` with the app's exporter: LangGraph, the Agents SDK and plain OpenAI in one app."""
    report = run_app("traceloop", "langgraph", "agents", "openai")
    for agent in ("langgraph", "agents", "openai"):
        check(report, agent)
    # every instrumentation it turned on still reports to the app: the Agents SDK's calls through both
    assert report["agents"]["exported"].get(SCOPES["openai"], 0) > 0


@pytest.mark.parametrize(
    ("setup", "agent"),
    [("langchain", "langgraph"), ("openai_agents", "agents"), ("openai_agents+openai", "agents"), ("openai", "openai")],
)
def test_instrumentors_under_the_apps_provider(setup: str, agent: str) -> None:
    """OpenLLMetry's instrumentors, one or the pair ``Traceloop.init()`` turns on for the Agents SDK, under the app's
    own global provider and exporter."""
    check(run_app(setup, agent), agent)
