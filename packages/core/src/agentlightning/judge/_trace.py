"""A finished rollout as the judge reads it: its steps (LLM calls) in order, with agent names, tool calls and results.

The trace is rebuilt from the store as the transitions are (`build_trace_tree`; the proxy's records joined to LLM
spans by ``gen_ai.response.id``), so a step the judge scores is the step a transition trains: a step is named by its
LLM span id (or, for an agent run without its adapter, the proxy record's call id), the ids a `Transition` keeps in
``metadata["span_ids"]`` and ``call_ids``. Reward spans are left out: the judge never sees the checker's verdict.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentlightning import semconv
from agentlightning._models import LLMCall, Span
from agentlightning.store import LightningStore
from agentlightning.transitions import TraceTree, build_trace_tree

__all__ = ["JudgedTrace", "TraceStep", "read_trace", "trace_from_records"]

_CONTENT_CHARS = 2000  # longest text of one message shown to the judge


@dataclass(frozen=True)
class TraceStep:
    """One LLM call of a rollout, as the judge sees it.

    Attributes:
        number: 1-based position among the rollout's LLM calls (what the judge answers with).
        step_id: The LLM span id (or the proxy record's call id when the call has no span).
        agent_name: The agent that made the call (``None``: unknown).
        text: What was new in the call's input (the task, tool results, user turns) and what the model answered.
        is_span: Whether ``step_id`` is a span id (else a proxy record's call id).
    """

    number: int
    step_id: str
    agent_name: str | None
    text: str
    is_span: bool = True


@dataclass(frozen=True)
class JudgedTrace:
    """A rollout's last attempt, rendered for the judge.

    Attributes:
        rollout_id: The rollout.
        attempt_id: Its last attempt (where the judge's verdicts are stored).
        group_id: The rollout's group (the rollouts of one task).
        task: The rollout's input.
        steps: The LLM calls in order.
        tools: Tool spans in order, as ``(after step number, line)``.
        trace_id: A trace id of the attempt's spans (the verdict spans join that trace).
        next_sequence: A sequence id after every span of the attempt (the verdict spans come last).
    """

    rollout_id: str
    attempt_id: str
    group_id: str | None
    task: Any
    steps: list[TraceStep]
    tools: list[tuple[int, str]] = field(default_factory=list[tuple[int, str]])
    trace_id: str | None = None
    next_sequence: int = 0

    def render(self, max_chars: int) -> str:
        """The trace as text: each step with its agent, and the tools called between steps (cut in the middle
        past ``max_chars``)."""
        lines: list[str] = []
        tools_after: dict[int, list[str]] = {}
        for after, line in self.tools:
            tools_after.setdefault(after, []).append(line)
        lines.extend(f"  {line}" for line in tools_after.get(0, []))
        for step in self.steps:
            lines.append(f"[step {step.number}] agent={step.agent_name or 'unknown'}")
            lines.append(step.text)
            lines.extend(f"  {line}" for line in tools_after.get(step.number, []))
        text = "\n".join(lines) if lines else "(the rollout made no LLM call)"
        if len(text) > max_chars:
            half = max_chars // 2
            text = f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"
        return text


def _text(content: Any) -> str:
    """Message content (a string or a list of parts) as text, cut to `_CONTENT_CHARS`."""
    if content is None:
        return ""
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts: list[str] = []
        for part in content:  # pyright: ignore[reportUnknownVariableType]
            if isinstance(part, dict):
                value = part.get("text")  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
                parts.append(value if isinstance(value, str) else f"[{part.get('type', 'part')}]")  # pyright: ignore
            else:
                parts.append(str(part))  # pyright: ignore[reportUnknownArgumentType]
        text = " ".join(parts)
    else:
        text = json.dumps(content, default=str)
    return text if len(text) <= _CONTENT_CHARS else text[:_CONTENT_CHARS] + " [...]"


def _tool_calls(message: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            out.append(f"calls tool {function.get('name')}({_text(function.get('arguments'))})")
    return out


def _new_inputs(request: dict[str, Any]) -> list[str]:
    """The request's messages after its last assistant message: what is new to the model in this call."""
    messages = [m for m in request.get("messages") or [] if isinstance(m, dict)]
    last_assistant = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
    out: list[str] = []
    for message in messages[last_assistant + 1 :]:
        role = message.get("role", "?")
        name = f" {message['name']}" if isinstance(message.get("name"), str) else ""
        out.append(f"  {role}{name}: {_text(message.get('content'))}")
    return out


def _answer(call: LLMCall | None) -> list[str]:
    if call is None or not isinstance(call.response, dict):
        return ["  assistant: (the answer was not recorded)"]
    choices = call.response.get("choices") or [{}]
    message = choices[0].get("message") if isinstance(choices[0], dict) else None
    if not isinstance(message, dict):
        return ["  assistant: (no message)"]
    lines = [f"  assistant: {_text(message.get('content'))}"]
    lines.extend(f"  assistant {line}" for line in _tool_calls(message))
    return lines


def _step_text(call: LLMCall | None) -> str:
    inputs = _new_inputs(call.request) if call is not None else ["  (the request was not recorded)"]
    return "\n".join(inputs + _answer(call))


def _agent_of(span: Span, tree: TraceTree) -> str | None:
    name = span.attributes.get(semconv.GEN_AI_AGENT_NAME)
    if isinstance(name, str) and name:
        return name
    for ancestor in tree.ancestors(span.span_id):
        if ancestor.attributes.get(semconv.SPAN_KIND) == semconv.KIND_AGENT:
            agent = ancestor.attributes.get(semconv.GEN_AI_AGENT_NAME)
            return agent if isinstance(agent, str) and agent else ancestor.name
    return None


def trace_from_records(
    rollout_id: str,
    attempt_id: str,
    group_id: str | None,
    task: Any,
    spans: Sequence[Span],
    calls: Sequence[LLMCall],
) -> JudgedTrace:
    """Render one attempt from its spans and proxy records (see the module docstring for the rules)."""
    own = [s for s in spans if s.attributes.get(semconv.SPAN_KIND) != semconv.KIND_JUDGE]
    tree = build_trace_tree(own)
    by_response = {c.response_id: c for c in calls if c.response_id is not None}
    steps: list[TraceStep] = []
    tools: list[tuple[int, str]] = []
    referenced: set[str] = set()
    for span in tree.ordered:
        kind = span.attributes.get(semconv.SPAN_KIND)
        if kind == semconv.KIND_LLM:
            response_id = span.attributes.get(semconv.GEN_AI_RESPONSE_ID)
            call = by_response.get(response_id) if isinstance(response_id, str) else None
            if call is not None:
                referenced.add(call.call_id)
            steps.append(TraceStep(len(steps) + 1, span.span_id, _agent_of(span, tree), _step_text(call)))
        elif kind == semconv.KIND_TOOL:
            name = span.attributes.get(semconv.GEN_AI_TOOL_NAME) or span.name
            failed = f" failed: {span.status.description or 'error'}" if span.status.code == "error" else ""
            tools.append((len(steps), f"tool {name} ran{failed}"))
    if not steps:  # an agent run without its adapter: the proxy's records are the steps
        for call in sorted(calls, key=lambda c: c.start_time):
            if call.call_id not in referenced:
                steps.append(TraceStep(len(steps) + 1, call.call_id, call.agent_name, _step_text(call), False))
    trace_id = own[0].trace_id if own else None
    next_sequence = max((s.sequence_id for s in spans), default=-1) + 1
    return JudgedTrace(rollout_id, attempt_id, group_id, task, steps, tools, trace_id, next_sequence)


async def read_trace(store: LightningStore, rollout_id: str) -> JudgedTrace | None:
    """The rollout's last attempt from ``store``, rendered (``None``: the rollout has no attempt)."""
    rollout = await store.get_rollout(rollout_id)
    attempts = await store.query_attempts(rollout_id)
    if not attempts:
        return None
    attempt = max(attempts, key=lambda a: a.sequence)
    spans = await store.query_spans(rollout_id, attempt.attempt_id)
    calls = await store.query_llm_calls(rollout_id, attempt.attempt_id)
    return trace_from_records(rollout_id, attempt.attempt_id, rollout.group_id, rollout.input, spans, calls)
