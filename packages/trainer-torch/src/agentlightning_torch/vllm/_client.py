"""The trainer's calls to a running vLLM server besides the OpenAI ones: ``/metrics``, ``/collective_rpc``, probes.

A vLLM the trainer syncs weights into runs with the worker extension ``agl_vllm_worker.py`` (shipped by the core)
(`WORKER_EXTENSION`, its folder `EXTENSION_DIR` on the server's ``PYTHONPATH``) and ``VLLM_SERVER_DEV_MODE=1``, which
enables ``/collective_rpc`` — bind it to loopback only: that route runs code in the server. `extension_launch` gives
`VLLMServer` those arguments and that environment.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp

from agentlightning.vllm_worker_files import VLLM_WORKER_DIR, VLLM_WORKER_EXTENSION

__all__ = [
    "DEV_MODE_ENV",
    "EXTENSION_DIR",
    "WORKER_EXTENSION",
    "VLLMClient",
    "VLLMError",
    "extension_launch",
    "running_requests",
]

DEV_MODE_ENV = {"VLLM_SERVER_DEV_MODE": "1"}
"""The environment that turns on vLLM's development endpoints (``/collective_rpc``, ``/abort_requests``)."""

EXTENSION_DIR = VLLM_WORKER_DIR
"""The folder holding the standalone worker-extension module (no ``agentlightning`` imports), shipped by the core
because trainer-verl's vLLM worker uses the same file."""

WORKER_EXTENSION = VLLM_WORKER_EXTENSION
"""``--worker-extension-cls`` of a vLLM server the trainer syncs weights into."""


class VLLMError(RuntimeError):
    """vLLM answered an error, stayed busy, or serves other weights than the trainer's."""


def extension_launch(env: Mapping[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """The extra arguments and environment of a vLLM server with the weight-sync extension (see the module docs)."""
    source = os.environ if env is None else env
    path = source.get("PYTHONPATH", "")
    pythonpath = str(EXTENSION_DIR) + (os.pathsep + path if path else "")
    return ["--worker-extension-cls", WORKER_EXTENSION], {"PYTHONPATH": pythonpath, **DEV_MODE_ENV}


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

    async def abort(self) -> None:
        """Abort every request vLLM holds (``POST /abort_requests`` without ids; vLLM's RL endpoints, served with
        ``VLLM_SERVER_DEV_MODE=1``); new requests are served as before.

        Raises:
            VLLMError: vLLM refused the call.
        """
        status, text = await self._request("POST", "/abort_requests", {})
        if status != 200:
            raise VLLMError(f"vLLM at {self.url} answered {status} to POST /abort_requests: {text[:300]}")

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

    async def has_rl_api(self) -> bool:
        """Whether the server has vLLM's RL routes (``/pause``, ``/resume``, ``/update_weight_version``,
        ``/weight_checker``: vLLM 0.32+ with ``VLLM_SERVER_DEV_MODE=1``)."""
        status, _ = await self._request("GET", "/is_paused")
        return status == 200

    async def _rl(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        status, text = await self._request(method, path, body)
        if status != 200:
            raise VLLMError(f"vLLM at {self.url} answered {status} to {method} {path}: {text[:500]}")
        answer: dict[str, Any] = json.loads(text) if text else {}
        return answer

    async def pause(self, mode: str = "keep") -> None:
        """``POST /pause?mode=...``: ``keep`` freezes requests in vLLM's queue (none is lost; they go on at
        `resume`), ``wait`` lets those in flight finish, ``abort`` aborts them."""
        await self._rl("POST", f"/pause?mode={mode}")

    async def resume(self) -> None:
        """``POST /resume``: generation goes on (requests kept by a ``keep`` pause included)."""
        await self._rl("POST", "/resume")

    async def is_paused(self) -> bool:
        """``GET /is_paused``."""
        return bool((await self._rl("GET", "/is_paused"))["is_paused"])

    async def update_weight_version(self, version: str) -> None:
        """``POST /update_weight_version``: the version vLLM reports for its weights from now on (`weight_version`)."""
        await self._rl("POST", "/update_weight_version", {"new_version": version})

    async def weight_version(self) -> str | None:
        """``GET /weight_info``: the version last set by `update_weight_version` (``None``: never set)."""
        version = (await self._rl("GET", "/weight_info")).get("weight_version")
        return None if version is None else str(version)

    async def weight_checksums(self) -> dict[str, str]:
        """``POST /weight_checker`` ``checksum``: a SHA-256 per tensor of the weights vLLM serves (its own layout:
        comparable with an earlier checksum of the same server, not with the trainer's state dict)."""
        checksums: dict[str, str] = (await self._rl("POST", "/weight_checker", {"action": "checksum"}))["checksums"]
        return checksums

    async def weights_match(self, baseline: dict[str, str]) -> list[str]:
        """``POST /weight_checker`` ``compare``: the tensors whose checksum differs from ``baseline`` (none: [])."""
        answer = await self._rl("POST", "/weight_checker", {"action": "compare", "baseline": baseline})
        return [str(name) for name in answer.get("mismatches", [])]

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
