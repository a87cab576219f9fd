"""`agl.run_async`: the framework's processes run on uvloop when it is installed, on asyncio's loop otherwise."""

from __future__ import annotations

import asyncio

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
