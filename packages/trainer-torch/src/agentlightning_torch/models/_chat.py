"""Chat templates: OpenAI chat messages to token ids, and generated ids back to content or tool calls.

`ChatTemplate` is what a backend needs from one; `HFChatTemplate` is the implementation for every Hugging Face
model: the tokenizer's own chat template for prompts, a named tool-call parser for responses.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from jinja2 import TemplateError as JinjaTemplateError
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from agentlightning_torch.models._tool_parsers import ToolParser, get_tool_parser, guess_tool_parser, split_reasoning

__all__ = ["ChatTemplate", "HFChatTemplate", "ParsedResponse", "TemplateError", "text_of"]

_PROMPTS_KEPT = 512
"""Rendered prompts an `HFChatTemplate` keeps (a GRPO group's rollouts open with the same conversation)."""


class TemplateError(ValueError):
    """A conversation the template cannot render (the message names the offending message)."""


@dataclass(frozen=True)
class ParsedResponse:
    """What the generated text means in chat terms.

    Attributes:
        content: Assistant text, or ``None`` when the response is a tool call.
        tool_calls: OpenAI ``tool_calls`` entries (empty for plain content).
        reasoning_content: The ``<think>`` block's text, when the template splits reasoning out.
    """

    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=lambda: [])
    reasoning_content: str | None = None


@runtime_checkable
class ChatTemplate(Protocol):
    """What a backend needs from a chat template: prompts to ids, ids back to text, content and tool calls."""

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Token ids of the conversation, ready for the model to continue as the assistant."""
        ...

    def parse_response(
        self,
        token_ids: Sequence[int],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        prompt_ids: Sequence[int] = (),
        text: str | None = None,
    ) -> ParsedResponse:
        """Interpret generated ids (without the prompt) as content or tool calls (``text``: the decoded ids)."""
        ...

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """Text of ids, special tokens skipped unless ``skip_special_tokens`` is false."""
        ...

    def token_texts(self, token_ids: Sequence[int]) -> list[str]:
        """Each id's own text (for logprobs entries)."""
        ...

    def encode_text(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of plain text (completion prompts)."""
        ...

    @property
    def markers(self) -> tuple[str, ...]:
        """Strings that may begin a tool call or reasoning block (a streaming server holds text from there)."""
        ...


def text_of(content: Any, where: str) -> str:
    """Message content as text: a string, ``None``, or a list of ``{"type": "text", "text": ...}`` parts.

    Raises:
        TemplateError: On any other content (``where`` names the message).
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:  # type: ignore[reportUnknownVariableType]
            if not isinstance(part, Mapping) or part.get("type") != "text":  # type: ignore[reportUnknownMemberType]
                raise TemplateError(f"{where}: only text content parts are supported, got {part!r}")
            parts.append(str(part.get("text", "")))  # type: ignore[reportUnknownMemberType]
        return "".join(parts)
    raise TemplateError(f"{where}: content must be a string or a list of text parts, got {type(content).__name__}")


def _normalise_message(message: Mapping[str, Any], index: int) -> dict[str, Any]:
    """An OpenAI message as chat templates expect it: text content, tool-call arguments as objects (like vLLM)."""
    role = message.get("role")
    where = f"messages[{index}] ({role})"
    if not isinstance(role, str):
        raise TemplateError(f"{where}: a message needs a string 'role'")
    out: dict[str, Any] = {k: v for k, v in message.items() if v is not None}
    out["content"] = text_of(message.get("content"), where)
    calls: list[dict[str, Any]] = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping):
            raise TemplateError(f"{where}: a tool call needs a 'function' object, got {call!r}")
        raw = function.get("arguments")  # type: ignore[reportUnknownMemberType]
        try:
            arguments = json.loads(raw) if isinstance(raw, str) else (raw or {})
        except json.JSONDecodeError as error:
            raise TemplateError(f"{where}: tool call arguments are not JSON: {raw!r}") from error
        calls.append({**call, "function": {**function, "arguments": arguments}})  # type: ignore[reportUnknownArgumentType]
    if calls:
        out["tool_calls"] = calls
    return out


class HFChatTemplate:
    """Renders chat requests with the tokenizer's chat template and parses responses with a named tool parser.

    Args:
        tokenizer: A transformers tokenizer with a chat template.
        tool_parser: A registered parser name (``hermes``, ``llama3_json``, ``calc``, ...), a parser, or ``None``
            to pick one from the chat template's own tool-call format.
        reasoning: Split a leading ``<think>...</think>`` block into ``reasoning_content``.

    Raises:
        TemplateError: If the tokenizer has no chat template.
        ValueError: If ``tool_parser`` names no registered parser.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        *,
        tool_parser: str | ToolParser | None = None,
        reasoning: bool = False,
    ) -> None:
        template = tokenizer.chat_template
        if not template:
            raise TemplateError("the tokenizer has no chat template; set tokenizer.chat_template first")
        self.tokenizer = tokenizer
        text = template if isinstance(template, str) else json.dumps(template)
        if tool_parser is None:
            tool_parser = guess_tool_parser(text)
        self.tool_parser: ToolParser = get_tool_parser(tool_parser) if isinstance(tool_parser, str) else tool_parser
        self.reasoning = reasoning
        # A fast tokenizer's Rust tokenizer encodes a prompt ~4x cheaper than the tokenizer's __call__; it is used
        # once it gave the same ids as __call__ on this template's first prompt (see `encode_text`).
        self._backend: Any = getattr(tokenizer, "backend_tokenizer", None) if tokenizer.is_fast else None
        self._backend_checked = False
        self._token_texts: dict[int, str] = {}
        # Rendering is a function of the conversation, except in templates that read the clock (``strftime_now``).
        self._template = template
        self._prompts: OrderedDict[str, list[int]] | None = None if "strftime_now" in text else OrderedDict()
        self._prompts_lock = threading.Lock()

    # ----- prompts ------------------------------------------------------------------------------------------

    def render_text(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text the chat template renders.

        Raises:
            TemplateError: If the conversation is empty or malformed, or the template refuses it.
        """
        if not messages:
            raise TemplateError("the conversation has no messages")
        normalised = [_normalise_message(m, i) for i, m in enumerate(messages)]
        try:
            text = self.tokenizer.apply_chat_template(  # pyright: ignore[reportUnknownMemberType]
                normalised,  # pyright: ignore[reportArgumentType]
                tools=[dict(t) for t in tools] if tools else None,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                **dict(template_kwargs or {}),
            )
        except JinjaTemplateError as error:
            raise TemplateError(f"the chat template refused the conversation: {error}") from error
        if not isinstance(text, str):
            raise TemplateError(f"the chat template rendered {type(text).__name__}, not text")
        return text

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Token ids of the rendered prompt (tokenised as ``apply_chat_template`` does: no extra special tokens).

        The last few hundred prompts are kept by the JSON of their arguments: a conversation asked again (the
        rollouts of one task open alike) is neither rendered nor tokenised again.

        Raises:
            TemplateError: See `render_text`.
        """
        key = self._prompt_key(messages, tools, add_generation_prompt, template_kwargs)
        prompts = self._prompts
        if key is not None and prompts is not None:
            with self._prompts_lock:
                ids = prompts.get(key)
                if ids is not None:
                    prompts.move_to_end(key)
                    return list(ids)
        text = self.render_text(
            messages, tools=tools, add_generation_prompt=add_generation_prompt, template_kwargs=template_kwargs
        )
        ids = self.encode_text(text, add_special_tokens=False)
        if key is not None and prompts is not None:
            with self._prompts_lock:
                prompts[key] = list(ids)
                if len(prompts) > _PROMPTS_KEPT:
                    prompts.popitem(last=False)
        return ids

    def _prompt_key(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        add_generation_prompt: bool,
        template_kwargs: Mapping[str, Any] | None,
    ) -> str | None:
        """What a rendered prompt is kept under, or ``None`` (not kept: values that are not JSON, or the tokenizer's
        template was changed since)."""
        if self._prompts is None or self.tokenizer.chat_template is not self._template:
            return None
        try:
            return json.dumps([list(messages), tools, add_generation_prompt, template_kwargs])
        except (TypeError, ValueError):
            return None

    def encode_text(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of plain text (``/v1/completions`` prompts add the tokenizer's special tokens, as vLLM does).

        Raises:
            TemplateError: If the tokenizer cannot encode the text (e.g. a closed vocabulary without an unknown token).
        """
        try:
            backend = self._backend
            if backend is not None and self._backend_checked and self._backend_as_called(backend):
                return list(backend.encode(text, add_special_tokens=add_special_tokens).ids)
            ids: list[int] = [int(i) for i in self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]]
        except Exception as error:  # the tokenizers library raises plain Exception for text it cannot encode
            raise TemplateError(f"the tokenizer cannot encode {text[:60]!r}: {error}") from error
        if self._backend is not None and not self._backend_checked:
            same = list(self._backend.encode(text, add_special_tokens=add_special_tokens).ids) == ids
            self._backend, self._backend_checked = (self._backend if same else None), True
        return ids

    def _backend_as_called(self, backend: Any) -> bool:
        """Whether the Rust tokenizer is set as ``__call__`` sets it (another caller may have left padding on)."""
        split = bool(getattr(self.tokenizer, "split_special_tokens", False))
        return backend.truncation is None and backend.padding is None and backend.encode_special_tokens == split

    # ----- responses ----------------------------------------------------------------------------------------

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """Text of ids; special tokens skipped by default (vLLM's default; kept for a tool-call parser)."""
        text = self.tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens)  # pyright: ignore[reportUnknownMemberType]
        return str(text)

    def token_texts(self, token_ids: Sequence[int]) -> list[str]:
        """Each id's own text (for logprobs entries)."""
        texts = self._token_texts  # one id's text never changes: decoded once per id
        out: list[str] = []
        for t in token_ids:
            text = texts.get(t)
            if text is None:
                text = texts[t] = str(self.tokenizer.decode([t]))  # pyright: ignore[reportUnknownMemberType]
            out.append(text)
        return out

    @property
    def markers(self) -> tuple[str, ...]:
        """Strings from which a streaming server holds text back (tool calls, reasoning)."""
        return (*self.tool_parser.markers, *(("<think>",) if self.reasoning else ()))

    def opens_reasoning(self, prompt_ids: Sequence[int]) -> bool:
        """Whether the prompt itself ends inside an open ``<think>`` block."""
        if not self.reasoning:
            return False
        tail = str(self.tokenizer.decode(list(prompt_ids[-8:])))  # pyright: ignore[reportUnknownMemberType]
        return tail.rstrip().endswith("<think>")

    def parse_response(
        self,
        token_ids: Sequence[int],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        prompt_ids: Sequence[int] = (),
        text: str | None = None,
    ) -> ParsedResponse:
        """Content, tool calls (only when the request declared tools) and reasoning of generated ids.

        ``text`` replaces the decoded ids (a server cuts the text at a stop string first).
        """
        body = self.decode(token_ids) if text is None else text
        reasoning: str | None = None
        content: str | None = body
        if self.reasoning:
            reasoning, content = split_reasoning(body, opened=self.opens_reasoning(prompt_ids))
        calls: list[dict[str, Any]] = []
        if tools and content:
            content, calls = self.tool_parser.parse(content, tools)
        if content is None and not calls and reasoning is None:
            content = ""
        return ParsedResponse(content=content, tool_calls=calls, reasoning_content=reasoning)
