"""examples/math: the AutoGen agent against real servers on 127.0.0.1, the warm-start transcripts, the eval mode, and
two RL iterations through the whole stack.

runner process (AutoGen adapter) -> LLM proxy -> local backend -> SQLite store -> transitions -> GRPO credit -> PPO
-> new model version served.
"""

from __future__ import annotations

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

from agent import SYSTEM_MESSAGE, make_client, solve  # noqa: E402  # pyright: ignore[reportMissingImports]
from math_eval import summarize  # noqa: E402  # pyright: ignore[reportMissingImports]
from math_model import MATH_CHAT_TEMPLATE, calculator_tools, transcript  # noqa: E402  # pyright: ignore[reportMissingImports]
from math_task import make_problems  # noqa: E402  # pyright: ignore[reportMissingImports]


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


# ----- the eval mode and the GPU recipe ------------------------------------------------------------------------------


def test_the_gpu_recipe_builds_a_verl_config() -> None:
    pytest.importorskip("agentlightning_verl")
    from gpu_config import CONFIG, LOOP  # pyright: ignore[reportMissingImports]

    verl = CONFIG.to_verl_config()
    assert verl.actor_rollout_ref.model.path == "Qwen/Qwen2.5-1.5B-Instruct"
    assert LOOP.samples_per_task == 8 and LOOP.tasks_per_iteration == 32 and LOOP.estimator == "grpo"
