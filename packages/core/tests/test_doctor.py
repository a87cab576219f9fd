"""``agl doctor --store``: agents seeded with one defect each, run for real (runner, LLM proxy, SQLite store, the
openai SDK over HTTP to a scripted model on 127.0.0.1), are each named with the right check and fix."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import openai
import pytest

import agentlightning as agl
from agentlightning.cli import main
from agentlightning.doctor import DoctorReport, diagnose
from agentlightning.proxy import LLMProxy
from agentlightning.testing import ScriptedModelServer, ScriptedReply, ToyTokenizer

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}},
    }
]


class ToyTemplate:
    """The scripted model's own chat template (what `ScriptedModelServer` renders prompts with)."""

    def __init__(self, tokenizer: ToyTokenizer, system: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.system = system  # a template that adds a system turn: one that differs from the server's

    def _messages(self, messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        return [{"role": "system", "content": self.system}, *messages] if self.system else list(messages)

    def render_text(self, messages: Sequence[Mapping[str, Any]], *, tools: Any = None) -> str:
        return self.tokenizer.render_chat(self._messages(messages), tools)

    def render(self, messages: Sequence[Mapping[str, Any]], *, tools: Any = None) -> list[int]:
        return self.tokenizer.encode(self.render_text(messages, tools=tools))


@pytest.fixture(autouse=True)
def _openai_spans() -> Iterator[None]:
    agl.instrument_openai()  # the adapter line of a plain openai agent
    yield
    agl.uninstrument_openai()


def _client(base_url: str | None = None) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url or agl.llm_base_url(), api_key="unused", max_retries=0)


def _graded(task: dict[str, Any], text: str) -> float:
    """A reward that differs within a group: the sample index decides (as a real checker's verdict would)."""
    return 1.0 if task["sample"] % 2 else 0.0


async def _ask(task: dict[str, Any], resources: agl.Resources, **options: Any) -> str:
    assert resources.llm is not None
    reply = await _client().chat.completions.create(
        model=resources.llm.model, messages=[{"role": "user", "content": task["question"]}], **options
    )
    return reply.choices[0].message.content or ""


@agl.rollout
async def healthy(task: dict[str, Any], resources: agl.Resources) -> float:
    """Two turns, the first answer passed back as it came, a graded reward."""
    assert resources.llm is not None
    messages: list[Any] = [{"role": "user", "content": task["question"]}]
    first = await _client().chat.completions.create(model=resources.llm.model, messages=messages)
    messages += [{"role": "assistant", "content": first.choices[0].message.content}, {"role": "user", "content": "ok"}]
    second = await _client().chat.completions.create(model=resources.llm.model, messages=messages)
    return _graded(task, second.choices[0].message.content or "")


@agl.rollout
async def no_reward(task: dict[str, Any], resources: agl.Resources) -> None:
    await _ask(task, resources)  # forgets to return its score


@agl.rollout
async def constant_reward(task: dict[str, Any], resources: agl.Resources) -> float:
    await _ask(task, resources)
    return 1.0


@agl.rollout
async def rewrites_history(task: dict[str, Any], resources: agl.Resources) -> float:
    assert resources.llm is not None
    first = await _ask(task, resources)
    summary = f"(earlier you said: {first.upper()})"  # the history is summarised, not passed back
    messages: list[Any] = [{"role": "user", "content": task["question"]}, {"role": "user", "content": summary}]
    second = await _client().chat.completions.create(model=resources.llm.model, messages=messages)
    return _graded(task, second.choices[0].message.content or "")


@agl.rollout
async def truncating(task: dict[str, Any], resources: agl.Resources) -> float:
    return _graded(task, await _ask(task, resources, max_tokens=3))


@agl.rollout
async def with_tools(task: dict[str, Any], resources: agl.Resources) -> float:
    return _graded(task, await _ask(task, resources, tools=TOOLS))


@agl.rollout
async def own_template(task: dict[str, Any], resources: agl.Resources) -> float:
    """Renders its prompt itself ("User: ...") and calls the completions API."""
    assert resources.llm is not None
    prompt = f"User: {task['question']}\nAssistant:"
    reply = await _client().completions.create(model=resources.llm.model, prompt=prompt)
    return _graded(task, reply.choices[0].text)


def _answer(request: dict[str, Any]) -> ScriptedReply:
    """The scripted model: a short answer, cut (finish reason length) at the request's max_tokens as vLLM does."""
    text = "The answer is 5."
    limit = request.get("max_tokens")
    if isinstance(limit, int) and limit < len(text):
        return ScriptedReply(content=text[:limit], finish_reason="length")
    return ScriptedReply(content=text)


def _unparsed_tool_call(request: dict[str, Any]) -> ScriptedReply:
    """A model that writes a tool call the server's parser cannot read: it reaches the agent as text."""
    return ScriptedReply(content='<tool_call>{"name": "add", "arguments": {"a": 2,</tool_call>')


async def _run(
    db: Path,
    agent: Any,
    *,
    script: Callable[[dict[str, Any]], ScriptedReply] = _answer,
    agent_for_model: Callable[[str], Any] | None = None,
    tasks: int = 2,
    samples: int = 3,
    workers: int = 4,
    slots: bool = True,
) -> ToyTokenizer:
    """Run ``tasks`` x ``samples`` rollouts of ``agent`` into the SQLite store ``db``; returns the model's tokenizer."""
    store = agl.SqliteStore(str(db))
    with ScriptedModelServer(script) as model:
        if agent_for_model is not None:
            agent = agent_for_model(model.base_url)
        async with LLMProxy(store, [model.base_url]) as proxy:
            llm = proxy.llm_resource("toy")
            if not slots:  # no runner token: each rollout gets its own URL (the proxy records calls by it)
                llm = llm.model_copy(update={"runner_token": None})
            await store.add_resources(agl.Resources(resources_id="v1", items={"llm": llm}))
            for t in range(tasks):
                for s in range(samples):
                    await store.enqueue_rollout({"question": f"What is {t} + 3?", "sample": s}, group_id=f"task-{t}")
            await agl.Runner(agent, store=store, n_workers=workers, stop_when_idle=True).arun()
        return model.tokenizer


def _doctor(db: Path, tokenizer: ToyTokenizer, **options: Any) -> DoctorReport:
    return asyncio.run(diagnose(agl.SqliteStore(str(db)), renderer=ToyTemplate(tokenizer), **options))


def _checks(report: DoctorReport, severity: str = "problem") -> set[str]:
    return {f.check for f in report.findings if f.severity == severity}


def test_a_healthy_plain_openai_agent_is_trainable(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    tokenizer = asyncio.run(_run(db, healthy))
    report = _doctor(db, tokenizer, context=4096)
    assert report.trainable, [f.line() for f in report.findings]
    assert report.findings == []
    (site,) = report.sites
    assert (site.calls, site.recorded, site.with_token_ids) == (12, 12, 12)
    assert (site.template_checked, site.template_equal, site.multi_turn, site.prefix_extends) == (12, 12, 6, 6)
    figures = report.figures
    assert (figures.rollouts, figures.with_reward, figures.groups, figures.flat_groups) == (6, 6, 2, 0)
    assert figures.transitions == 12 and figures.calls_per_rollout == 2.0
    assert (figures.reward_min, figures.reward_max) == (0.0, 1.0)


def test_no_reward_is_named_with_its_fix(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    report = _doctor(db, asyncio.run(_run(db, no_reward)))
    (finding,) = [f for f in report.findings if f.check == "no-reward"]
    assert finding.message.startswith("no reward reached 6 of 6 rollouts: the agent returned None")
    assert "return a float or call agl.emit_reward" in finding.message
    assert not report.trainable


def test_a_constant_reward_is_named(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    report = _doctor(db, asyncio.run(_run(db, constant_reward)))
    assert _checks(report) == {"constant-reward"}
    (finding,) = report.problems
    assert "every one of 6 rollouts got reward 1.0" in finding.message and "depend on" in finding.message


def test_a_client_that_bypasses_the_proxy_is_found_from_its_spans(tmp_path: Path) -> None:
    def agent_for(model_url: str) -> Any:
        @agl.rollout
        async def bypassing(task: dict[str, Any], resources: agl.Resources) -> float:
            client = _client(model_url)  # the model server's own URL, not agl.llm_base_url()
            reply = await client.chat.completions.create(
                model="toy", messages=[{"role": "user", "content": task["question"]}]
            )
            return _graded(task, reply.choices[0].message.content or "")

        return bypassing

    db = tmp_path / "store.db"
    report = _doctor(db, asyncio.run(_run(db, None, agent_for_model=agent_for)))
    assert "bypassed-proxy" in _checks(report)
    (finding,) = [f for f in report.findings if f.check == "bypassed-proxy"]
    assert finding.message.startswith("6 of 6 calls never reached the LLM proxy")
    assert "base_url=agl.llm_base_url()" in finding.message
    assert report.sites[0].recorded == 0


def test_a_client_cached_with_an_earlier_rollout_s_url_is_found(tmp_path: Path) -> None:
    cached: list[openai.AsyncOpenAI] = []

    @agl.rollout
    async def caching(task: dict[str, Any], resources: agl.Resources) -> float:
        if not cached:  # built in the first rollout, kept for the next ones: their calls carry its URL
            cached.append(_client())
        reply = await cached[0].chat.completions.create(
            model="toy", messages=[{"role": "user", "content": task["question"]}]
        )
        return _graded(task, reply.choices[0].message.content or "")

    db = tmp_path / "store.db"
    report = _doctor(db, asyncio.run(_run(db, caching, workers=1, slots=False)))
    (finding,) = [f for f in report.findings if f.check == "bypassed-proxy"]
    assert finding.message.startswith("5 of 6 calls never reached the LLM proxy")
    assert "built for an earlier rollout and kept" in finding.message and not report.trainable


def test_a_missing_adapter_line_loses_the_agent_names(tmp_path: Path) -> None:
    agl.uninstrument_openai()  # the agent runs without its adapter line
    db = tmp_path / "store.db"
    tokenizer = asyncio.run(_run(db, healthy))
    report = _doctor(db, tokenizer, agent_filter=["writer"])
    (finding,) = [f for f in report.findings if f.check == "no-adapter"]
    assert finding.severity == "problem" and "agent names are lost" in finding.message
    assert "agl.instrument_all()" in finding.message and "agent_filter selects none" in finding.message
    assert report.figures.transitions == 0 and not report.trainable
    # without an agent filter the calls still train (as one agent): a warning that says so
    unfiltered = _doctor(db, tokenizer)
    assert _checks(unfiltered, "warning") == {"no-adapter"} and unfiltered.trainable


def test_a_prompt_the_agent_renders_with_its_own_template_is_found(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    report = _doctor(db, asyncio.run(_run(db, own_template)))
    assert _checks(report) == {"template-mismatch"}
    assert report.problems[0].message.startswith("6 of 6 prompts differ from the model's own chat template")


def test_a_server_template_that_differs_from_the_model_s_is_found(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    tokenizer = asyncio.run(_run(db, healthy))
    served_by_another = asyncio.run(diagnose(agl.SqliteStore(str(db)), renderer=ToyTemplate(tokenizer, "sys")))
    assert _checks(served_by_another) == {"template-mismatch"}
    assert served_by_another.sites[0].template_equal == 0


def test_max_tokens_that_cut_every_answer_are_named(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    report = _doctor(db, asyncio.run(_run(db, truncating)))
    assert _checks(report) == {"truncated"}
    assert "6 of 6 answers were cut by max_tokens" in report.problems[0].message
    assert "raise --max-tokens" in report.problems[0].message


def test_tool_calls_the_parser_cannot_read_are_named(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    report = _doctor(db, asyncio.run(_run(db, with_tools, script=_unparsed_tool_call)))
    assert _checks(report) == {"tool-calls-unparsed"}
    assert "--tool-parser" in report.problems[0].message
    site = report.sites[0]
    assert (site.tool_calls_attempted, site.tool_calls_parsed) == (6, 0)


def test_parsed_tool_calls_are_not_a_problem(tmp_path: Path) -> None:
    def call_add(request: dict[str, Any]) -> ScriptedReply:
        return ScriptedReply(tool_calls=[{"name": "add", "arguments": {"a": 2}}])

    db = tmp_path / "store.db"
    report = _doctor(db, asyncio.run(_run(db, with_tools, script=call_add)))
    assert report.trainable and report.sites[0].tool_calls_parsed == 6


def test_a_history_rewriting_agent_breaks_the_prefix(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    report = _doctor(db, asyncio.run(_run(db, rewrites_history)))
    (finding,) = [f for f in report.findings if f.check == "prefix-broken"]
    assert finding.message.startswith("6 of 6 later turns do not extend the agent's previous prompt + response")
    assert "append-only" in finding.message


def test_agl_doctor_store_prints_json_and_exits_1_with_problems(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "store.db"
    asyncio.run(_run(db, no_reward, tasks=1, samples=2))
    assert main(["doctor", "--store", str(db), "--json"]) == 1
    data = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert data["trainable"] is False and "no-reward" in {f["check"] for f in data["findings"]}
    assert main(["doctor", "--store", str(db)]) == 1
    out = capsys.readouterr().out
    assert "[no-reward] no reward reached 2 of 2 rollouts" in " ".join(out.split()) and "not trainable" in out


def test_agl_doctor_store_exits_0_when_trainable_and_2_when_it_cannot_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "store.db"
    asyncio.run(_run(db, healthy, tasks=1, samples=2))
    assert main(["doctor", "--store", str(db)]) == 0
    assert "trainable" in capsys.readouterr().out
    assert main(["doctor", "--store", str(tmp_path / "missing.db")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["doctor", "--store", str(db), "--agent", "calc_agent:calc_agent"]) == 2  # one or the other
    assert "to run the agent, leave --store out" in capsys.readouterr().err


def test_the_dashboard_health_panel_shows_the_checks_of_a_live_run(tmp_path: Path) -> None:
    """``POST /v1/ui/health`` of a served store: the newest finished rollouts' findings, behind the token."""
    import urllib.error
    import urllib.request

    from agentlightning.testing import StoreServerProcessForTests
    from agentlightning.ui import load_assets

    db = tmp_path / "store.db"
    asyncio.run(_run(db, no_reward, tasks=1, samples=2))
    assert b"/v1/ui/health" in load_assets()["health.js"][0]

    def post(url: str, body: dict[str, Any], token: str | None) -> tuple[int, dict[str, Any]]:
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
        request = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"{}")

    with StoreServerProcessForTests(db, token="sesame") as server:
        assert post(server.url + "/v1/ui/health", {}, None)[0] == 401
        status, report = post(server.url + "/v1/ui/health", {"last": 1}, "sesame")
        assert status == 200 and report["checked"] == 1 and report["trainable"] is False
        assert [f["check"] for f in report["findings"]] == ["no-reward"]
        assert report["findings"][0]["message"].startswith("no reward reached 1 of 1 rollouts")
        assert post(server.url + "/v1/ui/health", {"last": 0}, "sesame")[0] == 422
