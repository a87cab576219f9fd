"""Chat templates: OpenAI chat messages to token ids, and generated ids back to content or tool calls.

`CalcChatTemplate` is the contract between the calculator agent and the tiny model. Its rendering is
*prefix-extending*: re-rendering a conversation after a tool round yields exactly the previous prompt ids, then
the previous response ids (eos included), then the observation ids. That is what lets the transition builder
merge the turns of one episode into a single trajectory sample.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from agentlightning_torch._tokenizer import CharTokenizer
from agentlightning_torch._tool_parsers import CalcToolParser

__all__ = ["CalcChatTemplate", "ChatTemplate", "ParsedResponse", "TemplateError", "text_of"]


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

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ids, special tokens skipped."""
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


class CalcChatTemplate:
    """Renders calculator conversations for the tiny character-level model.

    Layout (``<bos>`` once at the start)::

        system/user   -> <content> "\\n"
        assistant     -> <content> <eos>                   (plain answer, e.g. "A:1788")
        assistant     -> "CALC(" <expression> ")" <eos>    (one per calculator tool call)
        tool          -> "R:" <content> "\\n"

    The generation prompt adds nothing: the model continues right after the last message.

    Args:
        tokenizer: The character tokenizer (every rendered character must be in its alphabet).
        tool_name: Name of the function tool rendered as ``CALC(...)``.
    """

    def __init__(self, tokenizer: CharTokenizer, tool_name: str = "calculator") -> None:
        self.tokenizer = tokenizer
        self.tool_name = tool_name
        self._parser = CalcToolParser(tool_name=tool_name)

    def _encode(self, text: str, where: str) -> list[int]:
        try:
            return self.tokenizer.encode(text)
        except ValueError as error:
            raise TemplateError(f"{where}: {error}") from error

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Token ids of ``messages``.

        ``tools``, ``add_generation_prompt`` and ``template_kwargs`` are accepted for interface compatibility; none
        changes the ids.

        Raises:
            TemplateError: On an unknown role, a tool call to another function, arguments that are not JSON with
                an ``expression`` string, or a character outside the tokenizer's alphabet.
        """
        del tools, add_generation_prompt, template_kwargs
        if not messages:
            raise TemplateError("the conversation has no messages")
        eos = self.tokenizer.eos_token_id
        ids = [self.tokenizer.bos_token_id]
        for index, message in enumerate(messages):
            role = message.get("role")
            where = f"messages[{index}] ({role})"
            if role in ("system", "developer", "user"):
                ids += self._encode(text_of(message.get("content"), where) + "\n", where)
            elif role == "assistant":
                calls = message.get("tool_calls") or []
                text = text_of(message.get("content"), where)
                if text or not calls:
                    ids += [*self._encode(text, where), eos]
                for call in calls:
                    ids += [*self._encode(f"CALC({self._expression_of(call, where)})", where), eos]
            elif role == "tool":
                ids += self._encode("R:" + text_of(message.get("content"), where) + "\n", where)
            else:
                raise TemplateError(f"{where}: unsupported role {role!r}")
        return ids

    def _expression_of(self, call: Any, where: str) -> str:
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping):
            raise TemplateError(f"{where}: a tool call needs a 'function' object, got {call!r}")
        name = function.get("name")  # type: ignore[reportUnknownMemberType]
        if name != self.tool_name:
            raise TemplateError(f"{where}: only the {self.tool_name!r} tool can be rendered, got {name!r}")
        raw = function.get("arguments")  # type: ignore[reportUnknownMemberType]
        try:
            arguments = json.loads(raw) if isinstance(raw, str) else raw
        except json.JSONDecodeError as error:
            raise TemplateError(f"{where}: tool call arguments are not JSON: {raw!r}") from error
        expression = arguments.get("expression") if isinstance(arguments, Mapping) else None
        if not isinstance(expression, str):
            raise TemplateError(f"{where}: tool call arguments need an 'expression' string, got {raw!r}")
        return expression

    def declares_tool(self, tools: Sequence[Mapping[str, Any]] | None) -> bool:
        """Whether the request's ``tools`` declare this template's function tool."""
        for tool in tools or ():
            function = tool.get("function")
            if (
                tool.get("type", "function") == "function"
                and isinstance(function, Mapping)
                and function.get("name") == self.tool_name  # type: ignore[reportUnknownMemberType]
            ):
                return True
        return False

    def parse_response(
        self,
        token_ids: Sequence[int],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        prompt_ids: Sequence[int] = (),
        text: str | None = None,
    ) -> ParsedResponse:
        """``CALC(<expr>)`` becomes a calculator tool call when the request declared the tool; anything else is text.

        The text is the decoded ids without special tokens; a trailing eos is the normal end of a turn. Parsing is
        the registered ``calc`` tool parser's.
        """
        del prompt_ids
        body = self.tokenizer.decode(token_ids) if text is None else text
        content, calls = self._parser.parse(body, tools or [])
        return ParsedResponse(content=content, tool_calls=calls)

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ids, special tokens skipped."""
        return self.tokenizer.decode(token_ids)

    def token_texts(self, token_ids: Sequence[int]) -> list[str]:
        """Each id's token (special tokens by name, e.g. ``<eos>``)."""
        return self.tokenizer.convert_ids_to_tokens(token_ids)

    def encode_text(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``, after ``<bos>`` when ``add_special_tokens``.

        Raises:
            TemplateError: If a character is outside the tokenizer's alphabet.
        """
        ids = self._encode(text, "prompt")
        return [self.tokenizer.bos_token_id, *ids] if add_special_tokens else ids

    @property
    def markers(self) -> tuple[str, ...]:
        """``CALC(``: where a streaming server starts holding text back."""
        return self._parser.markers
