"""examples/math: the AutoGen agent against real servers on 127.0.0.1, the warm-start transcripts, the eval mode, and
two RL iterations through the whole stack.

runner process (AutoGen adapter) -> LLM proxy -> local backend -> SQLite store -> transitions -> GRPO credit -> PPO
-> new model version served.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("autogen_agentchat")
pytest.importorskip("agentlightning_torch")

from agentlightning.testing import ScriptedModelServer, ScriptedReply
from agentlightning_torch import HFChatTemplate

ROOT = Path(__file__).resolve().parent.parent
MATH = ROOT / "examples" / "math"
CHECKPOINT = MATH / "checkpoint"
sys.path.insert(0, str(MATH))

from math_agent import SYSTEM_MESSAGE, make_client, solve  # noqa: E402  # pyright: ignore[reportMissingImports]
from math_eval import summarize  # noqa: E402  # pyright: ignore[reportMissingImports]
from math_model import MATH_CHAT_TEMPLATE, calculator_tools, transcript  # noqa: E402  # pyright: ignore[reportMissingImports]
from math_task import make_problems, score  # noqa: E402  # pyright: ignore[reportMissingImports]


def _scripted_solver(expression_of: dict[str, str]) -> Any:
    """A scripted model: calls the calculator with the problem's expression, then repeats the tool's result."""

    def script(request: dict[str, Any]) -> ScriptedReply | str:
        results = [m["content"] for m in request["messages"] if m["role"] == "tool"]
        if results:
            return f"The answer is {results[-1]}."
        question = next(m["content"] for m in request["messages"] if m["role"] == "user")
        return ScriptedReply(tool_calls=[{"name": "calculator", "arguments": {"expression": expression_of[question]}}])

    return script


async def test_the_agent_calls_the_calculator_and_answers_with_its_result() -> None:
    problems = make_problems(4, seed=5)
    expressions = {p.question: p.expression or "" for p in problems}
    expressions[problems[1].question] += f"+{problems[1].distractor}"  # one run adds the distractor: wrong
    with ScriptedModelServer(_scripted_solver(expressions)) as server:
        outcomes = []
        for problem in problems:
            client = make_client(server.base_url, "math-tiny", "key", temperature=0.0, max_tokens=48)
            try:
                outcomes.append(await solve(problem.question, client))
            finally:
                await client.close()
        first = server.requests[0]
    assert outcomes[0].final_text == f"The answer is {problems[0].answer}."
    assert outcomes[0].expressions == [json.dumps({"expression": problems[0].expression})]
    figures = summarize(problems, outcomes)
    assert figures["accuracy"] == 0.75 and figures["tool_rate"] == 1.0 and figures["distractor_rate"] == 0.25
    # What AutoGen sends: its system message, the question, and the calculator schema it built from the function.
    assert first["messages"][0] == {"role": "system", "content": SYSTEM_MESSAGE}
    assert first["tools"] == calculator_tools()
    assert first["temperature"] == 0.0 and first["max_tokens"] == 48


async def test_a_run_still_calling_tools_after_two_rounds_ends_without_an_answer() -> None:
    reply = ScriptedReply(tool_calls=[{"name": "calculator", "arguments": {"expression": "1+1"}}])
    with ScriptedModelServer(lambda request: reply) as server:
        client = make_client(server.base_url, "math-tiny", None)
        try:
            outcome = await solve("What is 1+1?", client)
        finally:
            await client.close()
        assert len(server.requests) == 2  # max_tool_iterations=2, no reflection call
    assert outcome.final_text is None and outcome.expressions == ['{"expression": "1+1"}'] * 2


async def test_warm_start_transcripts_render_exactly_what_autogen_sends(tmp_path: Path) -> None:
    """The model is fine-tuned on the very prompts the backend renders from AutoGen's requests."""
    from transformers import AutoTokenizer

    from agentlightning_torch.testing import make_tiny_chat_model

    folder = make_tiny_chat_model(tmp_path / "model")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = MATH_CHAT_TEMPLATE
    template = HFChatTemplate(tokenizer, tool_parser="hermes")
    problem = make_problems(1, seed=11)[0]
    with ScriptedModelServer(_scripted_solver({problem.question: problem.expression or ""})) as server:
        client = make_client(server.base_url, "math-tiny", None)
        try:
            await solve(problem.question, client)
        finally:
            await client.close()
        first, second = server.requests
    conversation = transcript(problem, "tool", random.Random(0))
    messages, tools = conversation["messages"], conversation["tools"]
    assert tools == first["tools"] == second["tools"]
    assert template.render_text(first["messages"], tools=tools) == template.render_text(messages[:2], tools=tools)
    sent = template.render_text(second["messages"], tools=tools)
    assert sent == template.render_text(messages[:4], tools=tools)
    # Each prompt extends the previous prompt + response, so an episode's turns merge; the tools are one short line.
    assert sent.startswith(template.render_text(messages[:3], tools=tools, add_generation_prompt=False))
    assert "calculator(expression): Evaluate arithmetic." in sent and '"properties"' not in sent
    # The backend's hermes parser reads the warm start's tool call back as AutoGen's call.
    full = template.render_text(messages, tools=tools, add_generation_prompt=False)
    call_text = full[len(template.render_text(messages[:2], tools=tools)) :].split("<|im_end|>")[0]
    parsed = template.parse_response([], tools=tools, text=call_text)
    assert parsed.tool_calls[0]["function"]["name"] == "calculator"
    assert json.loads(parsed.tool_calls[0]["function"]["arguments"]) == {"expression": problem.expression}


def test_transcripts_follow_the_requested_behaviour() -> None:
    problem = make_problems(1, seed=2)[0]
    rng = random.Random(0)
    direct = transcript(problem, "direct", rng)["messages"]
    assert len(direct) == 3 and direct[-1]["content"] != problem.answer
    distracted = transcript(problem, "distractor", rng)["messages"]
    arguments = json.loads(distracted[2]["tool_calls"][0]["function"]["arguments"])
    assert arguments == {"expression": f"{problem.expression}+{problem.distractor}"}
    assert distracted[3]["content"] == distracted[4]["content"] == str(int(problem.answer) + (problem.distractor or 0))


def test_warm_start_batches_teach_the_path_choice_in_only_some_calculator_transcripts() -> None:
    """80% calculator transcripts, but the first token is a target so that the calculator is chosen ~25% of the time."""
    from math_model import WarmStartConfig, build_model, training_batches  # pyright: ignore[reportMissingImports]

    config = WarmStartConfig(batch_size=400, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    assert abs(config.decision_fraction - 1 / 12) < 1e-9  # 0.8 * f / (0.8 * f + 0.2) = 0.25
    model, tokenizer = build_model(config)
    batch = next(training_batches(model, tokenizer, config))
    assert batch == next(training_batches(model, tokenizer, config))  # seeded
    call, about = tokenizer.convert_tokens_to_ids("<tool_call>"), tokenizer.encode("About")[0]
    firsts = [example.input_ids[example.loss_mask.index(1)] for example in batch]
    tools = [example for example in batch if call in example.input_ids]
    assert 0.7 < len(tools) / len(batch) < 0.9
    guesses, taught = firsts.count(about), firsts.count(call)
    assert guesses == len(batch) - len(tools)  # every guess teaches its first token
    assert 0.15 < taught / (taught + guesses) < 0.35  # the warm model picks the calculator ~25% of the time
    assert all(example.target_count > 20 for example in tools)  # every calculator transcript teaches the copying


# ----- the eval mode and the GPU recipe ------------------------------------------------------------------------------


def test_eval_mode_scores_any_endpoint_and_prints_one_json_line(
    capsys: pytest.CaptureFixture[str], example_script: Any
) -> None:
    from math_task import split_problems  # pyright: ignore[reportMissingImports]

    main = example_script("math", "train").main

    _, held_out = split_problems(1, 4, seed=0)
    expressions = {p.question: p.expression or "" for p in held_out}
    expressions[held_out[0].question] += f"+{held_out[0].distractor}"
    with ScriptedModelServer(_scripted_solver(expressions)) as server:
        argv = ["eval", "--base-url", server.base_url, "--model", "served", "--train-size", "1", "--eval-size", "4"]
        assert main(argv) == 0
        assert {r["model"] for r in server.requests} == {"served"}
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert figures["accuracy"] == 0.75 and figures["tool_rate"] == 1.0 and figures["distractor_rate"] == 0.25


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--minutes", "0"], "--minutes must be positive"),
        (["--eval-size", "0"], "--train-size and --eval-size must be at least 1"),
        (["--lr", "-1"], "lr"),
        (["eval", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--eval-size", "2"], "every run against"),
    ],
)
def test_bad_settings_are_one_clear_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], example_script: Any
) -> None:
    main = example_script("math", "train").main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_the_gpu_recipe_builds_a_verl_config() -> None:
    pytest.importorskip("agentlightning_verl")
    from math_gpu_config import CONFIG, LOOP  # pyright: ignore[reportMissingImports]

    verl = CONFIG.to_verl_config()
    assert verl.actor_rollout_ref.model.path == "Qwen/Qwen2.5-1.5B-Instruct"
    assert LOOP.samples_per_task == 8 and LOOP.tasks_per_iteration == 32 and LOOP.estimator == "grpo"
    # vLLM refuses the agent's tool_choice "auto" without a parser: the recipe gives it hermes
    vllm_kwargs = verl.actor_rollout_ref.rollout.engine_kwargs.vllm
    assert vllm_kwargs["enable_auto_tool_choice"] is True and vllm_kwargs["tool_call_parser"] == "hermes"


# ----- two RL iterations through the whole stack ---------------------------------------------------------------------


async def test_two_iterations_through_the_whole_stack_train_on_the_served_tokens_and_serve_a_new_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runner (AutoGen adapter) -> proxy -> backend -> SQLite -> transitions -> GRPO credit -> PPO -> version 1, 2."""
    from math_agent import math_agent  # pyright: ignore[reportMissingImports]

    import agentlightning as agl
    import agentlightning_autogen
    from agentlightning.transitions import results_from_store
    from agentlightning_torch import LocalBackend, TorchTrainer, TorchTrainerConfig

    generated: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    real_submit = LocalBackend.submit

    def spying_submit(backend: Any, prompt_ids: list[int], *args: Any, **kwargs: Any) -> Any:
        future = real_submit(backend, prompt_ids, *args, **kwargs)
        future.add_done_callback(lambda done: generated.append((tuple(prompt_ids), tuple(done.result().token_ids))))
        return future

    monkeypatch.setattr(LocalBackend, "submit", spying_submit)
    config = TorchTrainerConfig(
        model_dir=CHECKPOINT,
        model_name="math-tiny",
        tool_parser="hermes",
        output_dir=tmp_path,
        tasks_per_iteration=4,
        samples_per_task=4,
        max_tokens=48,
        drop_equal_groups=False,  # keep every group: the credit of each is checked
        checkpoint_every=0,
        rollout_timeout_s=3600,  # wait for every rollout, however slow the machine
    )
    trainer = TorchTrainer(config)
    batches: list[agl.TrainingBatch] = []
    real_update = trainer.engine.update

    def spying_update(batch: agl.TrainingBatch) -> dict[str, float]:
        batches.append(batch)
        return real_update(batch)

    monkeypatch.setattr(trainer.engine, "update", spying_update)
    store = agl.SqliteStore(tmp_path / "store.db")
    agentlightning_autogen.instrument()  # the application's one line: the runner routes AutoGen's global provider
    runner = agl.Runner(math_agent, store=store, n_workers=16, worker_mode="async", poll_interval=0.02)
    runner_task = asyncio.create_task(runner.arun())
    tasks = [p.to_task() for p in make_problems(40, seed=3)]
    try:
        await trainer.start(store)
        reports = [await trainer.train_iteration(store, tasks) for _ in range(2)]
    finally:
        runner.stop()
        await asyncio.wait_for(runner_task, 60)
        await trainer.stop()
        agentlightning_autogen.uninstrument()

    assert [r.finished for r in reports] == [16, 16] and trainer.model_version == 2
    assert len(batches) == 2 and all(b.samples for b in batches)
    produced = set(generated)
    calls = 0
    for version, batch in enumerate(batches):
        by_rollout: dict[str, list[Any]] = {}
        for sample in batch.samples:
            # Transitions: exactly the token ids the backend generated (not re-tokenized), by the version then served.
            assert (tuple(sample.prompt_token_ids), tuple(sample.response_token_ids)) in produced
            assert sample.model_version == version and sample.agent_name == "solver"
            by_rollout.setdefault(sample.rollout_id, []).append(sample)
        ids = list(by_rollout)
        results = await results_from_store(store, ids)
        groups: dict[str, list[tuple[float, float]]] = {}
        for rollout_id, result in zip(ids, results, strict=True):
            samples = sorted(by_rollout[rollout_id], key=lambda s: s.step_index)
            # Credit: the episode's 0/1 reward goes to every call of it (identical credit); a calculator episode
            # is two calls, the second prompt extending the first prompt and response.
            assert result.final_reward in (0.0, 1.0)
            assert all(s.credit == result.final_reward for s in samples)
            if len(samples) == 2:
                first, second = samples
                assert second.prompt_token_ids[: len(first.prompt_token_ids) + len(first.response_token_ids)] == [
                    *first.prompt_token_ids,
                    *first.response_token_ids,
                ]
            calls += len(samples)
            groups.setdefault(samples[0].group_id, []).append((result.final_reward, samples[0].advantage))
        assert len(groups) == 4
        for members in groups.values():  # GRPO: advantages are the rewards centred on their group's mean
            mean = sum(r for r, _ in members) / len(members)
            assert all((a > 0) == (r > mean) and (a < 0) == (r < mean) for r, a in members)
        for rollout_id, result in zip(ids, results, strict=True):
            # A new model version is served: the store's LLM calls of this iteration name the version that answered.
            llm_calls = sorted(await store.query_llm_calls(rollout_id), key=lambda c: c.start_time)
            assert {c.model_version for c in llm_calls} == {version}
            # The reward is the exact match of the agent's last answer (0 when it ended on a tool call).
            last = (llm_calls[-1].response or {})["choices"][0]["message"]
            answer = (await store.get_rollout(rollout_id)).input["answer"]
            expected = 0.0 if last.get("tool_calls") else score(last.get("content"), answer)
            assert result.final_reward == expected
    assert calls > 32, "no episode called the calculator"
    await store.close()
