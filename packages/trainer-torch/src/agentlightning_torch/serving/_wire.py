"""Request bodies, sampling parameters and response pieces of the local backend's OpenAI-compatible server."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentlightning_torch.models._chat import ChatTemplate, ParsedResponse
from agentlightning_torch.serving._generate import GenerationResult, SamplingParams

__all__: list[str] = []


class SamplingRequest(BaseModel):
    """The sampling fields shared by chat and completion requests (vLLM's extras included)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    n: int = Field(default=1, ge=1, le=128)
    seed: int | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    return_token_ids: bool = False
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True


class ChatRequest(SamplingRequest):
    """``/v1/chat/completions`` body."""

    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    logprobs: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    include_reasoning: bool = True


class TokenizeRequest(BaseModel):
    """``/tokenize`` body (vLLM's): a chat to render with the model's template, or a text."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    messages: list[dict[str, Any]] | None = Field(default=None, min_length=1)
    prompt: str | None = None
    tools: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None


class CompletionRequest(SamplingRequest):
    """``/v1/completions`` body."""

    prompt: str | list[int]
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False


class BadRequest(Exception):
    """Answered with a 400 and an OpenAI-style error body."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ServerError(Exception):
    """Answered with a 500 and an OpenAI-style error body that says what went wrong.

    A handled error, unlike one raised into the HTTP server: that one answers a bare 500 and then closes the
    connection, which a client's pool may already have handed to its next request.
    """


def parse_body(model: type[BaseModel], body: bytes) -> Any:
    """Validate a JSON body; the first problem becomes a `BadRequest` naming the field."""
    try:
        return model.model_validate_json(body)
    except ValidationError as error:
        first = error.errors()[0]
        location = ".".join(str(part) for part in first["loc"])
        raise BadRequest(f"invalid request: {location}: {first['msg']}", location or None) from error


def sampling_params(request: SamplingRequest, prompt_length: int, context: int, top: int) -> SamplingParams:
    """The request's sampling parameters; ``max_tokens`` defaults to the room left in the context (as vLLM does).

    Raises:
        BadRequest: If the prompt leaves no room in the context, or ``max_tokens`` does not fit.
    """
    room = context - prompt_length
    if room < 1:
        raise BadRequest(
            f"the prompt has {prompt_length} tokens, which leaves no room in the model's context of {context} tokens",
            "messages",
        )
    wanted = request.max_completion_tokens or request.max_tokens
    if wanted is not None and wanted > room:
        raise BadRequest(
            f"max_tokens={wanted} plus the {prompt_length}-token prompt exceeds the model's context of {context} "
            "tokens",
            "max_tokens",
        )
    stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    if any(not s for s in stop):
        raise BadRequest("stop strings must not be empty", "stop")
    return SamplingParams(
        temperature=1.0 if request.temperature is None else request.temperature,
        top_p=1.0 if request.top_p is None else request.top_p,
        max_tokens=wanted or room,
        seed=request.seed,
        top_logprobs=top,
        stop=tuple(stop),
        stop_token_ids=tuple(request.stop_token_ids or ()),
        ignore_eos=request.ignore_eos,
    )


def keeps_special_tokens(skip_special_tokens: bool, tools: Sequence[Mapping[str, Any]] | None) -> bool:
    """Whether a response is decoded with its special tokens: asked for, or tools to parse (as vLLM does).

    vLLM's tool parsers (hermes among them) turn ``skip_special_tokens`` off when a request has tools and
    ``tool_choice`` is not ``none``: tool-call markers are special tokens in some models (``<tool_call>`` in some
    Hermes models), and a decode that skips them leaves the parser a bare JSON object, returned as content.
    """
    return not skip_special_tokens or bool(tools)


def response_text(template: ChatTemplate, result: GenerationResult, *, keep_special: bool = False) -> str:
    """The decoded response, cut before the stop string that ended it (vLLM leaves the stop string out).

    With ``keep_special`` special tokens are decoded too, except the stop token (eos or a ``stop_token_ids`` id)
    that ended the response, whose text vLLM leaves out as well.
    """
    ids = result.token_ids
    if keep_special and result.finish_reason == "stop" and not isinstance(result.stop_reason, str) and ids:
        ids = ids[:-1]
    text = template.decode(ids, skip_special_tokens=not keep_special)
    if isinstance(result.stop_reason, str):
        cut = text.find(result.stop_reason)
        if cut >= 0:
            text = text[:cut]
    return text


def chat_message(
    template: ChatTemplate,
    result: GenerationResult,
    prompt: Sequence[int],
    tools: Sequence[Mapping[str, Any]] | None,
    include_reasoning: bool,
    *,
    keep_special: bool = False,
) -> tuple[dict[str, Any], str]:
    """The assistant message and finish reason of one choice.

    Parsed tool calls make the finish reason ``tool_calls``; a response cut off by ``max_tokens`` is not a complete
    call, so it stays text. ``keep_special``: see `keeps_special_tokens`.
    """
    text = response_text(template, result, keep_special=keep_special)
    parsed: ParsedResponse = template.parse_response(result.token_ids, tools=tools, prompt_ids=prompt, text=text)
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    finish: str = result.finish_reason
    if parsed.tool_calls and finish == "stop":
        message["tool_calls"] = parsed.tool_calls
        finish = "tool_calls"
    elif parsed.tool_calls:
        message["content"] = text
    if parsed.reasoning_content is not None and include_reasoning:
        message["reasoning_content"] = parsed.reasoning_content
    return message, finish


def logprob_entry(template: ChatTemplate, token: int, logprob: float, top: list[tuple[int, float]]) -> dict[str, Any]:
    """One chat ``logprobs.content`` entry."""
    texts = template.token_texts([token, *(t for t, _ in top)])
    return {
        "token": texts[0],
        "logprob": logprob,
        "bytes": None,
        "top_logprobs": [
            {"token": text, "logprob": v, "bytes": None} for text, (_, v) in zip(texts[1:], top, strict=True)
        ],
    }


def logprob_content(template: ChatTemplate, result: GenerationResult) -> list[dict[str, Any]]:
    """A choice's chat ``logprobs.content``: a `logprob_entry` per generated token (their texts looked up at once)."""
    if result.top_logprobs:
        tops = zip(result.token_ids, result.logprobs, result.top_logprobs, strict=True)
        return [logprob_entry(template, token, logprob, top) for token, logprob, top in tops]
    texts = template.token_texts(result.token_ids)
    return [
        {"token": text, "logprob": logprob, "bytes": None, "top_logprobs": []}
        for text, logprob in zip(texts, result.logprobs, strict=True)
    ]


def usage(prompt: Sequence[int], results: Sequence[GenerationResult]) -> dict[str, int]:
    """The ``usage`` block."""
    completion = sum(len(r.token_ids) for r in results)
    return {"prompt_tokens": len(prompt), "completion_tokens": completion, "total_tokens": len(prompt) + completion}


def held_from(text: str, markers: Sequence[str]) -> int:
    """Where ``text`` may begin one of ``markers`` (a full one, or a prefix of one at the very end); else its length."""
    cut = len(text)
    for marker in markers:
        found = text.find(marker)
        if found >= 0:
            cut = min(cut, found)
        for size in range(min(len(marker) - 1, len(text)), 0, -1):
            if marker.startswith(text[len(text) - size :]):
                cut = min(cut, len(text) - size)
                break
    return cut


class ChoiceStream:
    """Turns one choice's tokens into chat-completion deltas while it streams.

    Text is sent as soon as it cannot be part of a tool call, a reasoning block or a stop string; from a possible
    start on it is held, and at the end the whole response is parsed: tool calls go out as one ``tool_calls`` delta,
    a reasoning block as one ``reasoning_content`` delta, and whatever text was held and is content goes out then.
    """

    def __init__(
        self,
        template: ChatTemplate,
        prompt: Sequence[int],
        tools: Sequence[Mapping[str, Any]] | None,
        stop: Sequence[str],
        include_reasoning: bool,
        *,
        keep_special: bool = False,
    ) -> None:
        self.template = template
        self.prompt = prompt
        self.tools = tools
        self.include_reasoning = include_reasoning
        self.keep_special = keep_special
        markers = list(template.markers) if tools else [m for m in template.markers if "think" in m]
        self.markers = [*markers, *stop]
        self.held_always = bool(markers) and _opens_reasoning(template, prompt)
        self.tokens: list[int] = []
        self.sent = ""

    def push(self, token: int) -> dict[str, Any]:
        """The delta for one more (unfinished) token."""
        self.tokens.append(token)
        if self.held_always:
            return {}
        text = self.template.decode(self.tokens, skip_special_tokens=not self.keep_special)
        safe = text[: held_from(text, self.markers)]
        if len(safe) > len(self.sent) and safe.startswith(self.sent):
            delta, self.sent = safe[len(self.sent) :], safe
            return {"content": delta}
        return {}

    def finish(self, result: GenerationResult) -> tuple[dict[str, Any], str]:
        """The last delta (with the final token) and the finish reason."""
        message, finish = chat_message(
            self.template, result, self.prompt, self.tools, self.include_reasoning, keep_special=self.keep_special
        )
        delta: dict[str, Any] = {}
        if "reasoning_content" in message:
            delta["reasoning_content"] = message["reasoning_content"]
        content = message.get("content") or ""
        if content.startswith(self.sent) and len(content) > len(self.sent):
            delta["content"] = content[len(self.sent) :]
        if message.get("tool_calls"):
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
        return delta, finish


def _opens_reasoning(template: ChatTemplate, prompt: Sequence[int]) -> bool:
    opens = getattr(template, "opens_reasoning", None)
    return bool(opens(prompt)) if callable(opens) else False
