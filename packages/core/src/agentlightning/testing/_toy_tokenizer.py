"""`ToyTokenizer`: the byte-level tokenizer and chat template of the scripted model server."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["ToyTokenizer", "content_text", "pseudo_logprob"]


class ToyTokenizer:
    """Byte-level tokenizer: id = byte value + 3; ids 0, 1, 2 are pad, bos and eos.

    Deterministic, reversible for any UTF-8 text, and with no vocabulary file to ship.
    """

    pad_id = 0
    bos_id = 1
    eos_id = 2
    offset = 3
    vocab_size = 256 + 3

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (its UTF-8 bytes shifted by `offset`)."""
        return [b + self.offset for b in text.encode("utf-8")]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``; special ids are dropped, invalid UTF-8 is replaced."""
        data = bytes(i - self.offset for i in ids if self.offset <= i < self.vocab_size)
        return data.decode("utf-8", errors="replace")

    def token_text(self, token_id: int) -> str:
        """Printable form of one token (a character, or ``<0xNN>`` for a partial UTF-8 byte)."""
        byte = token_id - self.offset
        if 0 <= byte < 128:
            return chr(byte)
        return f"<0x{byte:02X}>"

    @staticmethod
    def render_tool_call(name: str, arguments: str) -> str:
        """The generated text of one tool call."""
        return f'<tool_call>{{"name": {json.dumps(name)}, "arguments": {arguments}}}</tool_call>'

    def render_chat(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None) -> str:
        """Render a chat prompt with the template in the module docstring."""
        parts: list[str] = []
        if tools:
            parts.append(f"<|tools|>\n{json.dumps(list(tools), separators=(',', ':'), sort_keys=True)}\n")
        for message in messages:
            text = content_text(message.get("content"))
            for call in message.get("tool_calls") or []:
                function = call.get("function", {})
                text += self.render_tool_call(str(function.get("name", "")), str(function.get("arguments", "")))
            parts.append(f"<|{message.get('role', 'user')}|>\n{text}\n")
        parts.append("<|assistant|>\n")
        return "".join(parts)


def pseudo_logprob(token_id: int, position: int) -> float:
    """Deterministic stand-in log-probability of ``token_id`` at ``position`` (in [-2.0, -0.01])."""
    return -0.01 - ((token_id * 7919 + position * 104729) % 200) / 100.5


def content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        texts: list[str] = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                texts.append(str(part.get("text", "")))
        return "".join(texts)
    return str(content)
