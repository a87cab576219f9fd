"""The quickstart's calculator task and tiny model (examples/calc): a standard HF tokenizer + chat template."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agentlightning_torch")

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

CALC = Path(__file__).resolve().parent.parent / "examples" / "calc"
sys.path.insert(0, str(CALC))
try:
    import calc_model  # pyright: ignore[reportMissingImports]
    from calc_task import (  # pyright: ignore[reportMissingImports]
        evaluate_expression,
        make_calc_tasks,
        score_answer,
    )
finally:
    sys.path.remove(str(CALC))

CHECKPOINT = CALC / "checkpoint"


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return calc_model.build_tokenizer()


def test_calc_tasks_are_deterministic_and_well_formed() -> None:
    tasks = make_calc_tasks(200, seed=7)
    assert tasks == make_calc_tasks(200, seed=7)
    assert tasks != make_calc_tasks(200, seed=8)
    for task in tasks:
        assert "*" in task.expression
        operands = task.expression.replace("*", " ").replace("+", " ").replace("-", " ").split()
        assert len(operands) == 3 and all(2 <= int(o) <= 99 for o in operands)
        assert task.question == f"Q:{task.expression}="


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("37*48+12", 1788),
        ("2-3*4", -10),
        ("(2+3)*4", 20),
        ("-5*2", -10),
        ("7", 7),
        ("2*", None),
        ("", None),
        ("1+(2", None),
        ("3)", None),
        ("9" * 13, None),
        ("99999999*99999999", None),
    ],
)
def test_evaluate_expression(expression: str, value: int | None) -> None:
    assert evaluate_expression(expression) == value


def test_score_answer() -> None:
    assert score_answer("A:1788", 1788) == 1.0
    assert score_answer("A:1787", 1788) == 0.0
    assert score_answer("A:-10", -10) == 1.0
    assert score_answer("1788", 1788) == -0.1
    assert score_answer("A:17A", 17) == -0.1


def test_tokenizer_is_one_token_per_character(tokenizer: Any) -> None:
    text = "Q:37*48+12=\nCALC(37*48+12)R:-1788\nA:1788"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == len(text) and len(tokenizer) == 27
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id) == (0, 1, 2)
    assert ids[:4] == [21, 19, 6, 10]  # the ids the shipped weights were trained with: Q : 3 7
    assert tokenizer.decode([2, *ids, 1], skip_special_tokens=True) == text
    assert tokenizer.decode([2, *ids, 1]) == f"<bos>{text}<eos>"
    with pytest.raises(Exception, match=r"UNK|unk"):  # a character outside the alphabet is an error, not dropped
        tokenizer.encode("Q:3x4", add_special_tokens=False)


def _call(expression: str) -> dict[str, Any]:
    arguments = {"expression": expression}
    return {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": arguments}}


def test_chat_template_prefix_extends_across_a_tool_round(tokenizer: Any) -> None:
    eos = tokenizer.eos_token_id
    user = [{"role": "user", "content": "Q:37*48+12="}]
    prompt = calc_model.render(tokenizer, user)
    assert tokenizer.decode(prompt) == "<bos>Q:37*48+12=\n"
    response = [*tokenizer.encode("CALC(37*48+12)", add_special_tokens=False), eos]
    assistant = {"role": "assistant", "content": None, "tool_calls": [_call("37*48+12")]}
    tool = {"role": "tool", "tool_call_id": "call_1", "content": "1788"}
    second = calc_model.render(tokenizer, [*user, assistant, tool])
    assert second == prompt + response + tokenizer.encode("R:1788\n", add_special_tokens=False)
    final = calc_model.render(tokenizer, [*user, assistant, tool, {"role": "assistant", "content": "A:1788"}])
    assert final == [*second, *tokenizer.encode("A:1788", add_special_tokens=False), eos]
    parts = [{"role": "system", "content": "C"}, {"role": "user", "content": [{"type": "text", "text": "Q:2*3="}]}]
    assert tokenizer.decode(calc_model.render(tokenizer, parts), skip_special_tokens=True) == "C\nQ:2*3=\n"


@pytest.mark.parametrize(
    ("message", "match"),
    [
        ({"role": "wizard", "content": "Q"}, "unsupported role"),
        ({"role": "assistant", "tool_calls": [{"function": {"name": "search", "arguments": {}}}]}, "calculator"),
        ({"role": "assistant", "tool_calls": [{"function": {"name": "calculator", "arguments": {}}}]}, "expression"),
    ],
)
def test_chat_template_errors_name_the_problem(tokenizer: Any, message: dict[str, Any], match: str) -> None:
    with pytest.raises(Exception, match=match):
        calc_model.render(tokenizer, [message])


def test_tiny_model_is_deterministic_and_about_a_million_parameters(tokenizer: Any) -> None:
    model = calc_model.build_model(tokenizer, seed=3)
    assert 1_000_000 < sum(p.numel() for p in model.parameters()) < 1_100_000
    again, other = calc_model.build_model(tokenizer, seed=3), calc_model.build_model(tokenizer, seed=4)
    assert torch.equal(model.model.embed_tokens.weight, again.model.embed_tokens.weight)
    assert not torch.equal(model.model.layers[0].mlp.up_proj.weight, other.model.layers[0].mlp.up_proj.weight)


def test_warm_start_cli_writes_a_folder_plain_transformers_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["warmstart", "--out", str(tmp_path), "--steps", "3", "--batch-size", "8", "--eval-tasks", "8"]
    assert calc_model.main(argv) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"loss", "sampled_reward", "sampled_tool_use", "greedy_accuracy"} <= set(report)
    again, _, _ = calc_model.warm_start(calc_model.WarmStartConfig(steps=3, batch_size=8))  # deterministic
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    for key, value in again.state_dict().items():
        assert torch.equal(value, model.state_dict()[key]), key
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert tokenizer.chat_template == calc_model.CHAT_TEMPLATE
    assert calc_model.render(tokenizer, [{"role": "user", "content": "Q:2*3+4="}]) == calc_model.render(
        calc_model.build_tokenizer(), [{"role": "user", "content": "Q:2*3+4="}]
    )


def test_shipped_checkpoint_loads_through_the_auto_classes() -> None:
    tokenizer = AutoTokenizer.from_pretrained(CHECKPOINT)
    model = AutoModelForCausalLM.from_pretrained(CHECKPOINT)
    assert tokenizer.chat_template and len(tokenizer) == model.config.vocab_size
    prompt = calc_model.render(tokenizer, [{"role": "user", "content": "Q:2*3+4="}])
    assert prompt == [2, *tokenizer.encode("Q:2*3+4=\n", add_special_tokens=False)]
    assert sum(f.stat().st_size for f in CHECKPOINT.iterdir()) < 8_000_000  # stays a few MB in the repository
