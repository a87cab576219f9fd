"""Tool-call parsers by name: hermes, llama3_json, calc; reasoning blocks."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentlightning_torch import (
    HERMES_CHAT_TEMPLATE,
    get_tool_parser,
    guess_tool_parser,
    register_tool_parser,
    split_reasoning,
    tool_parser_names,
)
from agentlightning_torch.models._tool_parsers import HermesToolParser

ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}

CALCULATOR_TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}


def calls_of(parsed: tuple[str | None, list[dict[str, Any]]]) -> list[tuple[str, Any]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed[1]]


def test_hermes_parses_calls_and_keeps_surrounding_text() -> None:
    parser = get_tool_parser("hermes")
    text = 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    content, calls = parser.parse(text, [ADD])
    assert content == "Let me add."
    assert calls_of((content, calls)) == [("add", {"a": 2, "b": 3})]
    assert calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")
    two = '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>\n<tool_call>{"name": "mul", "arguments": {}}'
    assert calls_of(parser.parse(two, [ADD])) == [("add", {"a": 1}), ("mul", {})]  # an unclosed last block is fine
    assert parser.parse(two, [ADD])[0] is None


@pytest.mark.parametrize(
    "text",
    [
        "no call here",
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"arguments": {}}</tool_call>',
        '<tool_call>{"name": "add", "arguments": [1]}</tool_call>',
    ],
)
def test_hermes_leaves_non_calls_as_content(text: str) -> None:
    assert get_tool_parser("hermes").parse(text, [ADD]) == (text, [])


def test_llama3_json() -> None:
    parser = get_tool_parser("llama3_json")
    text = '<|python_tag|>{"name": "add", "parameters": {"a": 2, "b": 3}}; {"name": "neg", "arguments": {"x": 1}}'
    content, calls = parser.parse(text, [ADD])
    assert content is None
    assert calls_of((content, calls)) == [("add", {"a": 2, "b": 3}), ("neg", {"x": 1})]
    for plain in ("The answer is {5}.", '{"name": "add", "parameters": {}} and then text', '{"a": 1}'):
        assert parser.parse(plain, [ADD]) == (plain, [])


def test_calc_parser_needs_the_declared_tool() -> None:
    parser = get_tool_parser("calc")
    content, calls = parser.parse("CALC(2*3+4)", [CALCULATOR_TOOL])
    assert content is None and calls_of((content, calls)) == [("calculator", {"expression": "2*3+4"})]
    assert parser.parse("CALC(2*3+4)", [ADD]) == ("CALC(2*3+4)", [])
    assert parser.parse("A:10", [CALCULATOR_TOOL]) == ("A:10", [])


def test_registry_by_name() -> None:
    assert {"hermes", "llama3_json", "calc"} <= set(tool_parser_names())
    with pytest.raises(ValueError, match=r"unknown tool-call parser 'nope'; known parsers: .*hermes"):
        get_tool_parser("nope")
    register_tool_parser("my_hermes", lambda: HermesToolParser(name="my_hermes"))
    assert get_tool_parser("my_hermes").name == "my_hermes"
    assert guess_tool_parser(HERMES_CHAT_TEMPLATE) == "hermes"
    assert guess_tool_parser("{{ '<|python_tag|>' }}") == "llama3_json"
    assert guess_tool_parser("CALC({{ x }})") == "calc"


def test_split_reasoning() -> None:
    assert split_reasoning("<think>\nadd them\n</think>\n\nThe answer is 5.") == ("add them", "The answer is 5.")
    assert split_reasoning("add them</think>5", opened=True) == ("add them", "5")
    assert split_reasoning("<think>still thinking") == ("still thinking", None)
    assert split_reasoning("The answer is 5.") == (None, "The answer is 5.")
