"""vLLM as `TorchTrainer`'s inference server (``backend="vllm"``): launch or connect, sync, verify, report.

The trainer keeps its policy; vLLM serves its own copy of the weights (so it serves while the policy updates,
``max_staleness>0`` works). Model versions: vLLM reports none on its answers, so the LLM proxy records the version it
was told when it admitted each call. That is truthful because the loop drains the proxy before `sync` (no call in
flight), `sync` refuses to swap while vLLM still generates anything (its ``vllm:num_requests_running``), the new
weights are verified by log-probs before `sync` returns, and only then does the loop resume the proxy with the new
version.

Several policies (`LoRAPolicies`: one LoRA adapter per policy on a frozen base) are served by vLLM's multi-LoRA
serving (`VLLMLoRAServing`): a launched server gets ``--enable-lora`` and runtime adapter loading instead of the
weight-sync extension, and each policy's adapter is loaded under its name, verified by log-probs (`VLLMLoRASync`);
the proxy records each policy's version from `policy_versions`. One policy is `VLLMWeightsServing`. Both are the
engine's `agentlightning.loop.Serving`.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from agentlightning_torch.serving._backend import merged_state_dict
from agentlightning_torch.vllm._client import DEV_MODE_ENV, VLLMClient, VLLMError, extension_launch
from agentlightning_torch.vllm._lora import VLLM_LORA_ENV, vllm_lora_args
from agentlightning_torch.vllm._lora_sync import TrainedLoRAs, VLLMLoRASync
from agentlightning_torch.vllm._server import VLLMServer
from agentlightning_torch.vllm._weight_sync import ProbeResult, SyncMethod, VLLMWeightSync

__all__ = ["VLLMLoRAServing", "VLLMModel", "VLLMSettings", "VLLMWeightsServing"]

logger = logging.getLogger(__name__)


class VLLMSettings(BaseModel):
    """How `TorchTrainer` runs vLLM (``TorchTrainerConfig.backend == "vllm"``).

    Attributes:
        url: Use the vLLM server already running there (started with ``VLLM_SERVER_DEV_MODE=1``,
            ``--worker-extension-cls agl_vllm_worker.WeightSyncExtension`` and that module's folder on its
            ``PYTHONPATH``: `extension_launch`); ``None`` launches one for the model folder.
        python: The Python with vLLM (default: `find_vllm_python`, i.e. ``$AGL_VLLM_VENV`` or a ``.venv-vllm``).
        max_model_len: Context vLLM allocates for (default: the model's ``max_position_embeddings``, at most 4096).
        sync: ``extension`` (the worker extension: correct on CPU and GPUs), ``reload`` (vLLM's own
            ``reload_weights``; wrong on CPU in vLLM 0.30/0.31, which verification catches), ``auto``: ``reload``
            where CUDA is available (vLLM's own interface on GPUs), else ``extension``.
        tolerance: Largest accepted |log-prob difference| between vLLM and the trainer on the probe (float32).
        startup_timeout_s: How long a launched server may take to become healthy.
        idle_timeout_s: How long a sync waits for vLLM to finish generating before it refuses to swap weights.
        enforce_eager: ``--enforce-eager`` for a launched server (see `VLLMServer`).
        kv_cache_gib: KV-cache size of a launched CPU server.
        tool_parser_plugin: ``--tool-parser-plugin`` file registering the config's ``tool_parser`` with vLLM.
        extra_args: More arguments for a launched server.
        log_path: The launched server's log (default: a file in the system temp folder).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str | None = None
    python: str | None = None
    max_model_len: int | None = Field(default=None, ge=16)
    sync: Literal["auto", "extension", "reload"] = "auto"
    tolerance: float = Field(default=1e-3, gt=0)
    startup_timeout_s: float = Field(default=600.0, gt=0)
    idle_timeout_s: float = Field(default=60.0, gt=0)
    enforce_eager: bool = True
    kv_cache_gib: int = Field(default=1, ge=1)
    tool_parser_plugin: Path | None = None
    extra_args: tuple[str, ...] = ()
    log_path: Path | None = None


@dataclass(frozen=True)
class VLLMModel:
    """The model a vLLM serving serves, and how (``agentlightning_torch.training.vllm_model`` reads it from a
    `TorchTrainerConfig`).

    Attributes:
        settings: The vLLM settings.
        model_dir: The model folder a launched server loads (its weights are replaced at `start` anyway).
        model_name: The served model name.
        tool_parser: vLLM's ``--tool-call-parser`` (``None``: no tool-call parsing).
        device: The trainer's device (``auto`` sync picks vLLM's reload on CUDA).
        tokenizer: The model's tokenizer (probe prompt).
        vocab_size: The model's vocabulary size.
    """

    settings: VLLMSettings
    model_dir: str | Path
    model_name: str
    tool_parser: str | None
    device: str
    tokenizer: Any
    vocab_size: int


class _VLLMServingBase:
    """What both vLLM ways of serving share: launch (or reach) the server, wait for it, stop it.

    Args:
        model: The model and the vLLM settings.
        lora: ``(adapters, rank)``: a launched server serves that many LoRA adapters of that rank (multi-LoRA);
            ``None``: one model, synced as full weights through the worker extension.
    """

    def __init__(self, model: VLLMModel, lora: tuple[int, int] | None) -> None:
        self.model = model
        self.settings = model.settings
        self.lora = lora
        self.server: VLLMServer | None = None
        """The server launched here (``None``: not yet, or one given by ``settings.url``)."""
        self.syncs = 0
        """Weight syncs (or adapter loads at `start` and each sync) done so far."""

    @property
    def url(self) -> str:
        """The server's base URL."""
        if self.settings.url is not None:
            return self.settings.url.rstrip("/").removesuffix("/v1")
        if self.server is None:
            raise RuntimeError("vLLM is not started")
        return self.server.url

    def _client(self) -> VLLMClient | None:
        """The server's control client once started (each way of serving holds it in its sync)."""
        raise NotImplementedError

    @property
    def client(self) -> VLLMClient:
        """The server's control client (after `start`)."""
        client = self._client()
        if client is None:
            raise VLLMError("vLLM is not started; call `await trainer.start(store)` first")
        return client

    def _server_args(self) -> list[str]:
        args = list(vllm_lora_args(*self.lora)) if self.lora is not None else extension_launch()[0]
        args += self.settings.extra_args
        if self.model.tool_parser is not None:
            args += ["--enable-auto-tool-choice", "--tool-call-parser", self.model.tool_parser]
            if self.settings.tool_parser_plugin is not None:
                args += ["--tool-parser-plugin", str(self.settings.tool_parser_plugin)]
        return args

    async def _launch(self) -> None:
        """Launch a server for the model folder unless one is given by ``url`` (or already launched)."""
        if self.settings.url is None and self.server is None:
            # dev mode either way: `abort` needs POST /abort_requests (the weight-sync extension's launch sets it)
            env = {**VLLM_LORA_ENV, **DEV_MODE_ENV} if self.lora is not None else extension_launch()[1]
            server = VLLMServer(
                self.model.model_dir,
                served_model_name=self.model.model_name,
                args=self._server_args(),
                max_model_len=self.settings.max_model_len or _context_length(self.model.model_dir),
                enforce_eager=self.settings.enforce_eager,
                kv_cache_gib=self.settings.kv_cache_gib,
                env=env,
                python=self.settings.python,
                startup_timeout=self.settings.startup_timeout_s,
                log_path=self.settings.log_path,
                metrics=True,  # sync waits on vllm:num_requests_running
            )
            await asyncio.to_thread(server.start)
            self.server = server

    async def running(self) -> int:
        """Requests vLLM is generating now (0 before `start`)."""
        client = self._client()
        return 0 if client is None else await client.running()

    async def wait_idle(self, timeout_s: float) -> int:
        """Wait (at most ``timeout_s``) until vLLM generates nothing (its ``vllm:num_requests_running`` is 0);
        returns the requests still running."""
        client = self._client()
        return 0 if client is None else await client.wait_idle(timeout_s)

    async def abort(self, timeout_s: float) -> int:
        """Abort every request vLLM holds (``POST /abort_requests``) and wait (at most ``timeout_s``) for them to
        leave; returns the requests left."""
        client = self._client()
        if client is None:
            return 0
        await client.abort()
        return await client.wait_idle(timeout_s)

    def release(self) -> None:
        """Nothing to release: vLLM keeps its own copy of the weights (it serves during updates)."""

    async def stop(self) -> None:
        """Stop a launched server (a server given by ``url`` keeps running)."""
        if self.server is not None:
            await asyncio.to_thread(self.server.stop)
            self.server = None


class VLLMWeightsServing(_VLLMServingBase):
    """`Serving` of one policy on vLLM: launch or connect → the policy's (merged) weights synced and verified by
    log-probs per version (`VLLMWeightSync`) → stop.

    Args:
        model: The model and the vLLM settings.
        policy: The trained model (a LoRA policy is merged before each sync).
    """

    def __init__(self, model: VLLMModel, policy: torch.nn.Module) -> None:
        super().__init__(model, lora=None)
        self.policy = policy
        method: SyncMethod = "extension"
        on_gpu = model.device.startswith("cuda") or torch.cuda.is_available()  # a vLLM launched here runs on CUDA
        if self.settings.sync == "reload" or (self.settings.sync == "auto" and on_gpu):
            method = "reload"
        self.method: SyncMethod = method
        self._sync: VLLMWeightSync | None = None
        self.last_probe: ProbeResult | None = None
        """The last sync's probe (its version and largest log-prob difference)."""

    def _client(self) -> VLLMClient | None:
        return None if self._sync is None else self._sync.client

    async def start(self, version: int) -> list[str]:
        """Launch (or reach) vLLM, load the policy's current weights into it and verify them; returns its URL.

        The weights are synced even when vLLM loaded the same folder: a resumed run's policy differs from the
        folder, and a server given by ``url`` may have loaded anything of the same architecture.
        """
        if self._sync is None:
            await self._launch()
            client = VLLMClient(self.url, self.model.model_name)
            self._sync = VLLMWeightSync(
                client,
                self.model.tokenizer,
                self.model.vocab_size,
                method=self.method,
                tolerance=self.settings.tolerance,
                idle_timeout_s=self.settings.idle_timeout_s,
            )
            await self.sync(version)
        return [self.url]

    async def sync(self, version: int) -> None:
        """Load the policy's merged weights into vLLM and verify them; vLLM serves ``version`` from now on.

        Raises:
            WeightSyncMismatch: vLLM's probe log-probs differ from the policy's (the message names ``version``).
            VLLMError: vLLM is not started, was busy past ``idle_timeout_s`` or refused the load.
        """
        if self._sync is None:
            raise VLLMError("vLLM is not started; call `await trainer.start(store)` first")
        self.last_probe = await self._sync.sync(merged_state_dict(self.policy), self.policy, version)
        self.syncs += 1

    def metrics(self) -> dict[str, float]:
        """The last sync's timings and its probe's largest log-prob difference."""
        return {} if self._sync is None else dict(self._sync.last)

    async def stop(self) -> None:
        """Stop a launched server; a later `start` launches (or reaches) and syncs again."""
        self._sync = None
        await super().stop()

    def policy_versions(self) -> dict[str, int]:
        """Empty: one policy, whose version the proxy records from the loop."""
        return {}


class VLLMLoRAServing(_VLLMServingBase):
    """`Serving` of several LoRA policies on vLLM's multi-LoRA serving: a launched server gets ``--enable-lora`` and
    runtime adapter loading; each policy's adapter is loaded under its name and verified by log-probs
    (`VLLMLoRASync`); the proxy records each policy's version from `policy_versions`.

    Args:
        model: The model and the vLLM settings.
        loras: The run's LoRA policies on the frozen base.
    """

    def __init__(self, model: VLLMModel, loras: TrainedLoRAs) -> None:
        super().__init__(model, lora=(len(loras.names), loras.max_rank))
        self.loras = loras
        self.lora_sync: VLLMLoRASync | None = None
        """The per-policy adapter sync (after `start`)."""

    def _client(self) -> VLLMClient | None:
        return None if self.lora_sync is None else self.lora_sync.base.client

    async def start(self, version: int) -> list[str]:
        """Launch (or reach) vLLM, verify its base model, load every policy's adapter and verify it; returns its URL.

        Raises:
            WeightSyncMismatch: vLLM's base or an adapter differs from the trainer's (names version and policy).
            VLLMError: vLLM refused an adapter (started without ``--enable-lora`` or runtime LoRA updating?).
        """
        if self.lora_sync is None:
            await self._launch()
            self.lora_sync = VLLMLoRASync(
                self.url,
                self.model.model_name,
                self.model.tokenizer,
                self.model.vocab_size,
                tolerance=self.settings.tolerance,
                idle_timeout_s=self.settings.idle_timeout_s,
            )
            await self.lora_sync.start(self.loras, version)
            self.syncs += 1
        return [self.url]

    async def sync(self, version: int) -> None:
        """Load the adapters the last update changed into vLLM as ``version`` and verify each (the others keep
        their version).

        Raises:
            WeightSyncMismatch: vLLM's log-probs of an adapter differ from the trainer's (names version and policy).
            VLLMError: vLLM is not started, was busy past ``idle_timeout_s`` or refused an adapter.
        """
        if self.lora_sync is None:
            raise VLLMError("vLLM is not started; call `await trainer.start(store)` first")
        await self.lora_sync.sync(self.loras, list(self.loras.updated), version)
        self.syncs += 1

    def metrics(self) -> dict[str, float]:
        """The last sync's timings and its probes' largest log-prob difference."""
        return {} if self.lora_sync is None else dict(self.lora_sync.last)

    def policy_versions(self) -> dict[str, int]:
        """Per policy (``frozen`` included), the version of the weights vLLM serves it with."""
        return {} if self.lora_sync is None else dict(self.lora_sync.versions)

    async def stop(self) -> None:
        """Delete the adapter folders and stop a launched server."""
        if self.lora_sync is not None:
            self.lora_sync.close()
            self.lora_sync = None
        await super().stop()


def _context_length(model_dir: str | Path) -> int:
    """The model's ``max_position_embeddings`` (at most 4096: the KV cache vLLM allocates per sequence on a CPU)."""
    import json

    config = Path(model_dir) / "config.json"
    if not config.is_file():
        return 4096
    data = json.loads(config.read_text(encoding="utf-8"))
    return min(int(data.get("max_position_embeddings", 4096)), 4096)
