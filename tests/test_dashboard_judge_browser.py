"""The judge's verdicts in the dashboard, in a real headless Chromium, against a real ``agl store serve`` process.

Rollouts are recorded through the HTTP store client (a planner's and a solver's LLM call each, with the proxy's
records), then an `LLMJudge` with a scripted judge server on 127.0.0.1 scores each group and each step; its verdicts
travel to the served store through the same client after the attempts have ended. The rollout page must show the
rollout's score and reason, each step's score and reason next to that LLM call, and the verdict spans in the timeline
under the step they judge; a rollout the judge could not score shows why. The views are saved as screenshots under
``runs/test-artifacts/dashboard-judge`` (or ``$AGL_TEST_ARTIFACTS``).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

import agentlightning as agl
from agentlightning import semconv
from agentlightning.judge import JudgeConfig, LLMJudge
from agentlightning.testing import ScriptedModelServer, ScriptedReply, StoreServerProcessForTests

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "dashboard-judge-token"
TRACE = "0" * 31 + "7"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]


def _chromium() -> str:
    path = shutil.which("chromium") or "/usr/bin/chromium"
    missing = None
    if not os.path.exists(path):
        missing = "Debian's chromium is not installed (apt-get install chromium; scripts/dev.py test does it as root)"
    try:
        import playwright.sync_api  # noqa: F401  # pyright: ignore[reportUnusedImport]
    except ImportError:
        missing = "the playwright Python package is not installed (pip install playwright)"
    if missing is not None:
        if os.environ.get("CI"):
            pytest.fail(f"browser tests must run in CI: {missing}")
        pytest.skip(missing)
    return path


def _judge(body: dict[str, Any]) -> ScriptedReply:
    """Group g0 is judged (s0 best); group g1's answer always misses a rollout; steps by agent."""
    system, user = body["messages"][0]["content"], body["messages"][1]["content"]
    if '"scores"' in system:
        sections = re.split(r"=== rollout (r\d+) ===", user)[1:]
        pairs = list(zip(sections[::2], sections[1::2], strict=True))
        if "task g1" in user:
            pairs = pairs[:1]
        scores = [
            {"id": short, "score": 0.8 if "sample s0" in text else 0.3, "reason": f"the answer of {short} is complete"}
            for short, text in pairs
        ]
        return ScriptedReply(content=json.dumps({"scores": scores}))
    steps = re.findall(r"\[step (\d+)\] agent=(\w+)", user)
    answer = [{"step": int(n), "score": 0.6, "reason": f"the {agent} moved the task on"} for n, agent in steps]
    return ScriptedReply(content=json.dumps({"steps": answer}))


def _span(rid: str, aid: str, i: int, name: str, attrs: dict[str, Any]) -> agl.Span:
    return agl.Span(
        rollout_id=rid, attempt_id=aid, sequence_id=i, trace_id=TRACE, span_id=f"{i + 1:016x}", name=name,
        start_time=100.0 + i, end_time=100.5 + i, attributes=attrs,
    )  # fmt: skip


async def _fill(url: str) -> None:
    store = agl.StoreClient(url, token=TOKEN)
    requests = [
        agl.RolloutRequest(rollout_id=f"g{g}-s{s}", group_id=f"g{g}", input={"q": f"task g{g}"}, mode="train")
        for g in range(2)
        for s in range(2)
    ]
    await store.enqueue_rollouts(requests)
    for _ in requests:
        claim = await store.dequeue_rollout("w")
        assert claim is not None
        rid, aid = claim.rollout.rollout_id, claim.attempt.attempt_id
        spans, calls = [], []
        for i, agent in enumerate(("planner", "solver")):
            attrs: dict[str, Any] = {
                semconv.SPAN_KIND: semconv.KIND_LLM,
                semconv.GEN_AI_AGENT_NAME: agent,
                semconv.GEN_AI_RESPONSE_ID: f"resp-{rid}-{i}",
            }
            spans.append(_span(rid, aid, i, f"chat {agent}", attrs))
            call = agl.LLMCall(
                call_id=f"call-{rid}-{i}", rollout_id=rid, attempt_id=aid, response_id=f"resp-{rid}-{i}",
                request={"messages": [{"role": "user", "content": f"{agent}: sample {rid[-2:]}"}]},
                response={"choices": [{"message": {"role": "assistant", "content": f"{agent} answer"}}]},
                prompt_token_ids=[1, 2], response_token_ids=[3], response_logprobs=[-0.1], start_time=100.0 + i,
                agent_name=agent,
            )  # fmt: skip
            calls.append(call)
        await store.add_spans(spans)
        await store.add_llm_calls(calls)
        await store.finish_attempt(rid, aid, "succeeded")
    with ScriptedModelServer(_judge) as server:
        judge = LLMJudge(
            JudgeConfig(url=server.base_url, model="judge", rubric="A complete answer.", mode="both", max_attempts=2)
        )
        outcome = await judge.judge(store, [r.rollout_id for r in requests])
        await judge.close()
    assert len(outcome.missing) == 2  # group g1
    await store.close()


def _artifacts() -> Path:
    folder = Path(os.environ.get("AGL_TEST_ARTIFACTS", ROOT / "runs" / "test-artifacts")) / "dashboard-judge"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def test_the_rollout_view_shows_the_judges_reasons(tmp_path: Path) -> None:
    chromium = _chromium()
    from playwright.sync_api import sync_playwright

    shots = _artifacts()
    view = "main#view"
    with StoreServerProcessForTests(tmp_path / "store.db", token=TOKEN) as server:
        asyncio.run(_fill(server.url))
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS, headless=True)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1200})
                errors: list[str] = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                # before the login, the page's first requests are refused (401): only other errors count
                page.on(
                    "console",
                    lambda msg: errors.append(msg.text) if msg.type == "error" and "401" not in msg.text else None,
                )
                page.goto(server.url + "/ui")
                page.fill("#token", TOKEN)
                page.click("#login-submit")
                page.wait_for_selector(f"{view}[data-view=runs][data-loaded]")

                page.goto(server.url + "/ui#/rollout/g0-s0")
                # the state asserted below: the verdict card and both step verdicts next to their calls
                page.wait_for_selector("#judge-verdict:has-text('is complete')")
                page.wait_for_selector(".call[data-call-id='call-g0-s0-1'] .judge-step:has-text('the solver moved')")
                assert "judge 0.8" in page.inner_text("#judge-verdict")
                planner = page.inner_text(".call[data-call-id='call-g0-s0-0'] .judge-step")
                assert "judge step 1 0.6" in planner and "the planner moved the task on" in planner
                # the transitions' rewards are the judge's (the rollout's score, each step's), as a trainer gave them
                page.wait_for_selector("#transitions-table tr[data-step='1']:has-text('0.800')")
                step = page.inner_text("#transitions-table tr[data-step='0']")
                assert "0.600" in step and "0.800" in step
                rows = page.locator("#span-tree .span-row[data-kind=judge]")
                assert rows.count() == 3  # the rollout's verdict and one per step
                page.screenshot(path=str(shots / "judged-rollout.png"), full_page=True)

                page.goto(server.url + "/ui#/rollout/g1-s1")
                page.wait_for_selector("#judge-verdict .error:has-text('no reward')")
                assert "misses id(s) r2" in page.inner_text("#judge-verdict")
                page.wait_for_selector("#problems:has-text('a trainer leaves this rollout out')")
                page.screenshot(path=str(shots / "unjudged-rollout.png"), full_page=True)
                assert errors == [], f"JavaScript errors in the page: {errors}"
            finally:
                browser.close()
