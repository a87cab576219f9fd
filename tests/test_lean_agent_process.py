"""An agent's process runs on the lean core: no fastapi, starlette, uvicorn or rich (the ``serve`` extra).

The decoupled architecture's app side, in a child process where those packages cannot be imported (a meta-path
finder put first on ``PYTHONPATH`` refuses them, as if ``pip install agentlightning-core`` had been run without the
extra): ``import agentlightning``, the runner, the HTTP store client, tracing and the LangChain adapter import, and a
real rollout runs with `agl.Runner` against a store served by this (full) environment. The serving commands, run
there, answer with the one install line.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agentlightning import semconv
from agentlightning.store import StoreClient
from agentlightning.testing import StoreServerProcessForTests

SERVE_ONLY = ("fastapi", "starlette", "uvicorn", "rich", "uvloop", "httptools", "watchfiles")

_BLOCKER = f"""
import importlib.abc
import sys

BLOCKED = {SERVE_ONLY!r}


class _NotInstalled(importlib.abc.MetaPathFinder):
    # As if the serve extra were not installed: importing its packages fails the way a missing package does.
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, _NotInstalled())
"""

_AGENT = """
import sys

import agentlightning as agl
import agentlightning.runner
import agentlightning.tracing
from agentlightning.store import StoreClient
from agentlightning_langchain import LightningCallbackHandler
from langchain_core.runnables import RunnableLambda


def agent(task):
    double = RunnableLambda(lambda value: value * 2, name="double")
    result = double.invoke(task["n"], config={"callbacks": [LightningCallbackHandler()]})
    agl.emit_reward(1.0 if result == 2 * task["n"] else 0.0, final=True)


store = StoreClient(sys.argv[1], token=sys.argv[2])
agl.Runner(agent, store, worker_mode="thread", stop_when_idle=True, poll_interval=0.05).run()
serving = sorted({name.split(".")[0] for name in sys.modules} & set(sys.argv[3].split(",")))
assert not serving, f"an agent's process imported the serving side: {serving}"
print("agent process done")
"""


@pytest.fixture
def lean_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a process whose Python cannot import the ``serve`` extra's packages."""
    blocker = tmp_path / "lean"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(textwrap.dedent(_BLOCKER))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(blocker), env.get("PYTHONPATH", "")) if p)
    return env


def test_the_blocker_really_hides_the_serving_packages(lean_env: dict[str, str]) -> None:
    probe = "import importlib\nfor n in ('fastapi', 'starlette', 'uvicorn', 'rich'):\n"
    probe += "    try:\n        importlib.import_module(n)\n    except ImportError:\n        print('missing', n)\n"
    done = subprocess.run([sys.executable, "-c", probe], env=lean_env, capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == [
        word for name in ("fastapi", "starlette", "uvicorn", "rich") for word in ("missing", name)
    ]


@pytest.mark.timeout(300)
def test_an_agent_process_runs_a_rollout_without_the_serve_extra(lean_env: dict[str, str], tmp_path: Path) -> None:
    script = tmp_path / "agent_process.py"
    script.write_text(_AGENT)
    with StoreServerProcessForTests(tmp_path / "store.db") as served:

        async def enqueue() -> str:
            client = StoreClient(served.url, token=served.token)
            try:
                return (await client.enqueue_rollout({"n": 21})).rollout_id
            finally:
                await client.close()

        rollout_id = asyncio.run(enqueue())
        cmd = [sys.executable, str(script), served.url, served.token, ",".join(SERVE_ONLY)]
        done = subprocess.run(cmd, env=lean_env, capture_output=True, text=True, timeout=240, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "agent process done" in done.stdout

        async def stored() -> tuple[str, list[float], list[str]]:
            client = StoreClient(served.url, token=served.token)
            try:
                rollout = await client.get_rollout(rollout_id)
                spans = await client.query_spans(rollout_id)
            finally:
                await client.close()
            rewards = [float(s.attributes[semconv.REWARD_VALUE]) for s in spans if semconv.REWARD_VALUE in s.attributes]
            return rollout.status, rewards, [s.name for s in spans]

        status, rewards, names = asyncio.run(stored())
    assert status == "succeeded"
    assert rewards == [1.0]
    assert len(names) >= 2, names  # the chain's span from the adapter's handler, and the reward


@pytest.mark.parametrize(
    "command",
    [
        ["store", "serve"],
        ["proxy", "serve", "--backend", "http://127.0.0.1:9", "--db", "x.db"],
        ["train", "--agent", "app:agent", "--model", "m", "--tasks", "t.jsonl"],
    ],
    ids=["store-serve", "proxy-serve", "train"],
)
def test_serving_commands_print_the_install_line(lean_env: dict[str, str], command: list[str], tmp_path: Path) -> None:
    launch = "import sys; from agentlightning.cli import main; sys.exit(main())"
    done = subprocess.run(
        [sys.executable, "-c", launch, *command],
        env=lean_env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr  # one line, no traceback
    assert "pip install 'agentlightning-core[serve]'" in lines[0]
    name = "train" if command[0] == "train" else " ".join(command[:2])
    assert lines[0].startswith(f"agl: error: agl {name}: the serving extra is not installed"), lines[0]


def test_version_and_runner_help_work_without_the_serve_extra(lean_env: dict[str, str]) -> None:
    launch = "import sys; from agentlightning.cli import main; sys.exit(main())"
    for args in (["--version"], ["runner", "--help"]):
        done = subprocess.run([sys.executable, "-c", launch, *args], env=lean_env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr
    # the runner's messages come out plain, markup dropped, where rich is not installed
    refused = [*("runner", "--agent", "app:agent", "--db", "x.db", "--workers", "0")]
    done = subprocess.run([sys.executable, "-c", launch, *refused], env=lean_env, capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["--workers must be at least 1, got 0"], done.stderr


def test_serving_modules_fail_with_the_install_line(lean_env: dict[str, str]) -> None:
    for module in ("agentlightning.proxy", "agentlightning.ui", "agentlightning.store._server"):
        probe = f"import {module}"
        done = subprocess.run([sys.executable, "-c", probe], env=lean_env, capture_output=True, text=True)
        assert done.returncode != 0
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith("ImportError: ") and "pip install 'agentlightning-core[serve]'" in last, last
    # a program that serves a store as a child process learns it before starting one
    probe = "import agentlightning as agl\nagl.StoreServerProcess('s.db', '127.0.0.1', 0).start()"
    done = subprocess.run([sys.executable, "-c", probe], env=lean_env, capture_output=True, text=True)
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: StoreServerProcess (agl store serve): the serving extra"), last
