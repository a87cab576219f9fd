"""Command agents (`agl.CommandAgent`, ``agl runner --agent-command``): a program per rollout, in any language.

Real parts: real child processes (a Python agent with its own interpreter and the ``openai`` SDK), a real LLM proxy
in front of a scripted model server, a real SQLite store; every misbehaving command ends its attempt with the reason
and leaves no process behind.
"""

from __future__ import annotations

import asyncio
import shlex
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

import agentlightning as agl
from agentlightning.proxy import LLMProxy
from agentlightning.testing import ScriptedModelServer, wait_until

PYTHON = shlex.quote(sys.executable)

OPENAI_AGENT = """
import json, os, sys
from openai import OpenAI

task = json.load(sys.stdin)
assert "AGL_STORE_TOKEN" not in os.environ and "AGL_PROXY_TOKEN" not in os.environ
assert os.environ["ANTHROPIC_BASE_URL"] + "/v1" == os.environ["OPENAI_BASE_URL"]
client = OpenAI()  # base URL and key from the environment, as every OpenAI SDK reads them
reply = client.chat.completions.create(
    model=os.environ["OPENAI_MODEL"], messages=[{"role": "user", "content": task["question"]}]
)
print("some log line on stdout: ignored")
ids = os.environ["AGL_ROLLOUT_ID"], os.environ["AGL_ATTEMPT_ID"]
print(json.dumps({"reward": 1.0 if task["expected"] in reply.choices[0].message.content else 0.0, "ids": ids}))
"""


def _write(folder: Path, name: str, source: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(source))
    return path


def test_a_python_agent_with_its_own_interpreter_is_trained_through_the_proxy(tmp_path: Path) -> None:
    _write(tmp_path, "agent.py", OPENAI_AGENT)
    # -I: the child's own interpreter setup (no PYTHONPATH, no user site): nothing of the runner's process
    agent = agl.CommandAgent(f"{PYTHON} -I agent.py", cwd=tmp_path)

    async def main() -> tuple[list[agl.Rollout], list[agl.Transition], list[agl.Attempt]]:
        store = agl.SqliteStore(tmp_path / "store.db")
        with ScriptedModelServer(lambda request: "2 + 2 = 4") as model:
            async with LLMProxy(store, [model.base_url]) as proxy:
                await store.add_resources(agl.Resources(resources_id="v1", items={"llm": proxy.llm_resource("toy")}))
                tasks = [{"question": f"What is 2 + {i}?", "expected": "4" if i == 2 else "x"} for i in (1, 2, 3)]
                rollouts = [await store.enqueue_rollout(task) for task in tasks]
                await agl.Runner(agent, store=store, n_workers=3, stop_when_idle=True).arun()
        ids = [r.rollout_id for r in rollouts]
        attempts = [a for i in ids for a in await store.query_attempts(i)]
        return await store.query_rollouts(rollout_ids=ids), await agl.transitions_from_store(store, ids), attempts

    rollouts, transitions, attempts = asyncio.run(main())
    assert [r.status for r in rollouts] == ["succeeded"] * 3, [a.error for a in attempts]
    assert [t.final_reward for t in transitions] == [0.0, 1.0, 0.0]
    assert all(t.prompt_token_ids and t.response_token_ids for t in transitions)


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ("import sys; print('boom', file=sys.stderr); sys.exit(1)", "exited with code 1; its stderr ended with: boom"),
        ("import sys; print('thinking', file=sys.stderr)", "printed no reward line on stdout"),
        ("print('0.5'); print('the answer is 4')", "the last line of stdout is not a reward: 'the answer is 4'"),
        ("print('{\"score\": 1}')", "without a 'reward' key"),
        ("print('NaN')", "not a finite number"),
    ],
    ids=["exit-1", "no-reward-line", "garbage", "no-reward-key", "nan"],
)
def test_a_command_that_fails_fails_its_attempt_with_the_reason(tmp_path: Path, source: str, reason: str) -> None:
    _write(tmp_path, "agent.py", source)
    error = _run_one(tmp_path, agl.CommandAgent(f"{PYTHON} agent.py", cwd=tmp_path))
    assert reason in error


SPAWNER = """
import os, signal, sys, time
pids = open(sys.argv[1], "a")
if os.fork() == 0:  # a child that ignores SIGTERM and outlives its parent's end
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    pids.write(f"{os.getpid()}\\n"); pids.flush()
    time.sleep(600)
    os._exit(0)
pids.write(f"{os.getpid()}\\n"); pids.flush()
print("started", file=sys.stderr, flush=True)
{tail}
"""


@pytest.mark.parametrize(
    ("tail", "reason"),
    [
        ("time.sleep(600)", "ran past its timeout of 2s and was stopped; its stderr ended with: started"),
        ("print('{\"reward\": 1}')", None),  # the agent succeeds: what it left behind is ended all the same
        ("sys.stdout.buffer.write(b'x' * 100_000_000)", "wrote more than 1048576 bytes to stdout and was stopped"),
    ],
    ids=["hangs", "leaves-a-child", "100mb-stdout"],
)
def test_a_command_and_its_children_never_outlive_their_rollout(tmp_path: Path, tail: str, reason: str | None) -> None:
    _write(tmp_path, "agent.py", SPAWNER.replace("{tail}", tail))
    pids = tmp_path / "pids"
    agent = agl.CommandAgent(
        f"{PYTHON} agent.py {pids}", cwd=tmp_path, timeout=2.0, stop_grace_s=0.5, max_stdout_bytes=1 << 20
    )
    error = _run_one(tmp_path, agent, succeeds=reason is None)
    if reason is not None:
        assert reason in error
    started = [int(line) for line in pids.read_text().split()]
    assert len(started) == 2
    wait_until(lambda: not any(_alive(pid) for pid in started), "the command's processes to be gone")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _run_one(tmp_path: Path, agent: agl.CommandAgent, succeeds: bool = False) -> str:
    """Run one rollout of ``agent`` (no retry); the attempt's error (``""`` when it succeeded, as ``succeeds`` says)."""

    async def main() -> tuple[agl.Rollout, agl.Attempt]:
        store = agl.SqliteStore(tmp_path / "one.db", retry_policy=agl.RetryPolicy(max_attempts=1))
        rollout = await store.enqueue_rollout({"question": "?"})
        await agl.Runner(agent, store=store, stop_when_idle=True).arun()
        (attempt,) = await store.query_attempts(rollout.rollout_id)
        return await store.get_rollout(rollout.rollout_id), attempt

    rollout, attempt = asyncio.run(main())
    assert rollout.status == ("succeeded" if succeeds else "failed"), attempt.error
    if not succeeds:
        assert attempt.error is not None and attempt.error.startswith("CommandAgentError: the agent command ")
    return attempt.error or ""


def test_a_cancelled_rollout_stops_its_command(tmp_path: Path) -> None:
    _write(tmp_path, "agent.py", SPAWNER.replace("{tail}", "time.sleep(600)"))
    pids = tmp_path / "pids"
    agent = agl.CommandAgent(f"{PYTHON} agent.py {pids}", cwd=tmp_path, stop_grace_s=0.5)

    async def main() -> None:
        store = agl.SqliteStore(tmp_path / "cancel.db")
        rollout = await store.enqueue_rollout({"question": "?"})
        runner = agl.Runner(agent, store=store, heartbeat_interval=0.1, stop_when_idle=True)
        running = asyncio.ensure_future(runner.arun())
        while not (pids.exists() and len(pids.read_text().split()) == 2):
            await asyncio.sleep(0.05)  # waiting for the command to start (both processes wrote their pid)
        await store.cancel_rollout(rollout.rollout_id)
        await running

    asyncio.run(main())
    started = [int(line) for line in pids.read_text().split()]
    wait_until(lambda: not any(_alive(pid) for pid in started), "the cancelled command's processes to be gone")


def test_bad_commands_are_refused_when_the_agent_is_made(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="empty"):
        agl.CommandAgent("  ")
    with pytest.raises(ValueError, match="'no-such-program-xyz' was not found on PATH"):
        agl.CommandAgent("no-such-program-xyz --flag")
    with pytest.raises(ValueError, match="does not exist"):
        agl.CommandAgent("python agent.py", cwd=tmp_path / "missing")


def test_reward_lines() -> None:
    from agentlightning.runner import parse_reward_line

    assert parse_reward_line('{"reward": 0.7, "steps": 3}') == 0.7
    assert parse_reward_line("1") == 1.0
    assert parse_reward_line("null") is None
    assert parse_reward_line('{"reward": null}') is None
    for bad in ("true", '"1"', "[1]", "Infinity", "reward: 1"):
        with pytest.raises(ValueError):
            parse_reward_line(bad)


BARRIER = """
import os, sys, time
folder = sys.argv[1]
open(os.path.join(folder, str(os.getpid())), "w").close()
while len(os.listdir(folder)) < 3:  # every rollout's command waits for the others: only concurrent ones finish
    time.sleep(0.02)
print(1)
"""


def test_the_runners_workers_run_that_many_commands_at_once(tmp_path: Path) -> None:
    _write(tmp_path, "agent.py", BARRIER)
    (tmp_path / "started").mkdir()
    agent = agl.CommandAgent(f"{PYTHON} agent.py started", cwd=tmp_path, timeout=120)

    async def main() -> list[str]:
        store = agl.SqliteStore(tmp_path / "many.db", retry_policy=agl.RetryPolicy(max_attempts=1))
        for i in range(3):
            await store.enqueue_rollout({"i": i})
        await agl.Runner(agent, store=store, n_workers=3, stop_when_idle=True).arun()
        return [r.status for r in await store.query_rollouts()]

    assert asyncio.run(main()) == ["succeeded"] * 3
