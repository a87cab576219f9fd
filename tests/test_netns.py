"""Runners on another machine, for real: two network namespaces joined by a veth pair.

The trainer (``examples/calc/train.py --serve-store ... --proxy-host ... --runners 0``) runs in one namespace and
reaches nothing but its own address; the runners (``agl runner`` with the calculator agent) run in the
other and reach the trainer only through the veth link. In the runners' namespace a trap listens on loopback at the
trainer's store and proxy ports: any request a runner sent to a loopback address would land there.

The namespace tests need root and iproute2 (``ip netns``), as CI has; they are skipped elsewhere with the reason.
The recipe's commands are taken from the docs page itself (docs/several-machines.md), and checked against the real
parsers everywhere.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agentlightning_torch")
pytest.importorskip("langgraph")

import agentlightning as agl
from agentlightning.adapters import get_adapter
from agentlightning.cli import build_parser
from agentlightning.store import RELEASED
from agentlightning.testing import NetnsPair, netns_pair, why_no_netns

ROOT = Path(__file__).resolve().parent.parent
CALC = ROOT / "examples" / "calc"
STORE_PORT, PROXY_PORT = 4747, 4748
README_HOST = "10.0.0.5"  # the trainer's address in the README's recipe


def readme_recipe() -> tuple[list[str], list[str], list[str]]:
    """The docs' "Runners on other machines" recipe: its export lines, trainer command and worker command."""
    text = (ROOT / "docs" / "several-machines.md").read_text(encoding="utf-8")
    section = text.split("## Runners on other machines", 1)[1].split("\n## ", 1)[0]
    lines = [line for block in re.findall(r"```bash\n(.*?)```", section, re.S) for line in block.splitlines()]
    exports = [line for line in lines if line.startswith("export ")]
    train = next(shlex.split(line) for line in lines if "examples/calc/train.py" in line)
    runner = next(shlex.split(line) for line in lines if line.split()[:2][-1:] == ["runner"])
    return exports, train, runner


def _token(export_line: str) -> str:
    """Run one README ``export NAME=$(...)`` line the way bash would and return the value."""
    name = export_line.split()[1].split("=", 1)[0]
    done = subprocess.run(["bash", "-c", f'{export_line}; printf %s "${name}"'], capture_output=True, text=True)
    assert done.returncode == 0 and len(done.stdout) >= 16, done.stderr
    return done.stdout


EXPORTS, TRAIN_CMD, RUNNER_CMD = readme_recipe()
STORE_TOKEN = _token(next(line for line in EXPORTS if "AGL_STORE_TOKEN=$(" in line))
PROXY_TOKEN = _token(next(line for line in EXPORTS if "AGL_PROXY_TOKEN=$(" in line))


def _as_run_here(cmd: list[str], host: str) -> list[str]:
    """A README command with this interpreter and the namespace's address (run from the repository root)."""
    cmd = [arg.replace(README_HOST, host) for arg in cmd]
    if cmd[0].endswith("agl"):
        return [sys.executable, "-m", "agentlightning.cli", *cmd[1:]]
    assert cmd[0] in ("python", "python3"), cmd
    return [sys.executable, *cmd[1:]]


_REASON = why_no_netns()
needs_netns = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")

TRAP = """
import socket, sys, threading
out = open(sys.argv[1], "a", buffering=1)
def serve(port):
    sock = socket.socket(); sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port)); sock.listen(64)
    while True:
        conn, peer = sock.accept(); out.write(f"{port} {peer}\\n"); conn.close()
for port in map(int, sys.argv[2:]):
    threading.Thread(target=serve, args=(port,), daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"""


@pytest.fixture
def netns() -> Iterator[NetnsPair]:
    with netns_pair() as pair:
        yield pair


def _start_trap(netns: NetnsPair, tmp_path: Path) -> Path:
    """Listen on loopback in the runners' namespace at the trainer's ports; returns the file of connections."""
    hits = tmp_path / "loopback_hits.txt"
    hits.touch()
    cmd = [
        "ip",
        "netns",
        "exec",
        netns.workers,
        sys.executable,
        "-c",
        TRAP,
        str(hits),
        str(STORE_PORT),
        str(PROXY_PORT),
    ]
    trap = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    netns.procs.append(trap)  # type: ignore[arg-type]
    assert trap.stdout is not None and trap.stdout.readline().strip() == "ready"
    return hits


def _start_trainer(netns: NetnsPair, out: Path, heartbeat_timeout: float) -> subprocess.Popen[str]:
    """The README's trainer command, quickstart-size, with its store's access log."""
    cmd = [*_as_run_here(TRAIN_CMD, netns.trainer_ip), "--quiet", "--output", str(out), "--minutes", "10"]
    cmd += ["--iterations", "2", "--tasks-per-iteration", "2", "--samples-per-task", "2", "--eval-size", "2"]
    cmd += ["--access-log", "--heartbeat-timeout", str(heartbeat_timeout), "--rollout-timeout", "600"]
    assert f"{netns.trainer_ip}:{STORE_PORT}" in cmd and str(PROXY_PORT) in cmd  # the README's ports
    env = {"AGL_STORE_TOKEN": STORE_TOKEN, "AGL_PROXY_TOKEN": PROXY_TOKEN, "OMP_NUM_THREADS": "1"}
    return netns.popen(netns.trainer, cmd, env, out.parent / "trainer.log", cwd=ROOT)


def _start_runner(netns: NetnsPair, log: Path, *extra: str) -> subprocess.Popen[str]:
    """The README's worker command (later options override the README's)."""
    cmd = [*_as_run_here(RUNNER_CMD, netns.trainer_ip), "--heartbeat-interval", "0.5", "--log-level", "info", *extra]
    env = {"AGL_STORE_TOKEN": STORE_TOKEN, "OMP_NUM_THREADS": "1"}
    return netns.popen(netns.workers, cmd, env, log, cwd=ROOT)


def _finish(trainer: subprocess.Popen[str], out: Path) -> dict[str, Any]:
    code = trainer.wait(600)
    log = (out.parent / "trainer.log").read_text()
    assert code == 0, log[-4000:]
    return json.loads(log.strip().splitlines()[-1])


def _query(db: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30) as conn:
        return conn.execute(sql, params).fetchall()


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _check_every_call_has_exact_ids(db: Path) -> int:
    """Every succeeded rollout's LLM calls carry the ids whose text is exactly what the agent received."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(CALC / "checkpoint")

    async def check() -> int:
        store = agl.SqliteStore(db)
        calls = 0
        try:
            for rollout in await store.query_rollouts(status=["succeeded"]):
                for call in await store.query_llm_calls(rollout.rollout_id):
                    calls += 1
                    assert call.error is None and call.prompt_token_ids and call.response_token_ids
                    assert call.response_logprobs is not None
                    assert len(call.response_logprobs) == len(call.response_token_ids)
                    prompt = tokenizer.decode(call.prompt_token_ids, skip_special_tokens=True)
                    assert rollout.input["question"] in prompt
                    assert call.response is not None
                    message = call.response["choices"][0]["message"]
                    if message.get("tool_calls"):
                        expression = json.loads(message["tool_calls"][0]["function"]["arguments"])["expression"]
                        received = f"CALC({expression})"
                    else:
                        received = message["content"]
                    assert tokenizer.decode(call.response_token_ids, skip_special_tokens=True) == received
        finally:
            await store.close()
        return calls

    return asyncio.run(check())


@needs_netns
@pytest.mark.timeout(900)
def test_two_iterations_with_runners_in_another_namespace(netns: NetnsPair, tmp_path: Path) -> None:
    hits = _start_trap(netns, tmp_path)
    out = tmp_path / "run"
    trainer = _start_trainer(netns, out, heartbeat_timeout=30)
    runners = [_start_runner(netns, tmp_path / f"runner{i}.log", "--workers", "4") for i in range(2)]
    summary = _finish(trainer, out)
    assert summary["iterations"] == 2

    db = out / "store.db"
    train_rollouts = _query(db, "SELECT status FROM rollouts WHERE rollout_id LIKE 'it%'")
    assert [s for (s,) in train_rollouts] == ["succeeded"] * 8
    # Both runner processes are still serving; which of them took how many rollouts is up to the scheduler (one
    # that started first may take them all), so that is not asserted.
    for i, runner in enumerate(runners):
        assert runner.poll() is None and "Traceback" not in (tmp_path / f"runner{i}.log").read_text()
    assert _check_every_call_has_exact_ids(db) >= 8 + 4
    # Every store request from the runners came over the veth link, from their namespace's address ...
    served = [line for line in (out / "store_server.log").read_text().splitlines() if '"POST /v1/' in line]
    assert served and all(f"{netns.worker_ip}:" in line for line in served), served[:5]
    # ... and nothing a runner sent went to a loopback address (the trap at the trainer's ports saw nothing).
    assert hits.read_text() == ""


STALL_AGENT = """
import asyncio, sys
sys.path.insert(0, {calc!r})
from calc_agent import calc_agent
import agentlightning as agl

@agl.rollout
async def stall_training(task, resources):
    # evaluation rollouts run normally; training rollouts hang until the runner is killed or drained
    if agl.current_rollout().rollout_id.startswith("it"):
        await asyncio.Event().wait()
    return await calc_agent(task, resources)
"""


@needs_netns
@pytest.mark.timeout(900)
def test_killed_and_terminated_runners_lose_no_rollout(netns: NetnsPair, tmp_path: Path) -> None:
    (tmp_path / "stall_agents.py").write_text(STALL_AGENT.format(calc=str(CALC)))
    hits = _start_trap(netns, tmp_path)
    out = tmp_path / "run"
    db = out / "store.db"
    trainer = _start_trainer(netns, out, heartbeat_timeout=3)
    stalling = ["--app-dir", str(tmp_path), "--agent", "stall_agents:stall_training", "--workers", "2"]

    def claims_of(proc: subprocess.Popen[str]) -> list[tuple[str, str, str | None]]:
        try:
            return _query(
                db,
                "SELECT rollout_id, status, error FROM attempts WHERE worker_id LIKE ? AND rollout_id LIKE 'it%'",
                f"%:{proc.pid}:%",
            )
        except sqlite3.OperationalError:  # the trainer has not created the file or its tables yet
            return []

    # SIGKILL: the runner dies holding training rollouts; the store retries them after the heartbeat timeout
    killed = _start_runner(netns, tmp_path / "killed.log", *stalling)
    _wait_for(lambda: bool(claims_of(killed)), "the first training claim of the runner to kill")
    killed.send_signal(signal.SIGKILL)
    # SIGTERM: the runner releases what it holds at once and exits
    drained = _start_runner(netns, tmp_path / "drained.log", *stalling)
    _wait_for(lambda: bool(claims_of(drained)), "the first training claim of the runner to terminate")
    drained.send_signal(signal.SIGTERM)
    assert drained.wait(60) == 0
    released = claims_of(drained)
    assert released and all(status == "cancelled" and error == RELEASED for _, status, error in released)
    # the survivor finishes everything, the killed runner's rollouts included
    _start_runner(netns, tmp_path / "survivor.log", "--workers", "4")
    summary = _finish(trainer, out)
    assert summary["iterations"] == 2
    for rollout_id, _, _ in claims_of(killed) + released:
        assert _query(db, "SELECT status FROM rollouts WHERE rollout_id = ?", rollout_id) == [("succeeded",)]
    killed_statuses = {status for _, status, _ in claims_of(killed)}
    assert killed_statuses == {"unresponsive"}, killed_statuses
    assert [s for (s,) in _query(db, "SELECT status FROM rollouts WHERE rollout_id LIKE 'it%'")] == ["succeeded"] * 8
    assert _check_every_call_has_exact_ids(db) >= 8
    assert hits.read_text() == ""


# ----- the README's commands agree with the code (no root needed) ---------------------------------------------


def test_the_recipe_makes_long_enough_tokens() -> None:
    exports, _, _ = readme_recipe()
    generated = [line for line in exports if "$(" in line]
    assert {line.split("=", 1)[0] for line in generated} == {"export AGL_STORE_TOKEN", "export AGL_PROXY_TOKEN"}
    for line in generated:
        name = line.split()[1].split("=", 1)[0]
        done = subprocess.run(["bash", "-c", f'{line}; printf %s "${name}"'], capture_output=True, text=True)
        assert done.returncode == 0 and len(done.stdout) >= 16, done.stderr


def test_the_trainer_command_is_a_valid_configuration(monkeypatch: pytest.MonkeyPatch, example_script: Any) -> None:
    _, train_cmd, _ = readme_recipe()
    assert train_cmd[:2] == ["python", "examples/calc/train.py"] and (ROOT / train_cmd[1]).is_file()
    monkeypatch.setenv("AGL_STORE_TOKEN", "s" * 32)
    monkeypatch.setenv("AGL_PROXY_TOKEN", "p" * 32)
    train = example_script("calc", "train")
    args = train.parse_args(train_cmd[2:])  # type: ignore[attr-defined]
    config = train.build_config(args)  # type: ignore[attr-defined]
    assert args.runners == 0
    from agentlightning_torch.runkit import UsageError, store_serving  # the script's scaffolding

    assert store_serving(args).bind == (README_HOST, 4747)
    proxy = config.proxy
    assert (proxy.host, proxy.port, proxy.token, proxy.advertised_url) == (README_HOST, 4748, "p" * 32, None)
    monkeypatch.delenv("AGL_PROXY_TOKEN")
    with pytest.raises(UsageError, match="without a token"):
        train.build_config(train.parse_args(train_cmd[2:]))  # type: ignore[attr-defined]


def test_the_worker_command_parses_and_names_an_importable_agent() -> None:
    _, _, runner_cmd = readme_recipe()
    assert Path(runner_cmd[0]).name == "agl"
    args = build_parser().parse_args(runner_cmd[1:])
    assert args.command == "runner" and args.store_url == f"http://{README_HOST}:4747"
    agent = agl.load_agent(args.agent, str(ROOT / args.app_dir))
    assert agent.name == "calc_agent"  # pyright: ignore[reportAttributeAccessIssue]
    for name in args.instrument.split(","):
        get_adapter(name)  # an installed adapter
