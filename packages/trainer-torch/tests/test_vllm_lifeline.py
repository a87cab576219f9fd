"""vLLM's server lives and dies with its trainer: the guard `VLLMServer` starts it under (`_vllm_server._GUARD`).

A stand-in for vLLM's API server (a package named ``vllm`` on the server's ``PYTHONPATH``, answering ``/health`` and
``/v1/models`` as vLLM does, with a child process for its engine core) runs through the real launch path, so these
tests need no vLLM install and take seconds. The real vLLM goes through the same path in
``tests/test_example_calc_vllm.py``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agentlightning.testing import wait_until
from agentlightning_torch.testing import VLLMServer

API_SERVER = """
import argparse, json, os, subprocess, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

parser = argparse.ArgumentParser()
parser.add_argument("--model")
parser.add_argument("--served-model-name")
parser.add_argument("--port", type=int)
args, _ = parser.parse_known_args()
engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])  # its engine core
with open(os.environ["FAKE_VLLM_PIDS"], "a") as pids:
    pids.write(f"{os.getpid()} {engine.pid}\\n")


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        models = {"data": [{"id": args.served_model_name, "root": args.model}]}
        body = json.dumps(models).encode() if self.path == "/v1/models" else b""
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *rest):
        pass


ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()
"""

TRAINER = """
import sys, threading
from agentlightning_torch.testing import VLLMServer

server = VLLMServer(sys.argv[1], python=sys.executable, env={"PYTHONPATH": sys.argv[2]}, log_path=sys.argv[3])
starter = threading.Thread(target=server.start)  # from a worker thread, as the torch engine starts it
starter.start()
starter.join()
print("serving", flush=True)
threading.Event().wait()
"""


@pytest.fixture(autouse=True)
def _own_deaths(monkeypatch: pytest.MonkeyPatch) -> None:
    """The deaths these tests cause stay theirs (the list is process-wide: other tests' runs must not see them)."""
    from agentlightning_torch.vllm import _server as _vllm_server

    monkeypatch.setattr(_vllm_server, "_DEATHS", [])


@pytest.fixture
def fake_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder holding the stand-in ``vllm`` package; its processes' ids go to ``pids.txt`` beside it."""
    package = tmp_path / "fake" / "vllm" / "entrypoints" / "openai"
    package.mkdir(parents=True)
    for folder in (package, package.parent, package.parent.parent):
        (folder / "__init__.py").write_text("")
    (package / "api_server.py").write_text(textwrap.dedent(API_SERVER))
    monkeypatch.setenv("FAKE_VLLM_PIDS", str(tmp_path / "pids.txt"))
    return tmp_path / "fake"


def _pids(fake: Path) -> list[int]:
    text = (fake.parent / "pids.txt").read_text()
    return [int(pid) for pid in text.split()]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has ended; only its parent's wait is missing


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_killed_trainer_leaves_no_vllm_behind(fake_vllm: Path, tmp_path: Path) -> None:
    """kill -9 of a trainer that started vLLM from a worker thread: the server and its engine core end too."""
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, str(tmp_path / "model"), str(fake_vllm), str(tmp_path / "vllm.log")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert trainer.stdout is not None
        assert trainer.stdout.readline().strip() == "serving", (tmp_path / "vllm.log").read_text()
        server_pids = _pids(fake_vllm)
        assert len(server_pids) == 2 and all(_alive(pid) for pid in server_pids)
    finally:
        trainer.kill()
        trainer.wait()
    try:  # the guard stops the group at once; the bound only ends a hang (its SIGKILL follows after 20 s)
        wait_until(lambda: not any(_alive(pid) for pid in server_pids), "the server's processes to end", timeout=120)
    finally:
        for pid in server_pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_server_that_dies_while_serving_is_named_in_one_line(fake_vllm: Path, tmp_path: Path) -> None:
    from agentlightning_torch.vllm._server import serving_deaths

    log = tmp_path / "vllm.log"
    server = VLLMServer(tmp_path / "model", python=sys.executable, env={"PYTHONPATH": str(fake_vllm)}, log_path=log)
    with server:
        assert server.death is None
        api_server, engine = _pids(fake_vllm)
        os.kill(api_server, signal.SIGKILL)  # what the kernel's out-of-memory killer does
        wait_until(lambda: server.death is not None, "the death to be noted", timeout=120)
        death = server.death
        assert death is not None and "\n" not in death
        assert "vLLM" in death and "killed by SIGKILL" in death and str(log) in death
        assert death in serving_deaths()
        assert "vLLM's server exited with status -9" in log.read_text()
        os.kill(engine, signal.SIGKILL)
    assert server.death == death  # stop() after the death changes nothing


def test_a_stopped_server_is_no_death(fake_vllm: Path, tmp_path: Path) -> None:
    server = VLLMServer(tmp_path / "model", python=sys.executable, env={"PYTHONPATH": str(fake_vllm)})
    with server:
        process = server.process
        assert process is not None
    assert process.returncode is not None and server.death is None


def test_a_run_whose_server_died_ends_with_that_one_line(
    fake_vllm: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What failed next (here a refused connection) is not printed: the death is, in one line."""
    from agentlightning_torch.runkit import run_main

    log = tmp_path / "vllm.log"

    async def work() -> dict[str, object]:
        server = VLLMServer(tmp_path / "model", python=sys.executable, env={"PYTHONPATH": str(fake_vllm)}, log_path=log)
        with server:
            api_server, engine = _pids(fake_vllm)
            os.kill(engine, signal.SIGKILL)
            os.kill(api_server, signal.SIGKILL)
            wait_until(lambda: server.death is not None, "the death to be noted", timeout=120)
            raise ConnectionRefusedError(111, "Connection refused")

    assert run_main(work) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: vLLM serving") and str(log) in err[0], err
