"""Checks of each LLM call, counted per agent and call site: captured, token ids, template, prefix, tools, length."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from agentlightning._models import LLMCall
from agentlightning.doctor._evidence import NO_SPAN_SITE, UNMATCHED_SITE, CallView, RolloutEvidence
from agentlightning.doctor._report import Finding, SiteReport
from agentlightning.semconv import PROMPT_TOKEN_IDS, RESPONSE_TOKEN_IDS
from agentlightning.transitions import TransitionConfig

__all__ = ["ChatRenderer", "check_calls", "site_findings"]

# What a model's tool call looks like in text when the server's parser did not read it (hermes, Llama 3, Mistral,
# functionary): an answer with one of these and no parsed tool call was a call attempt the server lost.
_TOOL_MARKERS = ("<tool_call>", "<function=", "[TOOL_CALLS]", "<|python_tag|>", '"arguments":', '"parameters":')
_PROBE = "\u2063agl-doctor-probe\u2063"


@runtime_checkable
class ChatRenderer(Protocol):
    """The model's own chat template: renders a conversation to the ids (and text) the model is prompted with.

    The torch engine's Hugging Face template (the tokenizer's ``apply_chat_template``) is one.
    """

    def render(self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping[str, Any]] | None = None) -> Any:
        """Token ids of the conversation, with the generation prompt."""
        ...

    def render_text(
        self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping[str, Any]] | None = None
    ) -> str:
        """The prompt text of the conversation, with the generation prompt."""
        ...


def _choice(record: LLMCall) -> dict[str, Any]:
    response = record.response or {}
    choices = response.get("choices")
    return choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}  # pyright: ignore[reportUnknownVariableType]


def _answer_text(choice: Mapping[str, Any]) -> tuple[str, bool]:
    """The answer's text and whether the server parsed a tool call from it."""
    message = choice.get("message")
    if isinstance(message, Mapping):
        content: Any = message.get("content")  # pyright: ignore[reportUnknownMemberType]
        parsed = bool(message.get("tool_calls"))  # pyright: ignore[reportUnknownMemberType]
        return (content if isinstance(content, str) else ""), parsed
    text = choice.get("text")
    return (text if isinstance(text, str) else ""), False


def _tool_names(request: Mapping[str, Any]) -> list[str]:
    names: list[str] = []
    for tool in request.get("tools") or []:
        function = tool.get("function") if isinstance(tool, Mapping) else None
        name = function.get("name") if isinstance(function, Mapping) else None  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
        if isinstance(name, str) and name:
            names.append(name)
    return names


def _attempted(text: str, tools: Sequence[str]) -> bool:
    """Whether an answer's text reads as a tool call the server did not turn into one."""
    if any(marker in text for marker in _TOOL_MARKERS):
        return True
    return any(f"{name}(" in text or f'"{name}"' in text for name in tools)


def _user_marker(renderer: ChatRenderer) -> str:
    """The line the model's template opens a user turn with (``""``: the template has none to look for)."""
    try:
        text = renderer.render_text([{"role": "user", "content": _PROBE}])
    except Exception:  # a template that refuses a bare user turn: nothing to compare with
        return ""
    before = text.split(_PROBE, 1)[0]
    lines = [line.strip() for line in before.splitlines() if line.strip()]
    return lines[-1] if lines else ""


class _TemplateCheck:
    """Re-render each recorded prompt with the model's own template and compare it with the recorded ids."""

    def __init__(self, renderer: ChatRenderer | None) -> None:
        self.renderer = renderer
        self._marker: str | None = None

    def equal(self, record: LLMCall) -> bool | None:
        """Whether the recorded prompt is the model's template rendering (``None``: cannot tell)."""
        if self.renderer is None or not record.prompt_token_ids:
            return None
        request = record.request
        messages = request.get("messages")
        if isinstance(messages, list):
            tools = request.get("tools") or None
            try:
                ids = list(self.renderer.render(messages, tools=tools))  # pyright: ignore[reportUnknownArgumentType]
            except Exception:  # the model's template refuses the conversation the backend accepted: it differs
                return False
            return ids == record.prompt_token_ids
        prompt = request.get("prompt")
        if isinstance(prompt, str):  # the agent rendered the prompt itself (completions API): look for the template
            if self._marker is None:
                self._marker = _user_marker(self.renderer)
            return None if not self._marker else self._marker in prompt
        return None


def _ids_of(view: CallView) -> tuple[list[int], list[int]] | None:
    if view.record is not None:
        prompt, response = view.record.prompt_token_ids, view.record.response_token_ids
        return (prompt, response) if prompt and response else None
    if view.span is not None:
        prompt, response = view.span.attributes.get(PROMPT_TOKEN_IDS), view.span.attributes.get(RESPONSE_TOKEN_IDS)
        if isinstance(prompt, list) and isinstance(response, list) and prompt and response:
            return [int(x) for x in prompt], [int(x) for x in response]  # pyright: ignore[reportArgumentType]
    return None


def check_calls(
    evidence: Iterable[RolloutEvidence], renderer: ChatRenderer | None, config: TransitionConfig
) -> dict[tuple[str | None, str], SiteReport]:
    """Count every call's checks per ``(agent, site)``."""
    sites: dict[tuple[str | None, str], SiteReport] = {}
    template = _TemplateCheck(renderer)
    for item in evidence:
        previous: dict[str | None, tuple[list[int], list[int]]] = {}  # the agent's last call with ids
        for view in item.calls:
            site = sites.get((view.agent, view.site))
            if site is None:
                site = sites[(view.agent, view.site)] = SiteReport(view.agent, view.site)
            site.calls += 1
            site.trained += int(config.trains(view.agent))
            ids = _ids_of(view)
            record = view.record
            if record is not None:
                site.recorded += 1
                site.with_token_ids += int(ids is not None)
                equal = template.equal(record)
                if equal is not None:
                    site.template_checked += 1
                    site.template_equal += int(equal)
                choice = _choice(record)
                site.truncated += int(choice.get("finish_reason") == "length")
                text, parsed = _answer_text(choice)
                if parsed or _attempted(text, _tool_names(record.request)):
                    site.tool_calls_attempted += 1
                    site.tool_calls_parsed += int(parsed)
            if ids is None:
                site.bypassed += int(record is None)
                continue
            before = previous.get(view.agent)
            if before is not None:
                site.multi_turn += 1
                head, tail = before
                n, m = len(head), len(tail)
                prompt = ids[0]
                site.prefix_extends += int(prompt[:n] == head and prompt[n : n + m] == tail)
            previous[view.agent] = ids
    return sites


def _of(part: int, whole: int) -> str:
    return f"{part} of {whole}"


def site_findings(site: SiteReport) -> list[Finding]:  # one short rule per check, in report order
    """The problems and warnings of one call site, each with its fix."""
    out: list[Finding] = []
    where = site.where

    def add(check: str, severity: str, message: str) -> None:
        out.append(Finding(check, severity, message, where))  # type: ignore[arg-type]  # the two literals below

    bypassed = site.bypassed
    if bypassed:
        add(
            "bypassed-proxy",
            "problem",
            f"{_of(bypassed, site.calls)} calls never reached the LLM proxy (no token ids, not trainable): the client "
            "uses another base URL, or was built for an earlier rollout and kept; build it in each rollout with "
            "base_url=agl.llm_base_url()",
        )
    if site.site == NO_SPAN_SITE:
        add(
            "no-adapter",
            "warning" if site.trained else "problem",
            f"{site.calls} calls reached the proxy with no LLM span of an adapter: agent names are lost (every call "
            f"trains as one agent{'' if site.trained else '; agent_filter selects none of them'}); add the "
            "framework's adapter line (e.g. agentlightning_langchain.instrument(), agl.instrument_openai() or "
            "agl.instrument_all())",
        )
    if site.site == UNMATCHED_SITE:
        add(
            "unmatched-calls",
            "problem",
            f"{site.calls} calls were recorded under rollouts whose LLM spans do not name them: calls made for "
            "other rollouts (a client built for an earlier rollout and kept, a call made after its rollout ended) "
            "or by a framework without its adapter; build clients in each rollout from agl.llm_base_url(), and "
            "instrument every framework the agent uses",
        )
    if site.recorded - site.with_token_ids:
        add(
            "no-token-ids",
            "problem",
            f"{_of(site.recorded - site.with_token_ids, site.recorded)} recorded calls have no token ids: the "
            "backend ignored return_token_ids (or the call failed); serve the model with vLLM or the embedded backend",
        )
    if site.template_checked > site.template_equal:
        add(
            "template-mismatch",
            "problem",
            f"{_of(site.template_checked - site.template_equal, site.template_checked)} prompts differ from the "
            "model's own chat template: training would score tokens the model was not prompted with as it will be; "
            "let the server render the chat with the model's template (no --chat-template or chat_template of "
            "another model; no prompt the agent formats itself for the completions API)",
        )
    if site.multi_turn > site.prefix_extends:
        add(
            "prefix-broken",
            "warning",
            f"{_of(site.multi_turn - site.prefix_extends, site.multi_turn)} later turns do not extend the agent's "
            "previous prompt + response (the agent rewrites its history): each call trains alone, never as one "
            "multi-turn sample; keep the message list append-only (pass the model's answer back as it came)",
        )
    if site.tool_calls_attempted > site.tool_calls_parsed:
        add(
            "tool-calls-unparsed",
            "problem",
            f"{_of(site.tool_calls_attempted - site.tool_calls_parsed, site.tool_calls_attempted)} tool calls the "
            "model wrote were not parsed by the server (the agent saw text, the tool never ran): serve with the "
            "model's tool-call parser (--tool-parser NAME) or prompt the format that parser reads",
        )
    if site.truncated:
        every = site.truncated * 2 >= site.recorded
        add(
            "truncated",
            "problem" if every else "warning",
            f"{_of(site.truncated, site.recorded)} answers were cut by max_tokens (finish reason length): raise "
            "--max-tokens, or the max_tokens the agent passes",
        )
    return out
