"""Chat templates the project ships, for model folders that come without one.

`HERMES_CHAT_TEMPLATE` is a ChatML (``<|im_start|>role ... <|im_end|>``) template with hermes-style tool calling:
tools are listed in the system turn inside ``<tools></tools>``, the assistant calls them with
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` and results come back as ``<tool_response>`` blocks in a
user turn. Parse its calls with the ``hermes`` tool-call parser. It needs the special tokens ``<|im_start|>`` and
``<|im_end|>`` (the end-of-turn / eos token) in the tokenizer. Use it with
``tokenizer.chat_template = HERMES_CHAT_TEMPLATE; tokenizer.save_pretrained(folder)``.

Re-rendering a conversation after a tool round gives the previous prompt, then the previous response exactly as the
model wrote it in this format (ending with ``<|im_end|>``), then the new turns, so the turns of an episode can merge
into one training sample.
"""

from __future__ import annotations

__all__ = ["HERMES_CHAT_TEMPLATE", "chatml_template"]

_SYSTEM_MESSAGE = (
    # Every piece of text is an expression, so the template renders the same with or without trim_blocks.
    "{%- set ns = namespace(system='') -%}"
    "{%- if messages and messages[0].role in ['system', 'developer'] -%}"
    "{%- set ns.system = messages[0].content -%}"
    "{%- set messages = messages[1:] -%}"
    "{%- endif -%}"
)

_TURNS = (
    "{%- for message in messages -%}"
    "{%- if message.role == 'tool' -%}"
    "{%- if loop.first or loop.previtem.role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' -}}"
    "{%- if loop.last or loop.nextitem.role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- elif message.role == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' + (message.content or '') -}}"
    "{%- for call in message.tool_calls or [] -%}"
    "{%- set call = call.function if call.function is defined else call -%}"
    "{%- if message.content or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    '{{- \'<tool_call>\\n{"name": "\' + call.name + \'", "arguments": \' -}}'
    "{{- (call.arguments | tojson) + '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

_HERMES_SYSTEM_TURN = (
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if ns.system -%}{{- ns.system + '\\n\\n' -}}{%- endif -%}"
    "{{- 'You may call one or more functions. Their signatures are inside <tools></tools>:\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- '\\n</tools>\\nTo call a function, write one JSON object per call inside ' -}}"
    "{{- '<tool_call></tool_call> tags:\\n' -}}"
    '{{- \'<tool_call>\\n{"name": <function-name>, "arguments": <arguments-object>}\\n\' -}}'
    "{{- '</tool_call><|im_end|>\\n' -}}"
    "{%- elif ns.system -%}"
    "{{- '<|im_start|>system\\n' + ns.system + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
)


def chatml_template(system_turn: str = _HERMES_SYSTEM_TURN) -> str:
    """A ChatML chat template with hermes-style tool calls, whose system turn is rendered by ``system_turn``.

    Args:
        system_turn: A Jinja fragment that renders the system turn (``<|im_start|>system ... <|im_end|>``) from
            ``ns.system`` (the first message's content when it is a system or developer message, else ``''``) and
            ``tools``; the default lists the tools' JSON schemas inside ``<tools></tools>`` (`HERMES_CHAT_TEMPLATE`).
            A small model's template can list them more compactly (the math and RAG examples do).

    Returns:
        The template: the system turn, then every other turn as in `HERMES_CHAT_TEMPLATE`.
    """
    return _SYSTEM_MESSAGE + system_turn + _TURNS


HERMES_CHAT_TEMPLATE = chatml_template()
"""A ChatML chat template with hermes-style tool calls (see the module docstring)."""
