"""Agents in any language or process: the runner starts a command per rollout (``agl runner --agent-command``).

The contract (docs/agents-in-other-languages.md):

* the command is split like a shell would (`shlex.split`), but no shell runs it: ``node agent.mjs`` runs ``node``
  with one argument; quote an argument with spaces. It runs in the app folder, in a process group of its own;
* its environment is the runner's (without the store's and the proxy's tokens) plus `command_environment`: the
  attempt's LLM proxy URL, key and model for the OpenAI and Anthropic SDKs, the rollout's ids, and the OpenTelemetry
  exporter settings that send its spans into its attempt: the served store's ``/v1/traces``, or, for a store the
  runner opened itself, a receiver of the runner's own (`agentlightning.runner._otlp_receiver`);
* the task is written to its stdin as one JSON document, and stdin is closed;
* its reward is the last non-empty line of its stdout: ``{"reward": 0.7, ...}`` or a bare number (``null`` or
  ``{"reward": null}``: no final reward, its reward spans carry it). Anything else on stdout before that line is
  ignored; its stderr is kept for the error.

A command that exits with a code other than 0, prints no reward line or one that does not parse, writes more than
``max_stdout_bytes`` to stdout, or runs past ``timeout`` fails its attempt with `CommandAgentError`, whose message
says why and ends with the tail of its stderr; the runner logs it and stores it on the attempt. Whatever way the
rollout ends (done, failed, timed out, cancelled, the runner draining), the command's whole process group is ended:
SIGTERM, then SIGKILL after ``stop_grace_s`` seconds; processes it left behind when it exited are killed at once. A
runner killed outright has its commands ended by a watcher process (`agentlightning.runner._reaper`). stdout and
stderr are read as they come and only their tails kept, so a chatty or hostile command cannot fill the runner's
memory.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import shlex
import shutil
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from agentlightning import semconv
from agentlightning._models import Resources
from agentlightning.runner._reaper import kill_group, reaper
from agentlightning.tracing import current_rollout

__all__ = ["CommandAgent", "CommandAgentError", "command_environment", "parse_reward_line"]

logger = logging.getLogger(__name__)

_TAIL_BYTES = 64 * 1024
"""Bytes of stdout (for the reward line) and of stderr (for the error) kept in memory."""
_ERROR_TAIL_CHARS = 1500
"""Characters of stderr's tail in an attempt's error."""
_READ_CHUNK = 64 * 1024
_HIDDEN = ("AGL_STORE_TOKEN", "AGL_PROXY_TOKEN", "AGL_LIFELINE_FD")
"""The runner's own secrets and descriptors: a command agent never sees them."""
_AFTER_EXIT_S = 5.0
"""Seconds the pipes may stay open after the command's group was ended (a process that left the group holds them)."""


class CommandAgentError(RuntimeError):
    """A command agent's rollout failed: its message says why (exit code, reward line, timeout) and shows stderr."""


def parse_reward_line(line: str) -> float | None:
    """The reward a command printed as its last stdout line: ``{"reward": x, ...}``, ``x``, or ``null`` (none).

    Raises:
        ValueError: Not a reward line (the message quotes it).
    """
    shown = line if len(line) <= 200 else line[:200] + "..."
    try:
        value: Any = json.loads(line)
    except ValueError:
        raise ValueError(f'the last line of stdout is not a reward: {shown!r} (print {{"reward": x}} or x)') from None
    if isinstance(value, dict):
        if "reward" not in value:
            raise ValueError(f"the last line of stdout is a JSON object without a 'reward' key: {shown!r}")
        value = value["reward"]
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"the reward on the last line of stdout is not a finite number: {shown!r}")
    return float(value)


def _otel_value(text: str) -> str:
    """A value of ``OTEL_RESOURCE_ATTRIBUTES`` / ``OTEL_EXPORTER_OTLP_HEADERS``: percent-encoded (W3C Baggage)."""
    return quote(text, safe="")


def command_environment(
    rollout_id: str,
    attempt_id: str,
    resources: Resources | None,
    llm_base_url: str | None,
    otlp: tuple[str, str] | None = None,
) -> dict[str, str]:
    """The variables a command agent gets on top of the runner's environment.

    Args:
        rollout_id: The rollout's id.
        attempt_id: The attempt's id.
        resources: The rollout's resources as agents get them.
        llm_base_url: The attempt's OpenAI base URL on the LLM proxy (``None``: no LLM resource).
        otlp: ``(traces endpoint URL, bearer credential)`` for the agent's OpenTelemetry spans (``None``: not sent).
    """
    env = {"AGL_ROLLOUT_ID": rollout_id, "AGL_ATTEMPT_ID": attempt_id}
    llm = resources.llm if resources is not None else None
    if llm is not None and llm_base_url is not None:
        key = llm.api_key or "agl-no-key"  # the SDKs refuse an empty key; the proxy's slot URL admits the call
        env.update(
            OPENAI_BASE_URL=llm_base_url,
            OPENAI_API_KEY=key,
            OPENAI_MODEL=llm.model,
            ANTHROPIC_BASE_URL=llm_base_url.rstrip("/").removesuffix("/v1"),  # Anthropic's SDKs append /v1/messages
            ANTHROPIC_API_KEY=key,
            AGL_SAMPLING_PARAMETERS=json.dumps(llm.sampling_parameters),
        )
    if resources is not None and resources.resources_id:
        env["AGL_RESOURCES_ID"] = resources.resources_id
    if otlp is not None:
        endpoint, credential = otlp
        ids = {semconv.ROLLOUT_ID: rollout_id, semconv.ATTEMPT_ID: attempt_id}
        env.update(
            OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=endpoint,
            OTEL_EXPORTER_OTLP_TRACES_HEADERS=f"Authorization={_otel_value('Bearer ' + credential)}",
            OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/protobuf",
            OTEL_EXPORTER_OTLP_TRACES_COMPRESSION="none",
            OTEL_TRACES_EXPORTER="otlp",
            OTEL_RESOURCE_ATTRIBUTES=",".join(f"{k}={_otel_value(v)}" for k, v in ids.items()),
        )
    return env


def _otlp_target(store: Any, rollout_id: str, attempt_id: str) -> tuple[str, str] | None:
    """Where the command's spans go: the served store's OTLP route, with the attempt's own credential (``None``: the
    store is not a served one)."""
    from agentlightning._otlp_auth import attempt_credential
    from agentlightning.store import StoreClient

    if not isinstance(store, StoreClient) or not store.token:
        return None
    return f"{store.url.rstrip('/')}/v1/traces", attempt_credential(store.token, rollout_id, attempt_id)


class _Tail:
    """The last ``keep`` bytes read from a stream, and how many were read in all."""

    def __init__(self, keep: int = _TAIL_BYTES) -> None:
        self.keep = keep
        self.data = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        self.data += chunk
        if len(self.data) > self.keep:
            del self.data[: len(self.data) - self.keep]

    def text(self, chars: int) -> str:
        text = self.data.decode("utf-8", errors="replace").replace("\x00", "\\x00").strip()
        return text if len(text) <= chars else "..." + text[-chars:]


class _TooMuchOutput(Exception):
    pass


class CommandAgent:
    """An agent that is a program: the runner starts ``command`` for each rollout (see the module docstring).

    ``agl runner --agent-command CMD`` and ``agl train --agent-command CMD`` run one; in Python,
    ``agl.Runner(agl.CommandAgent("node agent.mjs", cwd="examples/node"), store=store)``. Runners run it as an async
    agent: ``n_workers`` commands run at once.

    Args:
        command: The command line, split as a shell would (no shell runs it), or the argument list itself.
        cwd: The folder it runs in (the app folder).
        env: More environment variables (over the runner's; under the contract's own).
        timeout: Seconds a rollout's command may run before it is ended and its attempt failed (``None``: no limit).
        stop_grace_s: Seconds between SIGTERM and SIGKILL when a command is stopped.
        max_stdout_bytes: A command that writes more to stdout is ended and its attempt failed (logs go to stderr).

    Raises:
        ValueError: An empty command, a program that cannot be found, a folder that does not exist, bad limits.
    """

    stop_when_attempt_ends = True
    """The runner stops it when the store ends its attempt first (a cancelled rollout): its process group ends."""

    def __init__(
        self,
        command: str | Sequence[str],
        *,
        cwd: str | os.PathLike[str] = ".",
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        stop_grace_s: float = 5.0,
        max_stdout_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        argv = shlex.split(command) if isinstance(command, str) else [str(part) for part in command]
        if not argv:
            raise ValueError("the agent command is empty")
        folder = Path(cwd).resolve()
        if not folder.is_dir():
            raise ValueError(f"the agent command's folder {str(folder)!r} does not exist")
        program = argv[0]
        found = shutil.which(program, path=str(folder)) if os.sep in program else shutil.which(program)
        if found is None:
            where = f"in {folder}" if os.sep in program else "on PATH"
            raise ValueError(f"the agent command's program {program!r} was not found {where}")
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
        if not (stop_grace_s >= 0 and math.isfinite(stop_grace_s)):
            raise ValueError(f"stop_grace_s must be a non-negative number of seconds, got {stop_grace_s!r}")
        if max_stdout_bytes < 1:
            raise ValueError(f"max_stdout_bytes must be positive, got {max_stdout_bytes}")
        self.argv = argv
        self.cwd = folder
        self.env = dict(env or {})
        self.timeout = timeout
        self.stop_grace_s = stop_grace_s
        self.max_stdout_bytes = max_stdout_bytes
        self.__name__ = self.__qualname__ = Path(program).name  # the rollout span's agent name
        self.__module__ = __name__

    def __repr__(self) -> str:
        return f"CommandAgent({shlex.join(self.argv)!r}, cwd={str(self.cwd)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self.argv, str(self.cwd), self.env, self.timeout, self.stop_grace_s, self.max_stdout_bytes))

    async def __call__(self, task: Any, resources: Resources | None) -> float | None:
        """Run the command for the current rollout; its reward (see the module docstring).

        Raises:
            CommandAgentError: The command failed (why, and its stderr's tail).
            RuntimeError: Called outside a rollout.
        """
        ctx = current_rollout()
        if ctx is None:
            raise RuntimeError("a CommandAgent runs inside a rollout: give it to agl.Runner")
        base_url = None
        if resources is not None and resources.llm is not None:
            from agentlightning.tracing import llm_base_url

            base_url = llm_base_url()
        otlp = _otlp_target(ctx.store, ctx.rollout_id, ctx.attempt_id)
        if otlp is not None:
            return await self._start(ctx.rollout_id, ctx.attempt_id, task, resources, base_url, otlp)
        # A store this runner opened itself: it receives the command's spans itself, while the command runs.
        from agentlightning.runner._otlp_receiver import OtlpReceiver

        receiver = OtlpReceiver(ctx.store)
        async with receiver as url:
            otlp = url, receiver.credential(ctx.rollout_id, ctx.attempt_id)
            return await self._start(ctx.rollout_id, ctx.attempt_id, task, resources, base_url, otlp)

    async def _start(
        self,
        rollout_id: str,
        attempt_id: str,
        task: Any,
        resources: Resources | None,
        base_url: str | None,
        otlp: tuple[str, str],
    ) -> float | None:
        env = {key: value for key, value in os.environ.items() if key not in _HIDDEN}
        env.update(self.env)
        env.update(command_environment(rollout_id, attempt_id, resources, base_url, otlp))
        stdin = json.dumps(task).encode() + b"\n"
        try:
            process = await asyncio.create_subprocess_exec(
                *self.argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=self.cwd,
                env=env,
                start_new_session=True,  # its own process group (and session): ended as a whole
            )
        except OSError as exc:
            raise CommandAgentError(f"could not start {shlex.join(self.argv)}: {exc}") from None
        reaper.watch(process.pid)
        try:
            return await self._run(process, stdin)
        finally:
            reaper.forget(process.pid)

    async def _run(self, process: asyncio.subprocess.Process, stdin: bytes) -> float | None:
        stdout, stderr = _Tail(), _Tail()
        assert process.stdout is not None and process.stderr is not None
        readers = [
            asyncio.ensure_future(self._read(process.stdout, stdout, self.max_stdout_bytes)),
            asyncio.ensure_future(self._read(process.stderr, stderr, None)),
        ]
        feeder = asyncio.ensure_future(_feed(process, stdin))
        try:
            async with asyncio.timeout(self.timeout):
                # not process.wait(): it also waits for the pipes, which a child the command left behind holds open
                exited = asyncio.ensure_future(_exit_code(process))
                await asyncio.wait([exited, readers[0]], return_when=asyncio.FIRST_COMPLETED)
                if readers[0].done() and readers[0].exception() is not None:  # too much output: stop it now
                    exited.cancel()
                    await self._stop(process)
                    raise self._error(
                        f"wrote more than {self.max_stdout_bytes} bytes to stdout and was stopped (print the reward "
                        "last on stdout and logs to stderr)",
                        stderr,
                    )
                code = await exited
        except TimeoutError:
            await self._stop(process)
            raise self._error(f"ran past its timeout of {self.timeout:g}s and was stopped", stderr) from None
        except BaseException:  # cancelled (the runner drains, the rollout timed out): the group goes too
            await asyncio.shield(self._stop(process))
            raise
        finally:
            kill_group(process.pid, signal.SIGKILL)  # what it left behind (a forked child that ignores SIGTERM)
            await _finish_reading(process, [*readers, feeder])
        if code != 0:
            how = f"was killed by {_signal_name(-code)}" if code < 0 else f"exited with code {code}"
            raise self._error(how, stderr)
        lines = stdout.data.decode("utf-8", errors="replace").strip().splitlines()
        if not lines:
            raise self._error("exited with code 0 but printed no reward line on stdout", stderr)
        try:
            return parse_reward_line(lines[-1].strip())
        except ValueError as exc:
            raise self._error(str(exc), stderr) from None

    def _error(self, what: str, stderr: _Tail) -> CommandAgentError:
        tail = stderr.text(_ERROR_TAIL_CHARS)
        shown = f"; its stderr ended with: {tail}" if tail else "; its stderr was empty"
        return CommandAgentError(f"the agent command {shlex.join(self.argv)} {what}{shown}")

    @staticmethod
    async def _read(stream: asyncio.StreamReader, tail: _Tail, limit: int | None) -> None:
        while chunk := await stream.read(_READ_CHUNK):
            tail.add(chunk)
            if limit is not None and tail.total > limit:
                raise _TooMuchOutput()

    async def _stop(self, process: asyncio.subprocess.Process) -> None:
        """SIGTERM to the command's group; SIGKILL once ``stop_grace_s`` passed (or at once if cancelled again)."""
        if process.returncode is None:
            kill_group(process.pid, signal.SIGTERM)
            try:
                async with asyncio.timeout(self.stop_grace_s):
                    await process.wait()
            except (TimeoutError, asyncio.CancelledError):
                pass
        kill_group(process.pid, signal.SIGKILL)
        if process.returncode is None:
            await process.wait()  # SIGKILL cannot be ignored: at once


async def _exit_code(process: asyncio.subprocess.Process) -> int:
    """The command's exit code once its first process exited (whatever still holds its pipes)."""
    if process.returncode is None:
        loop = asyncio.get_running_loop()
        try:
            fd = os.pidfd_open(process.pid)  # readable once the process exited (Linux 5.3+)
        except (AttributeError, OSError):
            fd = None
        if fd is not None:
            exited = loop.create_future()
            loop.add_reader(fd, lambda: exited.done() or exited.set_result(None))
            try:
                await exited
            finally:
                loop.remove_reader(fd)
                os.close(fd)
        while process.returncode is None:  # the child watcher reaps it now (or, without a pidfd, some time)
            await asyncio.sleep(0.005 if fd is not None else 0.05)
    return process.returncode


async def _feed(process: asyncio.subprocess.Process, data: bytes) -> None:
    """Write the task to the command's stdin and close it (a command that does not read it is no error)."""
    stdin = process.stdin
    assert stdin is not None
    try:
        stdin.write(data)
        await stdin.drain()
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        stdin.close()


async def _finish_reading(process: asyncio.subprocess.Process, tasks: list[asyncio.Future[None]]) -> None:
    """Wait for the pipes' ends (a process that left the group may hold them: given up after a while)."""
    _, pending = await asyncio.wait(tasks, timeout=_AFTER_EXIT_S)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for task in tasks:
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: a too-much-output error was reported already
    if pending:
        logger.warning("agent command (pid %d) exited, but something it started still holds its output", process.pid)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _rebuild(
    argv: list[str], cwd: str, env: dict[str, str], timeout: float | None, grace: float, max_stdout: int
) -> CommandAgent:
    return CommandAgent(argv, cwd=cwd, env=env, timeout=timeout, stop_grace_s=grace, max_stdout_bytes=max_stdout)
