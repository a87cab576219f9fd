"""examples/math: the problem generator, the reward, the GSM8K loader and the chat template (fast, no model)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MATH = ROOT / "examples" / "math"
sys.path.insert(0, str(MATH))

from math_task import (  # noqa: E402  # pyright: ignore[reportMissingImports]
    KINDS,
    evaluate_expression,
    load_gsm8k,
    load_problems,
    make_problems,
    parse_final_number,
    score,
    split_problems,
)


def test_generated_problems_are_seeded_and_their_gold_expression_gives_the_answer() -> None:
    problems = make_problems(300, seed=3)
    assert problems == make_problems(300, seed=3)
    assert problems != make_problems(300, seed=4)
    assert {p.kind for p in problems} == set(KINDS)
    for problem in problems:
        assert problem.expression is not None and problem.distractor is not None
        assert str(evaluate_expression(problem.expression)) == problem.answer
        assert int(problem.answer) > 0
        numbers_in_question = re.findall(r"\d+", problem.question)
        expression_numbers = re.findall(r"\d+", problem.expression)
        # Every number of the gold expression is in the question, and so is the distractor, which it must not use.
        assert sorted(numbers_in_question) == sorted([*expression_numbers, str(problem.distractor)])
        assert str(problem.distractor) not in expression_numbers
        assert problem.question.endswith("?")


def test_the_distractor_sentence_comes_first_and_the_gold_expression_keeps_the_numbers_in_order() -> None:
    for problem in make_problems(200, seed=0):
        numbers = re.findall(r"\d+", problem.question)
        assert numbers[0] == str(problem.distractor) and len(numbers[0]) == 2
        assert numbers[1:] == re.findall(r"\d+", problem.expression or "")
        assert all(len(n) == 1 for n in numbers[1:])  # single digits (see KINDS)


def test_split_gives_disjoint_unique_train_and_held_out_sets() -> None:
    train, held_out = split_problems(500, 64, seed=1)
    assert len(train) == 500 and len(held_out) == 64
    assert not {p.question for p in train} & {p.question for p in held_out}
    assert len({p.question for p in train}) == 500
    assert split_problems(500, 64, seed=1) == (train, held_out)
    with pytest.raises(ValueError, match="at least 1"):
        split_problems(0, 10)


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("69", "69"),
        ("The answer is 1,234.", "1234"),
        ("12*7 = 84, minus 15 gives 69.0", "69"),
        ("She has -3.50 left", "-3.5"),
        ("no number here", None),
        ("", None),
    ],
)
def test_the_final_number_is_the_last_number_written(text: str, number: str | None) -> None:
    assert parse_final_number(text) == number


def test_reward_is_an_exact_numeric_match_of_the_final_answer() -> None:
    assert score("69", "69") == 1.0
    assert score("So she has 69 pens.", "69") == 1.0
    assert score("69.0", "69") == 1.0
    assert score("70", "69") == 0.0
    assert score("69 pens, and her brother is 9", "69") == 0.0  # the last number counts
    assert score(None, "69") == 0.0  # the agent ended without a final answer


def test_the_calculator_evaluates_arithmetic_and_refuses_anything_else() -> None:
    assert evaluate_expression("12*7-15") == 69
    assert evaluate_expression("5*(12+4)") == 80
    assert evaluate_expression("7/2") == 3.5
    assert evaluate_expression("8/2") == 4
    for bad in ("", "1/0", "__import__('os')", "2**99999", "9" * 100, "1+", "abs(-1)"):
        assert evaluate_expression(bad) is None, bad


GSM8K_LINES = [
    {
        "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
        "How many clips did Natalia sell altogether in April and May?",
        "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips "
        "altogether in April and May.\n#### 72",
    },
    {"question": "A shop earns $1,200 a day. What does it earn in 5 days?", "answer": "1200*5=6000\n#### 6,000"},
    {"question": "It was 3 degrees and fell by 5. What is it now?", "answer": "3-5=-2\n#### -2"},
]


def test_gsm8k_loader_reads_the_final_answer_after_the_hashes(tmp_path: Path) -> None:
    path = tmp_path / "test.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in GSM8K_LINES) + "\n\n")
    problems = load_gsm8k(path)
    assert [p.answer for p in problems] == ["72", "6000", "-2"]
    assert problems[0].question.startswith("Natalia sold clips")
    assert problems[0].to_task() == {"question": problems[0].question, "answer": "72"}
    assert load_gsm8k(path, limit=2) == problems[:2]
    assert load_problems(path) == problems  # the general loader recognises the format
    assert score("They sold 72 clips.", problems[0].answer) == 1.0


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"question": "q", "answer": "#### 4"}\n{"question": oops}\n', ":2: not valid JSON"),
        ('{"question": "q", "answer": "4"}\n', ":1: the answer has no '#### <number>' line"),
        ('{"question": "q", "answer": "#### four"}\n', ":1: the text after '####' is not a number"),
        ('{"question": 3, "answer": "#### 4"}\n', ":1: expected an object"),
        ("\n\n", "holds no problems"),
    ],
)
def test_gsm8k_loader_names_the_bad_line(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=re.escape(message)):
        load_gsm8k(path)


def test_plain_question_answer_files_load_too(tmp_path: Path) -> None:
    path = tmp_path / "plain.jsonl"
    path.write_text('{"question": "2+2?", "answer": 4}\n{"question": "half of 5?", "answer": "2.5"}\n')
    assert [p.answer for p in load_problems(path)] == ["4", "2.5"]
    path.write_text('{"question": "2+2?", "answer": 4}\n{"question": "x"}\n')
    with pytest.raises(ValueError, match="line 2"):
        load_problems(path)
    with pytest.raises(ValueError, match="does not exist"):
        load_problems(tmp_path / "missing.jsonl")
