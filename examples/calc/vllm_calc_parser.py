"""vLLM tool-call parser plugin for the calculator model: a whole response ``CALC(<expression>)`` calls ``calculator``.

vLLM loads this file with ``--tool-parser-plugin examples/calc/vllm_calc_parser.py --tool-call-parser calc
--enable-auto-tool-choice`` (``train.py --backend vllm`` passes them). It runs inside vLLM's environment and imports
only vLLM; the rule is the one the embedded backend's ``calc`` parser applies
(agentlightning_torch.models._tool_parsers): the call is made only when the request declares a function named
``calculator``, otherwise the text stays content.
"""

# pyright: basic
# vLLM is not installed where the project is type-checked; this module only runs inside vLLM.

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from vllm.entrypoints.generate.base.protocol import (  # pyright: ignore[reportMissingImports]
    DeltaMessage,
    ExtractedToolCallInformation,
    FunctionCall,
    ToolCall,
)
from vllm.tool_parsers.abstract_tool_parser import ToolParser, ToolParserManager  # pyright: ignore[reportMissingImports]

_CALL = re.compile(r"CALC\((.*)\)", re.DOTALL)
TOOL_NAME = "calculator"


def _declares_calculator(request: Any) -> bool:
    for tool in getattr(request, "tools", None) or []:
        function = getattr(tool, "function", None)
        if getattr(function, "name", None) == TOOL_NAME:
            return True
    return False


@ToolParserManager.register_module("calc")
class CalcToolParser(ToolParser):
    """``CALC(<expression>)`` -> one ``calculator`` call with ``{"expression": <expression>}``."""

    supports_required_and_named = False

    def extract_tool_calls(self, model_output: str, request: Any) -> Any:
        """The whole (non-streamed) response's tool call, or the text as content."""
        match = _CALL.fullmatch(model_output.strip())
        if match is None or not _declares_calculator(request):
            return ExtractedToolCallInformation(tools_called=False, tool_calls=[], content=model_output)
        arguments = json.dumps({"expression": match.group(1)})
        call = ToolCall(type="function", function=FunctionCall(name=TOOL_NAME, arguments=arguments))
        return ExtractedToolCallInformation(tools_called=True, tool_calls=[call], content=None)

    def extract_tool_calls_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
        request: Any,
    ) -> Any:
        """Streaming is not used by the calculator agent: text passes through as content."""
        return DeltaMessage(content=delta_text)
