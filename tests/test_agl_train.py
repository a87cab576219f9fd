"""``agl train``: the calculator agent trained end to end by the CLI, and every kind of bad input refused cleanly."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("agentlightning_torch")
pytest.importorskip("langgraph")

ROOT = Path(__file__).resolve().parent.parent
CALC = ROOT / "examples" / "calc"
CHECKPOINT = CALC / "checkpoint"
TASKS = CALC / "data" / "train.jsonl"
SMALL = ["--tasks-per-iteration", "4", "--samples-per-task", "4", "--workers", "8", "--max-tokens", "24", "--quiet"]


def agl_train(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "agentlightning.cli", "train", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.mark.timeout(900)  # runner processes import LangGraph, the trainer torch: minutes on a loaded 2-core machine
def test_agl_train_trains_the_calculator_agent_for_two_iterations(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    out = tmp_path / "run"
    done = agl_train(
        "--agent", "calc_agent:calc_agent", "--app-dir", str(CALC), "--model", str(CHECKPOINT), "--tasks", str(TASKS),
        "--iterations", "2", "--runners", "2", "--lr", "3e-4", "--tool-parser", "calc", "--output", str(out), *SMALL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert "dashboard: http://127.0.0.1:" in done.stderr and "/ui#token=" in done.stderr
    reports = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [report["iteration"] for report in reports] == [1, 2]
    # Sampling is not reproducible across runner processes (what a decode batch holds depends on arrival order), so
    # an iteration whose groups all got equal rewards (no signal) may skip its update: the version counts updates.
    updates = sum(1 for report in reports if not report["metrics"].get("skipped_update"))
    assert summary["iterations"] == 2 and summary["model_version"] == updates
    assert (out / "reward_curve.png").stat().st_size > 0
    trained = AutoModelForCausalLM.from_pretrained(out / "checkpoint")  # a plain transformers folder
    original = AutoModelForCausalLM.from_pretrained(CHECKPOINT)
    deltas = [(a - b).abs().max().item() for a, b in zip(trained.parameters(), original.parameters(), strict=True)]
    assert (max(deltas) > 0) == (updates > 0)


def test_agl_train_finds_the_torch_engine_through_its_entry_point() -> None:
    """The core names no trainer package: agentlightning-torch registers its plug-in in the engines group."""
    from importlib.metadata import entry_points

    from agentlightning.loop import ENGINE_ENTRY_POINTS
    from agentlightning_torch import cli

    (torch_engine,) = [ep for ep in entry_points(group=ENGINE_ENTRY_POINTS) if ep.name == "torch"]
    assert torch_engine.value == "agentlightning_torch.cli:TorchEnginePlugin"
    assert torch_engine.load() is cli.TorchEnginePlugin


def _answer(url: str, token: str | None = None) -> int:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as error:
        return error.code


def test_the_dashboard_store_needs_the_token_its_address_carries(tmp_path: Path) -> None:
    """A web page in the user's browser could write to a tokenless store on loopback: agl train's has a token."""
    import urllib.error

    from agentlightning.testing import free_port
    from agentlightning_torch import cli

    port = free_port()
    process, url = cli.start_dashboard(tmp_path / "store.db", port)
    try:
        base, _, token = url.partition("/ui#token=")
        assert base == f"http://127.0.0.1:{port}" and len(token) >= 32
        while True:  # until it listens (or exits: then the assertion says so)
            assert process.poll() is None, f"the dashboard's store server exited with {process.returncode}"
            try:
                assert _answer(base + "/healthz") == 200
                break
            except urllib.error.URLError:
                time.sleep(0.05)
        assert token.encode() not in Path(f"/proc/{process.pid}/cmdline").read_bytes()  # `ps` does not show it
        assert _answer(base + "/v1/stats") == 401
        assert _answer(base + "/v1/stats", token) == 200
    finally:
        cli.stop_children([process])


def _refused(done: subprocess.CompletedProcess[str], message: str, out: Path, *, ran: bool = False) -> None:
    """Exit code 2 with ``message`` and no traceback; a run that ``ran`` keeps its store and says where, a refusal
    before anything started leaves nothing half-written."""
    assert done.returncode == 2, done.stderr[-3000:]
    assert message in done.stderr, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    if ran:
        store = out / "store.db"
        assert store.is_file() and f"the run's store is kept: {store}" in " ".join(done.stderr.split())
    else:
        assert not out.exists()


def _calc_here(capsys: pytest.CaptureFixture[str], out: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """`agl train` in this process on the calculator agent, its model and tasks, with ``options``."""
    return agl_train_here(
        capsys,
        "--agent", "calc_agent:calc_agent", "--app-dir", str(CALC), "--model", str(CHECKPOINT), "--tasks", str(TASKS),
        "--output", str(out), *options,
    )  # fmt: skip


def agl_train_here(capsys: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess[str]:
    """`agl train` in this process (the same entry point, without paying a fresh interpreter per bad input)."""
    from agentlightning.cli import main

    code = main(["train", *args])
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(["agl", "train", *args], code, captured.out, captured.err)


@pytest.mark.parametrize(
    ("agent", "message"),
    [
        ("no_such_module:solve", "cannot import module 'no_such_module'"),
        ("calc_agent:no_such_function", "has no function 'no_such_function'"),
        ("agent", "must look like module:function"),
    ],
)
def test_agent_that_cannot_be_found_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], agent: str, message: str
) -> None:
    out = tmp_path / "run"
    done = agl_train_here(
        capsys,
        "--agent", agent, "--app-dir", str(CALC), "--model", str(CHECKPOINT), "--tasks", str(TASKS),
        "--output", str(out),
    )  # fmt: skip
    _refused(done, message, out)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--agent-command", "no-such-program-xyz agent.mjs"], "--agent-command: the agent command's program"),
        (["--agent-command", "node agent.mjs", "--agent", "calc_agent:calc_agent"], "not allowed with argument"),
        (["--agent-command", "  "], "--agent-command: the agent command is empty"),
    ],
)
def test_agent_command_that_cannot_run_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    out = tmp_path / "run"
    try:
        done = agl_train_here(
            capsys, *flags, "--app-dir", str(CALC), "--model", str(CHECKPOINT), "--tasks", str(TASKS),
            "--output", str(out),
        )  # fmt: skip
    except SystemExit as exit:  # argparse refuses --agent with --agent-command
        assert exit.code == 2 and message in capsys.readouterr().err
        return
    _refused(done, message, out)


def test_missing_model_folder_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    done = agl_train_here(
        capsys,
        "--agent", "calc_agent:calc_agent", "--app-dir", str(CALC), "--model", str(tmp_path / "no-model"),
        "--tasks", str(TASKS), "--output", str(out),
    )  # fmt: skip
    _refused(done, "does not exist", out)


def test_task_file_that_does_not_parse_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "tasks.jsonl"
    bad.write_text('{"question": "Q:2*3+4=", "answer": 10}\n{"question": oops}\n')
    out = tmp_path / "run"
    done = agl_train_here(
        capsys,
        "--agent", "calc_agent:calc_agent", "--app-dir", str(CALC), "--model", str(CHECKPOINT), "--tasks", str(bad),
        "--output", str(out),
    )  # fmt: skip
    _refused(done, f"{bad}:2: not valid JSON", out)
    bad.write_text("[1, 2]\n")
    _refused(agl_train_here(capsys, "--agent", "calc_agent:calc_agent", "--app-dir", str(CALC),
                            "--model", str(CHECKPOINT), "--tasks", str(bad), "--output", str(out)),
             "must be a JSON object", out)  # fmt: skip


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--serve-store", "0.0.0.0:4799"], "token"),  # a store served off loopback needs a token
        (["--serve-store", "0.0.0.0:4799", "--store-token", "short"], "16"),
        (["--serve-store", "nowhere"], "HOST:PORT"),
        (["--store-url", "trainer:4747"], "http://"),
        (["--proxy-host", "0.0.0.0", "--advertise-url", "http://10.1.2.3:4748"], "token"),  # proxy off loopback
        (["--runners", "-1"], "--runners must be 0 or more"),
    ],
)
def test_network_options_are_checked_before_anything_starts(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    options: list[str],
    message: str,
) -> None:
    monkeypatch.delenv("AGL_STORE_TOKEN", raising=False)
    monkeypatch.delenv("AGL_PROXY_TOKEN", raising=False)
    out = tmp_path / "run"
    done = _calc_here(capsys, out, *options)
    _refused(done, message, out)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--policy", "writer"], "AGENT=POLICY"),
        (["--policy", "a=x", "--policy", "a=y"], "mapped twice"),
        (["--policy", "a=../up"], "policy name"),
        (["--policy", "calc=frozen"], "nothing would train"),
        (["--default-policy", "writer"], "needs --policy"),
        (["--policies", "/nonexistent/policies.json"], "--policies"),
        (["--policy-settings", "calc:lr=1e-3"], "--policy-settings needs several policies"),
        (["--policy", "calc=solver", "--policy-settings", "solvr:lr=1e-3"], "not trained: ['solvr']"),
        (["--policy", "calc=solver", "--policy-settings", "solver:rank=0"], "policy 'solver': r: Input should be"),
    ],
)
def test_bad_policy_maps_are_refused_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], options: list[str], message: str
) -> None:
    out = tmp_path / "run"
    done = _calc_here(capsys, out, *options)
    _refused(done, message, out)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--log-level", "debug", "--samples-per-task", "1"], "--samples-per-task=1 with estimator='grpo'"),
        (["--log-level", "WARN", "--tasks-per-iteration", "0"], "--tasks-per-iteration: Input should be greater"),
        (["--max-tokens", "128"], "--max-tokens 128 leaves no room for a prompt in the model's context of 128"),
        (["--max-tokens", "0"], "--max-tokens must be at least 1"),
        (["--vllm-url", "http://127.0.0.1:9/v1"], "--vllm-url needs --backend vllm"),
    ],
)
def test_a_bad_setting_is_refused_by_its_option_whatever_the_log_level(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], options: list[str], message: str
) -> None:
    """The loop's own checks name the option too (not "cannot load model '...': 1 validation error for LoopConfig"),
    and ``--log-level`` takes the usual spellings in any case."""
    out = tmp_path / "run"
    done = _calc_here(capsys, out, *options)
    _refused(done, message, out)
    assert "cannot load model" not in done.stderr and "LoopConfig" not in done.stderr


def test_the_default_token_budget_fits_the_models_context_and_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    from agentlightning_torch.cli import DEFAULT_MAX_TOKENS, token_budget

    with caplog.at_level("WARNING", logger="agentlightning_torch.cli"):
        assert token_budget(None, 32768) == token_budget(None, None) == DEFAULT_MAX_TOKENS == 256
        assert caplog.records == []  # a model with room for the default: nothing to say
        assert token_budget(None, 128) == 32  # the quickstart's model: a quarter of its context
        assert token_budget(24, 128) == 24  # what the user asked for, when it fits
    [said] = caplog.records
    assert "32 tokens per LLM call" in said.getMessage() and "context of 128 tokens" in said.getMessage()


@pytest.mark.timeout(900)
def test_rollout_that_never_calls_the_llm_is_refused(tmp_path: Path) -> None:
    (tmp_path / "lazy_agent.py").write_text(
        "import agentlightning as agl\n\n\n@agl.rollout\nasync def solve(task, resources):\n    return 1.0\n"
    )
    out = tmp_path / "run"
    done = agl_train(
        "--agent", "lazy_agent:solve", "--app-dir", str(tmp_path), "--model", str(CHECKPOINT), "--tasks", str(TASKS),
        "--iterations", "3", "--output", str(out), *SMALL,
    )  # fmt: skip
    _refused(done, "without calling the LLM", out, ran=True)


def test_a_failed_run_keeps_its_store_and_says_where(tmp_path: Path) -> None:
    """Every rollout fails: exit 2, and the store with the rollouts and their errors stays for a look."""
    (tmp_path / "broken_agent.py").write_text(
        "import agentlightning as agl\n\n\n@agl.rollout\nasync def solve(task, resources):\n"
        "    raise ValueError('the tool server is down')\n"
    )
    out = tmp_path / "run"
    done = agl_train(
        "--agent", "broken_agent:solve", "--app-dir", str(tmp_path), "--model", str(CHECKPOINT), "--tasks",
        str(TASKS), "--iterations", "3", "--output", str(out), *SMALL,
    )  # fmt: skip
    _refused(done, "rollouts succeeded", out, ran=True)
    statuses = asyncio.run(_rollout_statuses(out / "store.db"))
    assert "failed" in statuses and "succeeded" not in statuses, statuses


async def _rollout_statuses(path: Path) -> list[str]:
    from agentlightning import SqliteStore

    store = SqliteStore(path)
    try:
        return [r.status for r in await store.query_rollouts()]
    finally:
        await store.close()


LITERAL_KEY_AGENT = '''"""A LangGraph tool agent as LangChain's docs write one: ChatOpenAI with a literal key."""

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

import agentlightning as agl


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    return str(eval(expression, {"__builtins__": {}}))


def route(state: MessagesState) -> str:
    """The tool while the model asks for it, at most two model calls."""
    return END if sum(m.type == "ai" for m in state["messages"]) >= 2 else tools_condition(state)


@agl.rollout
async def solve(task, resources):
    llm = ChatOpenAI(model=resources.llm.model, base_url=agl.llm_base_url(), api_key="none", max_retries=0)

    async def assistant(state: MessagesState):
        return {"messages": [await llm.bind_tools([calculator]).ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("assistant", assistant)
    graph.add_node("tools", ToolNode([calculator]))
    graph.add_edge(START, "assistant")
    graph.add_conditional_edges("assistant", route, {"tools": "tools", END: END})
    graph.add_edge("tools", "assistant")
    result = await graph.compile().ainvoke({"messages": [("user", task["question"])]})
    return 1.0 if str(task["answer"]) in str(result["messages"][-1].content) else 0.0
'''


@pytest.mark.timeout(900)
def test_agl_train_trains_an_agent_that_hard_codes_its_key_with_default_options(tmp_path: Path) -> None:
    """The agent passes ``api_key="none"`` (the slot's URL is its credential) and no ``--max-tokens`` is given: the
    default fits the model's 128-token context and says so once."""
    (tmp_path / "literal_key_agent.py").write_text(LITERAL_KEY_AGENT)
    out = tmp_path / "run"
    done = agl_train(
        "--agent", "literal_key_agent:solve", "--app-dir", str(tmp_path), "--model", str(CHECKPOINT),
        "--tasks", str(TASKS), "--tool-parser", "calc", "--iterations", "1", "--output", str(out),
        "--tasks-per-iteration", "4", "--samples-per-task", "4", "--workers", "8", "--quiet",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "the agent raised" not in done.stderr and "Error code: 401" not in done.stderr, done.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    [report] = [row for row in rows if row["kind"] == "train"]
    assert report["finished"] == 16 and report["calls_per_rollout"] >= 1
    budget = [line for line in done.stderr.splitlines() if "--max-tokens not given" in line]
    assert len(budget) == 1 and "32 tokens per LLM call" in budget[0] and "context of 128 tokens" in budget[0]


@pytest.mark.timeout(900)
def test_a_call_the_backend_refuses_is_named_in_the_runners_log_and_the_final_error(tmp_path: Path) -> None:
    """--max-tokens 120 leaves 8 tokens for the prompt: the backend refuses every call (400); what it said reaches
    the user, not LangGraph's note on the exception alone."""
    out = tmp_path / "run"
    done = agl_train(
        "--agent", "calc_agent:calc_agent", "--app-dir", str(CALC), "--model", str(CHECKPOINT), "--tasks", str(TASKS),
        "--tool-parser", "calc", "--iterations", "1", "--output", str(out), *SMALL[:-3], "--max-tokens", "120",
        "--quiet",
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    context = "exceeds the model's context of 128 tokens"
    raised = [line for line in done.stderr.splitlines() if "the agent raised in rollout" in line]
    assert raised and all("Error code: 400" in line and context in line for line in raised), done.stderr[-3000:]
    assert "During task with name 'solver'" in raised[0]  # LangGraph's note, after the error
    [final] = [line for line in done.stderr.splitlines() if "none of the 16 rollouts succeeded" in line]
    assert final.startswith("error:") and "max_tokens=120" in final and context in final


def _descendants(pid: int) -> list[int]:
    import psutil

    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _why_running(pid: int) -> str:
    """What a process that did not stop shows: its signal masks (a blocked or ignored signal never arrives) and,
    where py-spy is installed, every thread's stack."""
    import shutil

    lines = [line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("Sig")]
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if spy is not None:
        dump = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
        lines.append(dump.stdout + dump.stderr)
    return "\n".join(lines)


CALC_AGENT = ("--agent", "calc_agent:calc_agent", "--app-dir", str(CALC))
NODE_AGENT = ("--agent-command", "node agent.mjs", "--app-dir", str(ROOT / "examples" / "node"))
"""The JavaScript calculator agent of examples/node (``npm ci`` there first: `tests/test_example_node.py`)."""


def _start_training(
    out: Path, log: Path, sigint: signal.Handlers = signal.SIG_DFL, agent: tuple[str, ...] = CALC_AGENT
) -> tuple[subprocess.Popen[str], list[int]]:
    """A long `agl train` run, once both runners have said they run and rollouts are claimed; with its children.

    Its stderr goes to the file ``log``, not a pipe: the runners inherit it, and a pipe would stay open while any of
    them lives. ``sigint`` is the SIGINT disposition it starts with, set here rather than inherited from however
    pytest itself was started: ``SIG_DFL`` as from a terminal, ``SIG_IGN`` as a script's background job gets it.
    """
    cmd = [
        sys.executable, "-m", "agentlightning.cli", "train", *agent,
        "--model", str(CHECKPOINT), "--tasks", str(TASKS),
        "--iterations", "1000", "--runners", "2", "--tool-parser", "calc", "--output", str(out), *SMALL,
    ]  # fmt: skip

    def inherit() -> None:
        signal.signal(signal.SIGINT, sigint)

    with log.open("w") as stderr:
        agl = subprocess.Popen(  # preexec_fn: the one way to set a disposition the child inherits
            cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr, text=True, preexec_fn=inherit
        )

    def started() -> bool:  # both runners printed their line, and rollouts are being run
        runners = [line for line in log.read_text().splitlines() if line.startswith("runner: ")]
        return len(runners) == 2 and _attempts(out / "store.db") > 0

    def commands_in(pids: list[int]) -> bool:
        return agent[0] != "--agent-command" or any(_name(pid) == agent[1].split()[0] for pid in pids)

    deadline = time.monotonic() + 600
    try:
        # two runners and the dashboard store server, each with whatever it started
        # (a command agent's: at least one of its commands running, to be ended with the rest)
        while len(children := _descendants(agl.pid)) < 3 or not started() or not commands_in(children):
            assert agl.poll() is None, f"agl train exited with code {agl.returncode}"
            assert time.monotonic() < deadline, "agl train never started its runner processes"
            time.sleep(0.2)
    except BaseException:
        agl.kill()
        agl.wait()
        raise
    return agl, children


def _name(pid: int) -> str:
    import psutil

    try:
        return psutil.Process(pid).name()
    except psutil.NoSuchProcess:
        return ""


def _attempts(db: Path) -> int:
    import sqlite3

    if not db.exists():
        return 0
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)) as conn:
            return int(conn.execute("SELECT count(*) FROM attempts").fetchone()[0])
    except sqlite3.OperationalError:  # the schema is not there yet
        return 0


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("sig", "code", "word", "sigint"),
    [
        (signal.SIGINT, 130, "interrupted", signal.SIG_DFL),
        # A script's background job (`agl train ... &` without job control, `nohup agl train &`) starts with SIGINT
        # ignored, and Python leaves it so: agl train used to ignore the SIGINT and train on (its stack showed the
        # loop idle, SIGINT in /proc's SigIgn), as did this test whenever pytest itself was started that way.
        (signal.SIGINT, 130, "interrupted", signal.SIG_IGN),
        (signal.SIGTERM, 143, "terminated", signal.SIG_DFL),
    ],
    ids=["ctrl-c", "ctrl-c-started-with-sigint-ignored", "sigterm"],
)
def test_interrupted_agl_train_stops_its_runner_processes(
    tmp_path: Path, sig: signal.Signals, code: int, word: str, sigint: signal.Handlers
) -> None:
    log = tmp_path / "stderr.txt"
    agl, children = _start_training(tmp_path / "run", log, sigint)
    try:
        before = log.stat().st_size  # what it printed while it ran
        agl.send_signal(sig)  # what a Ctrl-C at the terminal (SIGINT to agl train) or a `kill` does
        try:
            agl.wait(timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail(f"agl train still ran 120 s after {sig.name}:\n{_why_running(agl.pid)}")
    finally:
        if agl.poll() is None:
            agl.kill()
            agl.wait()
    printed = log.read_bytes()
    assert agl.returncode == code, printed[-3000:]
    left = [pid for pid in children if _alive(pid)]
    assert left == [], f"processes left running after agl train exited: {left}"
    # a clean stop says one line (no traceback, no runner's complaint about the store or the proxy going away)
    assert printed[before:].decode().split() == [word], printed.decode()[-3000:]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("agent", [CALC_AGENT, NODE_AGENT], ids=["python-agent", "node-command-agent"])
def test_killed_agl_train_leaves_no_process_behind(tmp_path: Path, agent: tuple[str, ...]) -> None:
    if agent is NODE_AGENT and not (ROOT / "examples" / "node" / "node_modules" / "openai").is_dir():
        npm_ci = ["npm", "ci", "--no-audit", "--no-fund"]
        subprocess.run(npm_ci, cwd=ROOT / "examples" / "node", check=True, timeout=600)
    out = tmp_path / "run"
    agl, children = _start_training(out, tmp_path / "stderr.txt", agent=agent)
    agl.kill()  # kill -9: agl train cleans up nothing itself
    agl.wait()
    try:
        deadline = time.monotonic() + 300  # bounds a hang only: the loop ends when the children are gone
        while left := [pid for pid in children if _alive(pid)]:
            assert time.monotonic() < deadline, f"processes left running after agl train was killed: {left}"
            time.sleep(0.2)
    finally:
        for pid in children:  # only when the test failed: do not leave them claiming rollouts
            with contextlib.suppress(ProcessLookupError):
                if _alive(pid):
                    os.kill(pid, signal.SIGKILL)
    assert _holders(out / "store.db") == []


def _holders(path: Path) -> list[int]:
    """Processes with ``path`` (or its WAL files) open."""
    import psutil

    holders: list[int] = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if any(f.path.startswith(str(path)) for f in process.open_files()):
                holders.append(process.pid)
    return holders


@pytest.mark.parametrize("inside", [False, True], ids=["folder", "new-folder-inside"])
def test_output_that_cannot_be_written_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], inside: bool
) -> None:
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    read_only.chmod(0o555)
    if os.access(read_only, os.W_OK):  # root writes through permission bits; sysfs takes no new file even from root
        read_only = Path("/sys/kernel")
        if not read_only.is_dir():
            pytest.skip("running as root without /sys: no folder this process cannot write")
    out = read_only / "run" if inside else read_only
    done = agl_train_here(
        capsys,
        "--agent", "calc_agent:calc_agent", "--app-dir", str(CALC), "--model", str(CHECKPOINT), "--tasks", str(TASKS),
        "--output", str(out),
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    assert "cannot write to --output" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert inside is False or not out.exists()


def test_vllm_backend_without_vllm_is_refused_with_how_to_install_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGL_VLLM_VENV", str(tmp_path / "no-venv"))
    out = tmp_path / "run"
    done = agl_train_here(
        capsys,
        "--agent", "calc_agent:calc_agent", "--app-dir", str(CALC), "--model", str(CHECKPOINT), "--tasks", str(TASKS),
        "--backend", "vllm", "--output", str(out),
    )  # fmt: skip
    _refused(done, "--backend vllm: vLLM is not installed in", out)
    assert "scripts/dev.py vllm" in done.stderr
