"""`LLMJudge` against a scripted judge server (real HTTP on 127.0.0.1), over finished rollouts in a real store.

A judge answer that is malformed, misses an id or is out of range is asked again, a bounded number of times; so are
a timeout, HTTP 429 and HTTP 500. When every try fails the rollout's reward is missing with the reason (stored as a
span, never 0), and a run where most rollouts miss one stops with that reason. Identical requests are answered from
the cache; a budget of calls stops asking. Verdicts are the one kind of span a store takes after an attempt's end.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import agentlightning as agl
from agentlightning import semconv
from agentlightning._models import AttributeValue, LLMCall, Span
from agentlightning.judge import (
    JUDGE_ERROR,
    JUDGE_SCOPE,
    JudgeConfig,
    JudgeFailedError,
    LLMJudge,
    apply_judgements,
    calibrate,
    check_failures,
    spearman,
)
from agentlightning.store import AttemptEndedError, RolloutRequest
from agentlightning.testing import ScriptedModelServer, ScriptedReply
from agentlightning.transitions import TransitionConfig, results_from_store

TRACE = "0" * 31 + "1"


def _good(body: dict[str, Any]) -> ScriptedReply:
    """Scores each rollout of a group by the answer its trace shows (``right`` best)."""
    user = body["messages"][1]["content"]
    sections = re.split(r"=== rollout (r\d+) ===", user)[1:]
    scores = [
        {"id": short, "score": 0.9 if "answer right" in text else 0.1, "reason": "checked the answer"}
        for short, text in zip(sections[::2], sections[1::2], strict=True)
    ]
    return ScriptedReply(content=json.dumps({"scores": scores}))


def _answer(scores: list[tuple[str, Any]]) -> str:
    return json.dumps({"scores": [{"id": i, "score": s, "reason": "r"} for i, s in scores]})


async def _finished(store: agl.LightningStore, groups: int = 2) -> list[str]:
    """``groups`` groups of two finished rollouts: an LLM span, its proxy record, a checker reward (s0 right)."""
    requests = [
        RolloutRequest(rollout_id=f"g{g}-s{s}", group_id=f"g{g}", input={"q": f"task {g}"})
        for g in range(groups)
        for s in range(2)
    ]
    await store.enqueue_rollouts(requests)
    ids: list[str] = []
    for _ in requests:
        claim = await store.dequeue_rollout("w")
        assert claim is not None
        rid, aid = claim.rollout.rollout_id, claim.attempt.attempt_id
        right = rid.endswith("s0")
        llm: dict[str, AttributeValue] = {
            semconv.SPAN_KIND: semconv.KIND_LLM,
            semconv.GEN_AI_RESPONSE_ID: f"resp-{rid}",
        }
        reward: dict[str, AttributeValue] = {
            semconv.SPAN_KIND: semconv.KIND_REWARD,
            semconv.REWARD_VALUE: 1.0 if right else 0.0,
        }
        spans = [
            Span(rollout_id=rid, attempt_id=aid, sequence_id=i, trace_id=TRACE, span_id=f"{i + 1:016x}",
                 name=name, start_time=100.0 + i, end_time=100.5 + i, attributes=attrs)
            for i, (name, attrs) in enumerate((("chat", llm), ("agentlightning.reward", reward)))
        ]  # fmt: skip
        answer = "answer right" if right else "answer wrong"
        call = LLMCall(
            call_id=f"call-{rid}", rollout_id=rid, attempt_id=aid, response_id=f"resp-{rid}",
            request={"messages": [{"role": "user", "content": f"task {rid}"}]},
            response={"choices": [{"message": {"role": "assistant", "content": answer}}]},
            prompt_token_ids=[1, 2], response_token_ids=[3], response_logprobs=[-0.1], start_time=100.0,
        )  # fmt: skip
        await store.add_spans(spans)
        await store.add_llm_calls([call])
        await store.finish_attempt(rid, aid, "succeeded")
        ids.append(rid)
    return ids


def _config(server: ScriptedModelServer, **settings: Any) -> JudgeConfig:
    return JudgeConfig(url=server.base_url, model="judge", rubric="The answer must be right.", **settings)


async def _verdicts(store: agl.LightningStore, rollout_id: str) -> list[Span]:
    spans = await store.query_spans(rollout_id)
    return [s for s in spans if s.attributes.get(semconv.SPAN_KIND) == semconv.KIND_JUDGE]


async def test_invalid_answers_are_retried_then_scored() -> None:
    store = agl.MemoryStore()
    ids = await _finished(store, groups=1)
    script: list[str | ScriptedReply] = [
        "I think r1 is better.",  # no JSON
        _answer([("r1", 0.9)]),  # r2 missing
        _answer([("r1", 1.5), ("r2", 0.1)]),  # out of range
        _answer([("r1", 0.9), ("r2", 0.1)]),
    ]
    with ScriptedModelServer(script) as server:
        judge = LLMJudge(_config(server, max_attempts=4))
        outcome = await judge.judge(store, ids)
        await judge.close()
    assert [outcome.judgements[i].score for i in ids] == [0.9, 0.1]
    assert outcome.counters.retries == 3 and outcome.counters.calls == 4 and not outcome.missing


async def test_a_rollout_the_judge_cannot_score_has_no_reward_and_the_reason(tmp_path: Path) -> None:
    store = agl.MemoryStore()
    ids = await _finished(store, groups=2)
    with ScriptedModelServer(lambda body: _answer([("r1", 0.5), ("r2", -1)])) as server:
        config = _config(server, max_attempts=2)
        judge = LLMJudge(config)
        outcome = await judge.judge(store, ids)
        await judge.close()
    assert len(outcome.missing) == 4 and outcome.counters.calls == 4
    assert all("id 'r2' has score -1, out of [0, 1]" in (j.missing or "") for j in outcome.missing)
    results = await results_from_store(store, ids, TransitionConfig())
    kept, missing = apply_judgements(results, outcome, config)
    assert kept == [] and set(missing) == set(ids)  # left out of training: never 0, never the checker's reward
    [failed] = await _verdicts(store, ids[0])
    assert failed.status.code == "error" and "out of [0, 1]" in str(failed.attributes[JUDGE_ERROR])
    with pytest.raises(JudgeFailedError, match=r"could not score 4 of 4 rollouts.*out of"):
        check_failures(len(ids), missing, config)
    check_failures(4, dict(list(missing.items())[:2]), config)  # half: below "most", training goes on


@pytest.mark.parametrize("status", [429, 500])
async def test_http_429_and_500_are_retried(status: int) -> None:
    store = agl.MemoryStore()
    ids = await _finished(store, groups=1)
    with ScriptedModelServer(_good) as server:
        server.fail_next(2, status=status)
        judge = LLMJudge(_config(server, max_attempts=3))
        outcome = await judge.judge(store, ids)
        server.fail_next(3, status=status)
        failing = await LLMJudge(_config(server, max_attempts=3)).judge(store, ids)
        await judge.close()
    assert [outcome.judgements[i].score for i in ids] == [0.9, 0.1]
    assert outcome.counters.failed_calls == 2 and outcome.counters.retries == 2
    assert all(f"HTTP {status}" in (j.missing or "") for j in failing.missing) and len(failing.missing) == 2


async def test_a_judge_that_does_not_answer_in_time() -> None:
    store = agl.MemoryStore()
    ids = await _finished(store, groups=1)
    with ScriptedModelServer(_good) as server:
        server.hold()  # received, never answered until released
        judge = LLMJudge(_config(server, max_attempts=2, timeout_s=0.2, max_retry_after_s=0))
        outcome = await judge.judge(store, ids)
        server.release()
        await judge.close()
    assert len(outcome.missing) == 2 and outcome.counters.calls == 2
    assert all("timeout" in (j.missing or "") for j in outcome.missing)


async def test_identical_requests_are_cached_and_the_budget_stops_asking() -> None:
    store = agl.MemoryStore()
    ids = await _finished(store, groups=2)
    with ScriptedModelServer(_good) as server:
        judge = LLMJudge(_config(server))
        first = await judge.judge(store, ids)
        second = await judge.judge(store, ids)  # same traces, same prompts
        assert len(server.requests) == 2 and second.counters.cache_hits == 2 and second.counters.calls == 0
        assert {i: j.score for i, j in second.judgements.items()} == {i: j.score for i, j in first.judgements.items()}
        await judge.close()
        budget = LLMJudge(_config(server, max_calls_per_iteration=1, temperature=0.5))
        limited = await budget.judge(store, ids)
        await budget.close()
    assert limited.counters.calls == 1 and limited.counters.budget_exhausted == 1
    assert len(limited.missing) == 2 and all("budget of 1 calls" in (j.missing or "") for j in limited.missing)


async def test_the_judge_reads_the_trace_never_the_checker() -> None:
    store = agl.MemoryStore()
    ids = await _finished(store, groups=1)
    with ScriptedModelServer(_good) as server:
        judge = LLMJudge(_config(server))
        await judge.judge(store, ids)
        await judge.close()
        [request] = server.requests
    user = request["messages"][1]["content"]
    assert "answer right" in user and "answer wrong" in user and "task g0-s0" in user
    assert "reward" not in user.lower()
    assert "The answer must be right." in request["messages"][0]["content"]


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
async def test_stores_take_verdicts_after_the_end_and_nothing_else(backend: str, tmp_path: Path) -> None:
    store: agl.LightningStore = agl.MemoryStore() if backend == "memory" else agl.SqliteStore(tmp_path / "s.db")
    [rid, *_] = await _finished(store, groups=1)
    [attempt] = await store.query_attempts(rid)
    verdict = Span(
        rollout_id=rid, attempt_id=attempt.attempt_id, sequence_id=9, trace_id=TRACE, span_id="00000000000000a1",
        name="judge.rollout", start_time=200.0, end_time=200.0,
        attributes={semconv.SPAN_KIND: semconv.KIND_JUDGE, JUDGE_SCOPE: "rollout"},
    )  # fmt: skip
    late = verdict.model_copy(update={"span_id": "00000000000000a2", "attributes": {semconv.SPAN_KIND: "llm"}})
    with pytest.raises(AttemptEndedError):
        await store.add_spans([verdict, late])  # a batch with any other span is refused whole
    assert await store.add_spans([verdict]) == 1
    assert [s.span_id for s in await _verdicts(store, rid)] == ["00000000000000a1"]
    await store.close()


async def test_calibrate_against_the_checker(tmp_path: Path) -> None:
    store = agl.MemoryStore()
    ids = await _finished(store, groups=2)
    with ScriptedModelServer(_good) as server:
        report = await calibrate(store, ids, _config(server, mode="step"))
    assert report.rollouts == 4 and report.binary and report.accuracy == 1.0 and report.spearman == pytest.approx(1.0)
    assert json.loads(report.write(tmp_path / "calibration.json").read_text())["accuracy"] == 1.0
    assert "accuracy 1.000, Spearman +1.000" in report.summary()
    assert spearman([0.1, 0.2, 0.3], [3.0, 2.0, 1.0]) == pytest.approx(-1.0)
    assert spearman([0.5, 0.5], [0.0, 1.0]) is None


AGENT = """
import aiohttp
import agentlightning as agl


@agl.rollout
async def agent(task, resources):
    llm = resources.llm
    body = {"model": llm.model, "messages": [{"role": "user", "content": f"answer {task['q']}"}], "max_tokens": 8}
    headers = {"Authorization": f"Bearer {llm.api_key}"}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{agl.llm_base_url()}/chat/completions", json=body, headers=headers) as resp:
            answer = (await resp.json())["choices"][0]["message"]["content"]
    return 1.0 if "right" in answer else 0.0
"""


def test_agl_judge_calibrate(tmp_path: Path) -> None:
    """The command runs the agent through a proxy (the judge reads its calls), judges each group, and reports."""
    (tmp_path / "calib_agent.py").write_text(AGENT)
    (tmp_path / "tasks.jsonl").write_text("\n".join(json.dumps({"q": q}) for q in ("right", "wrong", "right")))
    (tmp_path / "rubric.md").write_text("The answer must be right.")
    output = tmp_path / "out"
    with ScriptedModelServer() as policy, ScriptedModelServer(_good) as judge_server:
        words = ["--tasks", str(tmp_path / "tasks.jsonl"), "--agent", "calib_agent:agent", "--app-dir", str(tmp_path)]
        words += ["--llm-url", policy.base_url, "--samples", "2", "--output", str(output)]
        words += ["--judge", judge_server.base_url, "--judge-model", "judge", "--rubric", str(tmp_path / "rubric.md")]
        done = subprocess.run(
            [sys.executable, "-m", "agentlightning.cli", "judge", "calibrate", *words],
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert done.returncode == 0, done.stderr
        assert len(judge_server.requests) == 3 and len(policy.requests) == 6  # one judge call per task's group
    assert "judge vs checker on 6 rollouts: accuracy 1.000, Spearman +1.000" in done.stdout
    report = json.loads((output / "calibration.json").read_text())
    assert report["rollouts"] == 6 and report["binary"] and report["accuracy"] == 1.0
    missing = subprocess.run(
        [sys.executable, "-m", "agentlightning.cli", "judge", "calibrate", *words[:-6]],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert missing.returncode == 2 and "needs --judge URL" in missing.stderr


async def test_the_answer_length_bound_is_sent_when_set() -> None:
    """A small local judge that loops would otherwise fill the server's default: the rest of its context."""
    store = agl.MemoryStore()
    ids = await _finished(store, groups=1)
    with ScriptedModelServer(_good) as server:
        for settings, expected in (({}, None), ({"max_tokens": 200}, 200)):
            judge = LLMJudge(_config(server, **settings))
            outcome = await judge.judge(store, ids)
            await judge.close()
            assert not outcome.missing
            assert server.requests[-1].get("max_tokens") == expected


def test_agl_options_bound_the_answer_and_the_tries(tmp_path: Path) -> None:
    """``--judge-answer-tokens`` and ``--judge-attempts`` reach the config (``agl train``, ``train.py``, calibrate)."""
    import argparse

    from agentlightning.cli import add_judge_arguments, judge_config

    (tmp_path / "rubric.md").write_text("The answer must be right.")
    parser = argparse.ArgumentParser()
    add_judge_arguments(parser)
    base = ["--judge", "http://127.0.0.1:9/v1", "--judge-model", "j", "--rubric", str(tmp_path / "rubric.md")]
    default = judge_config(parser.parse_args(base))
    assert default.max_tokens is None and default.max_attempts == 3
    bounded = judge_config(parser.parse_args([*base, "--judge-answer-tokens", "160", "--judge-attempts", "1"]))
    assert bounded.max_tokens == 160 and bounded.max_attempts == 1
    with pytest.raises(ValueError, match="max_attempts"):
        judge_config(parser.parse_args([*base, "--judge-attempts", "0"]))
