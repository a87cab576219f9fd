"""``benchmarks/e2e_overhead.py --model smollm2`` at toy size: the bare loop's real-model mode (``bare_loop_chat.py``)
and the framework run get matching commands, the bare loop builds its samples as LightningRL does, and one iteration
of it on a tiny ChatML model (SmolLM2's template) samples, scores and really updates the LoRA policy.

The SmolLM2 measurement itself is a benchmark (minutes per iteration), not a test.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agentlightning import CreditConfig, Transition, build_training_batch
from agentlightning_torch import GenerationResult, HFChatTemplate, load_model, save_checkpoint
from agentlightning_torch.testing import SMOLLM2_CHAT_TEMPLATE, make_tiny_chat_model, memorize

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "examples" / "calc"))

import bare_loop_chat  # noqa: E402  # pyright: ignore[reportMissingImports]
import e2e_overhead  # noqa: E402  # pyright: ignore[reportMissingImports]
from calc_rules import TOOLS  # noqa: E402  # pyright: ignore[reportMissingImports]

OPENING = [{"role": "system", "content": "Answer with A:<number>."}]
TASK = {"question": "Q:1+1=", "answer": 2}


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny ChatML model that answers the task's first call ``A:2`` (reward 1) or ``A:3`` (reward 0), about
    half and half, so a group's rewards differ; its prompt file and a one-task tasks file."""
    base = tmp_path_factory.mktemp("e2e-chat")
    folder = make_tiny_chat_model(base / "smollm2-135m-instruct", corpus=["Q:1+1= A:2 A:3 CALC(1+1)"])
    loaded = load_model(folder, chat_template=SMOLLM2_CHAT_TEMPLATE)
    template = HFChatTemplate(loaded.tokenizer, tool_parser="calc")
    prompt = template.render([*OPENING, {"role": "user", "content": TASK["question"]}], tools=bare_loop_chat.TOOLS)
    eos = int(loaded.tokenizer.eos_token_id)  # pyright: ignore[reportArgumentType]
    answers = [[*template.encode_text(text, add_special_tokens=False), eos] for text in ("A:2", "A:3")]
    memorize(loaded.model, [(prompt, answer) for answer in answers], steps=150)
    save_checkpoint(loaded.model, loaded.tokenizer, folder)  # the tokenizer keeps SmolLM2's template
    prompt_file, tasks = base / "prompt.json", base / "tasks.jsonl"
    prompt_file.write_text(json.dumps(OPENING), encoding="utf-8")
    tasks.write_text(json.dumps(TASK) + "\n", encoding="utf-8")
    return {"folder": folder, "prompt_file": prompt_file, "tasks": tasks}


def _overhead_args(model: dict[str, Path], *extra: str) -> Any:
    return e2e_overhead.parse_args([
        "--model", "smollm2", "--model-dir", str(model["folder"]), "--prompt-file", str(model["prompt_file"]),
        *extra,
    ])  # fmt: skip


def test_the_bare_loop_and_the_framework_get_the_same_run(
    chat_model: dict[str, Path], example_script: Callable[[str, str], Any]
) -> None:
    train = example_script("calc", "train")  # not `import train`: every example has a train.py
    args = _overhead_args(chat_model, "--iterations", "3", "--tasks", "5", "--samples", "3", "--threads", "2")
    bare_cmd, framework_cmd = e2e_overhead.commands(args, "openai")
    assert bare_cmd[1] == "benchmarks/bare_loop_calc.py" and "--prompt-file" in bare_cmd  # its real-model mode
    assert framework_cmd[1] == "examples/calc/train.py"
    bare = bare_loop_chat.parse_args(bare_cmd[2:])
    framework = train.parse_args(framework_cmd[2:])
    assert framework.model == "smollm2" and framework.transition_mode == "per_call" and framework.agent == "openai"
    assert bare.model == framework.model_dir == chat_model["folder"].resolve()
    assert bare.prompt_file == framework.prompt_file == chat_model["prompt_file"].resolve()
    assert (bare.prompts, bare.samples) == (framework.tasks_per_iteration, framework.samples_per_task) == (5, 3)
    for name in ("iterations", "temperature", "max_tokens", "threads", "seed", "lr", "kl_coef", "lora_rank"):
        assert getattr(bare, name) == getattr(framework, name), name
    assert bare.eval_tasks == framework.eval_size and framework.eval_every == 0
    # the same policy update: LoRA r16 on q/k/v/o, KL to the base, the preset's lr, epochs, entropy and threads
    trainer_ppo = train.build_config(framework).ppo
    assert bare_loop_chat.ppo_config(bare) == trainer_ppo
    assert trainer_ppo.lora is not None and trainer_ppo.kl_coef > 0
    # and the toy comparison is as it was: the bare loop's toy mode against the trajectory recipe
    toy_bare, toy_framework = e2e_overhead.commands(e2e_overhead.parse_args(["--iterations", "2"]), "langgraph")
    assert "--prompt-file" not in toy_bare and "--model" not in toy_framework
    assert toy_framework[toy_framework.index("--transition-mode") + 1] == "trajectory"


def test_the_bare_loop_declares_the_agents_tool() -> None:
    """The bare loop renders the tool the plain agent sends, and the LangGraph agent's bound tool is the same one."""
    from calc_agent import calculator  # pyright: ignore[reportMissingImports]
    from langchain_core.utils.function_calling import convert_to_openai_tool

    assert bare_loop_chat.TOOLS is TOOLS
    langgraph_tool = convert_to_openai_tool(calculator)
    assert langgraph_tool["function"]["name"] == TOOLS[0]["function"]["name"]
    assert langgraph_tool["function"]["description"] == TOOLS[0]["function"]["description"]
    assert langgraph_tool["function"]["parameters"]["properties"] == TOOLS[0]["function"]["parameters"]["properties"]


def _rollout(task: dict[str, Any], reward: float, calls: int) -> Any:
    rollout = bare_loop_chat.Rollout(task, [])
    for step in range(calls):
        result = GenerationResult(token_ids=[10 + step, 2], logprobs=[-0.5, -0.1], finish_reason="stop")
        rollout.calls.append(([1, 2, 3 + step], result))
    rollout.reward = reward
    return rollout


def test_per_call_samples_match_lightningrl_credit() -> None:
    # two groups of four: one with mixed rewards (tool-using rollouts have two calls), one all equal (dropped)
    rewards = [1.0, 0.0, -0.1, 1.0, 0.0, 0.0, 0.0, 0.0]
    rollouts = [_rollout(TASK, reward, 1 + index % 2) for index, reward in enumerate(rewards)]
    samples, dropped = bare_loop_chat.per_call_samples(rollouts, 4)
    transitions = [
        Transition(
            rollout_id=f"r{index}",
            attempt_id=f"a{index}",
            group_id=f"g{index // 4}",
            step_index=step,
            prompt_token_ids=prompt,
            response_token_ids=result.token_ids,
            response_mask=[1] * len(result.token_ids),
            response_logprobs=result.logprobs,
            final_reward=rollout.reward,
        )
        for index, rollout in enumerate(rollouts)
        for step, (prompt, result) in enumerate(rollout.calls)
    ]
    batch = build_training_batch(transitions, "identical", "grpo", CreditConfig(drop_equal_groups=True))
    assert dropped == 1 and len(samples) == len(batch.samples) == 6  # the first group's 4 rollouts, 6 calls
    for ours, theirs in zip(samples, batch.samples, strict=True):
        assert ours.advantage == pytest.approx(theirs.advantage, abs=1e-12)
        assert ours.credit == theirs.credit and ours.step_index == theirs.step_index
        assert ours.prompt_token_ids == theirs.prompt_token_ids
        assert ours.response_token_ids == theirs.response_token_ids
        assert ours.response_logprobs == theirs.response_logprobs


@pytest.mark.timeout(600)
def test_one_iteration_of_the_bare_real_model_loop_updates_the_lora_policy(chat_model: dict[str, Path]) -> None:
    args = _overhead_args(chat_model, "--iterations", "1", "--tasks", "2", "--samples", "8", "--eval-size", "1")
    bare_cmd, _ = e2e_overhead.commands(args, "langgraph")
    tasks = ["--train-tasks", str(chat_model["tasks"]), "--val-tasks", str(chat_model["tasks"])]
    done = subprocess.run(
        [*bare_cmd, *tasks], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["mode"] == "chat" and figures["iterations"] == 1
    assert figures["prompts"] == 2 and figures["samples_per_prompt"] == 8 and figures["max_tokens"] == 16
    assert figures["calls_per_iteration"] >= 16  # one call per rollout, two when it called the calculator
    # the seeded samples answer A:2 and A:3 within a group: its calls are trained, and the update really ran
    assert figures["groups_dropped"] < 2 and figures["samples_total"] > 0
    assert figures["optimizer_steps"] == 1 and figures["lora_b_norm"] > 0
    for phase in ("generation", "transitions", "update", "sync"):
        assert figures[f"{phase}_seconds_per_iteration"] >= 0 and f"{phase}_cpu_seconds_per_iteration" in figures
