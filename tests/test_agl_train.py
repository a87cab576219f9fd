"""``agl train``: the calculator agent trained end to end by the CLI, and every kind of bad input refused cleanly."""

from __future__ import annotations

import json
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
    assert summary["iterations"] == 2 and summary["model_version"] == 2
    assert "dashboard: http://127.0.0.1:" in done.stderr
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["iteration"] for line in lines] == [1, 2]
    assert (out / "reward_curve.png").stat().st_size > 0
    trained = AutoModelForCausalLM.from_pretrained(out / "checkpoint")  # a plain transformers folder
    original = AutoModelForCausalLM.from_pretrained(CHECKPOINT)
    deltas = [(a - b).abs().max().item() for a, b in zip(trained.parameters(), original.parameters(), strict=True)]
    assert max(deltas) > 0


def _refused(done: subprocess.CompletedProcess[str], message: str, out: Path) -> None:
    assert done.returncode == 2, done.stderr[-3000:]
    assert message in done.stderr, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert not out.exists()  # nothing half-written


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
    done = agl_train_here(
        capsys,
        "--agent", "calc_agent:calc_agent", "--app-dir", str(CALC), "--model", str(CHECKPOINT), "--tasks", str(TASKS),
        "--output", str(out), *options,
    )  # fmt: skip
    _refused(done, message, out)


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
    _refused(done, "without calling the LLM", out)


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


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["ctrl-c", "sigterm"])
def test_interrupted_agl_train_stops_its_runner_processes(tmp_path: Path, sig: signal.Signals, code: int) -> None:
    cmd = [
        sys.executable, "-m", "agentlightning.cli", "train",
        "--agent", "calc_agent:calc_agent", "--app-dir", str(CALC), "--model", str(CHECKPOINT), "--tasks", str(TASKS),
        "--iterations", "1000", "--runners", "2", "--tool-parser", "calc", "--output", str(tmp_path / "run"), *SMALL,
    ]  # fmt: skip
    agl = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600
        # two runners and the dashboard store server, each with whatever it started
        while len(children := _descendants(agl.pid)) < 3:
            assert agl.poll() is None, agl.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "agl train never started its runner processes"
            time.sleep(0.2)
        agl.send_signal(sig)  # what a Ctrl-C at the terminal (SIGINT to agl train) or a `kill` does
        _, stderr = agl.communicate(timeout=120)
    finally:
        if agl.poll() is None:
            agl.kill()
    assert agl.returncode == code, stderr[-3000:]
    left = [pid for pid in children if _alive(pid)]
    assert left == [], f"processes left running after agl train exited: {left}"


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
