"""A tiny chat model that calls a tool, for tests against real servers (vLLM, `LocalBackend`) on a CPU.

`make_tool_chat_model` builds a Qwen2 folder whose attention head size vLLM's CPU attention accepts (64), with a
byte-level BPE tokenizer and the hermes chat template, and gives it a short supervised warm start so that greedy
decoding is meaningful and the same whatever the framework's prompt looks like:

- a conversation with tools whose last turn is not a tool result: one hermes call
  ``<tool_call>\\n{"name": "add", "arguments": {"a": 2, "b": 3}}\\n</tool_call>``;
- after a tool result, or without tools: ``The answer is 5.``

(trained over varied system prompts, tasks and tool schemas, so LangGraph's, the Agents SDK's and AutoGen's own
prompts get the same behaviour). With ``special_tool_tokens`` the ``<tool_call>`` markers are *special* tokens,
which a server that decodes with special tokens skipped loses before its tool-call parser runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentlightning_torch.models._chat_model import build_chat_model, train_chat_tokenizer
from agentlightning_torch.models._checkpoint import save_checkpoint
from agentlightning_torch.models._sft import supervised_finetune

__all__ = ["TOOL_MODEL_ANSWER", "TOOL_MODEL_CALL", "add_tool_schema", "make_tool_chat_model"]

TOOL_MODEL_CALL = {"name": "add", "arguments": {"a": 2, "b": 3}}
"""The call the model makes when a conversation with tools has no tool result yet."""
TOOL_MODEL_ANSWER = "The answer is 5."
"""What the model says after a tool result, or without tools."""

_SYSTEMS = (
    None,
    "You are a helpful AI assistant. Solve tasks using your tools.",
    "You are a helpful assistant.",
    "Use the add tool for arithmetic.",
    "You are a calculator agent. Reply briefly.",
    "Answer the question.",
)
_TASKS = (
    "What is 2 plus 3?",
    "Add 2 and 3.",
    "task-17: what is 2 + 3?",
    "Please compute the sum of two and three.",
    "Hello, how are you today?",
    "Use the tool to add the numbers 2 and 3, then tell me the result.",
    "Compute 2+3",
    "q",
)


def add_tool_schema(variant: int = 0) -> dict[str, Any]:
    """An OpenAI tool entry for ``add(a: int, b: int)``; ``variant`` picks one framework's way of writing it."""
    integer: dict[str, Any] = {"type": "integer"}
    properties: dict[str, Any] = {"a": dict(integer), "b": dict(integer)}
    parameters: dict[str, Any] = {"type": "object", "properties": properties, "required": ["a", "b"]}
    if variant % 3 == 1:  # pydantic-made schemas (Agents SDK, AutoGen): titles and closed objects
        properties["a"]["title"], properties["b"]["title"] = "A", "B"
        parameters = {"properties": properties, "required": ["a", "b"], "title": "add_args", "type": "object",
                      "additionalProperties": False}  # fmt: skip
    elif variant % 3 == 2:  # LangChain: properties first, descriptions per argument
        properties["a"]["description"], properties["b"]["description"] = "first number", "second number"
        parameters = {"properties": properties, "required": ["a", "b"], "type": "object"}
    description = ("Add two integers.", "Add two numbers and return the sum.", "add")[variant % 3]
    return {"type": "function", "function": {"name": "add", "description": description, "parameters": parameters}}


def _conversations() -> list[dict[str, Any]]:
    """Training conversations: call the tool once, then answer; answer at once without tools."""
    call = {"id": "call_0", "type": "function", "function": {"name": "add", "arguments": TOOL_MODEL_CALL["arguments"]}}
    out: list[dict[str, Any]] = []
    for index, task in enumerate(_TASKS * 2):
        system = _SYSTEMS[index % len(_SYSTEMS)]
        head = [{"role": "system", "content": system}] if system else []
        user = {"role": "user", "content": task}
        out.append({"messages": [*head, user, {"role": "assistant", "content": TOOL_MODEL_ANSWER}]})
        tools = [add_tool_schema(index)] + ([] if index % 4 else [_other_tool()])
        out.append(
            {
                "messages": [
                    *head,
                    user,
                    {"role": "assistant", "content": None, "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "call_0", "content": ("5", '{"result": 5}', "5.0")[index % 3]},
                    {"role": "assistant", "content": TOOL_MODEL_ANSWER},
                ],
                "tools": tools,
            }
        )
    return out


def _other_tool() -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a word up.",
            "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]},
        },
    }


def make_tool_chat_model(
    directory: str | Path,
    *,
    special_tool_tokens: bool = False,
    seed: int = 0,
    steps: int = 60,
    max_positions: int = 1024,
) -> Path:
    """Build, warm-start and save the tool-calling test model; returns the folder.

    The model is a 2-layer Qwen2, hidden size 128 with 2 heads of 64 (a head size vLLM's CPU attention serves),
    float32, ~0.3M parameters; the same arguments give the same folder.

    Args:
        directory: Where the folder is written (created if needed).
        special_tool_tokens: Make ``<tool_call>`` / ``</tool_call>`` special tokens (see the module docstring).
        seed: Seeds the initial weights and the data order.
        steps: Warm-start steps (fewer: faster, less reliable behaviour).
        max_positions: Context length.
    """
    conversations = _conversations()
    texts = [json.dumps(c) for c in conversations]
    tokenizer = train_chat_tokenizer(
        texts, vocab_size=600, model_max_length=max_positions, special_tool_tokens=special_tool_tokens
    )
    model = build_chat_model(
        tokenizer, hidden_size=128, num_layers=2, num_heads=2, intermediate_size=256, max_positions=max_positions,
        seed=seed,
    )  # fmt: skip
    supervised_finetune(model, tokenizer, conversations, steps=steps, batch_size=8, lr=3e-3, seed=seed)
    path = save_checkpoint(model, tokenizer, directory)
    info = {"built_by": "make_tool_chat_model", "seed": seed, "special_tool_tokens": special_tool_tokens}
    (path / "agentlightning.json").write_text(json.dumps(info) + "\n")
    return path
