"""`agl.run_async`: the framework's processes run on uvloop when it is installed, on asyncio's loop otherwise."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import pytest

import agentlightning as agl


async def _loop_module() -> str:
    await asyncio.sleep(0)
    return type(asyncio.get_running_loop()).__module__


def test_run_async_runs_on_uvloop_when_installed_and_on_asyncio_when_turned_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("uvloop")  # comes with uvicorn[standard] except on Windows
    assert agl.run_async(_loop_module()).startswith("uvloop")
    monkeypatch.setenv("AGL_UVLOOP", "0")
    assert agl.run_async(_loop_module()).startswith("asyncio")


def test_run_async_returns_the_result_and_raises_the_error_of_the_coroutine() -> None:
    async def fails() -> None:
        raise ValueError("boom")

    assert agl.run_async(asyncio.sleep(0, result=7)) == 7
    with pytest.raises(ValueError, match="boom"):
        agl.run_async(fails())


_INTERRUPTED = """
import asyncio, signal, sys
import agentlightning as agl

async def main():
    print("ready", flush=True)
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        print("cancelled", flush=True)  # it ends through its cleanup
        raise

try:
    agl.run_async(main())
except KeyboardInterrupt:
    print("interrupted", "ignored" if signal.getsignal(signal.SIGINT) == signal.SIG_IGN else "taken", flush=True)
    sys.exit(130)
"""


@pytest.mark.parametrize("started", [signal.SIG_DFL, signal.SIG_IGN], ids=["from-a-terminal", "sigint-ignored"])
@pytest.mark.parametrize("uvloop", ["1", "0"], ids=["uvloop", "asyncio"])
def test_ctrl_c_cancels_the_main_coroutine_even_in_a_process_started_with_sigint_ignored(
    started: signal.Handlers, uvloop: str
) -> None:
    """A script's background job (``cmd &`` without job control, ``nohup cmd &``) starts with SIGINT ignored, and
    Python leaves it so: `asyncio.run` then installs no handler and a SIGINT did nothing (``agl train`` ran on)."""
    if uvloop == "1":
        pytest.importorskip("uvloop")

    def inherit() -> None:  # the disposition the child's interpreter starts with, as a shell hands it down
        signal.signal(signal.SIGINT, started)

    env = {**os.environ, "AGL_UVLOOP": uvloop}
    cmd = [sys.executable, "-c", _INTERRUPTED]
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env, preexec_fn=inherit)
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"  # main runs: the loop's SIGINT handler is in place
        child.send_signal(signal.SIGINT)
        out, _ = child.communicate(timeout=60)  # bounds a hang only (the old code ran on for ever)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    # and the disposition it started with is back once the run is over
    after = "ignored" if started == signal.SIG_IGN else "taken"
    assert (child.returncode, out.split()) == (130, ["cancelled", "interrupted", after])


def test_a_sigint_handler_of_the_application_is_left_alone() -> None:
    def handler(signum: int, frame: object) -> None:
        pass

    previous = signal.signal(signal.SIGINT, handler)
    try:
        assert agl.run_async(asyncio.sleep(0, result=1)) == 1
        assert signal.getsignal(signal.SIGINT) is handler
    finally:
        signal.signal(signal.SIGINT, previous)
