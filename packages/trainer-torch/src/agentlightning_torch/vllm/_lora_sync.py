"""Per-policy LoRA adapters in a running vLLM (multi-LoRA), every load verified by log-probs (`VLLMLoRASync`).

A multi-policy run (`LoRAPolicies`) served by vLLM keeps vLLM's base model as it is (the base never trains) and
serves each trained policy's adapter under the policy's name (the LLM proxy asks for it as the ``model``; frozen
calls get the base model's name). At the start every adapter is loaded; after each update only the adapters that
changed are written (``save_pretrained``) and loaded again under the same name (vLLM's runtime
``load_lora_adapter`` with ``load_inplace``), each into a new folder (vLLM may reload an evicted adapter from its
folder, so the folder of the version it serves is kept until the next one replaces it).

A 200 from vLLM proves nothing (its CPU build has answered 200 to a weight load that left a wrong model; see
``docs/training/index.md``, "Serving through real vLLM"): after each load the adapter's greedy probe
log-probs from vLLM must equal the trainer's own with that adapter active (and the base's, with every adapter off, at
the start), else `WeightSyncMismatch` names the version and the policy.

vLLM reports no model version on its answers: `versions` holds, per policy (`agentlightning.FROZEN` included), the
version of the weights vLLM serves it with, which the engine hands to the LLM proxy (``policy_versions``).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from agentlightning import FROZEN
from agentlightning_torch.models._lora import LORAS_FOLDER, lora_folder
from agentlightning_torch.vllm._client import VLLMClient, VLLMError
from agentlightning_torch.vllm._lora import load_vllm_lora
from agentlightning_torch.vllm._weight_sync import ProbeResult, VLLMWeightSync, WeightSyncMismatch

__all__ = ["TrainedLoRAs", "VLLMLoRASync"]

logger = logging.getLogger(__name__)


class TrainedLoRAs(Protocol):
    """What vLLM's multi-LoRA serving needs of the trained adapters (``agentlightning_torch.LoRAPolicies``)."""

    @property
    def names(self) -> Sequence[str]:
        """Every adapter's name (its policy)."""
        ...

    @property
    def model(self) -> Any:
        """The peft model holding every adapter on the frozen base."""
        ...

    @property
    def updated(self) -> Sequence[str]:
        """The adapters the last update changed."""
        ...

    @property
    def max_rank(self) -> int:
        """The largest adapter rank (what vLLM is started for)."""
        ...


class VLLMLoRASync:
    """Loads each policy's LoRA adapter into one vLLM server and verifies it.

    Args:
        url: vLLM's base URL (started with ``--enable-lora`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``).
        base_model: The name vLLM serves the base model under.
        tokenizer: The model's tokenizer (for the probe prompt).
        vocab_size: The model's vocabulary size.
        tolerance: Largest accepted |log-prob difference| between vLLM and the trainer on the probe (float32).
        idle_timeout_s: How long a sync waits for vLLM to finish generating before it refuses to load.
    """

    def __init__(
        self,
        url: str,
        base_model: str,
        tokenizer: Any,
        vocab_size: int,
        *,
        tolerance: float = 1e-3,
        idle_timeout_s: float = 60.0,
    ) -> None:
        self.url = url
        self.idle_timeout_s = idle_timeout_s
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._tolerance = tolerance
        self.base = self._prober(base_model)
        self.versions: dict[str, int] = {}
        """Per policy (`FROZEN` for the base), the version of the weights vLLM serves it with."""
        self.probes: dict[str, ProbeResult] = {}
        """Per policy, the last verification."""
        self.last: dict[str, float] = {}
        self._root = Path(tempfile.mkdtemp(prefix="agl-adapters-"))
        self._folders: dict[str, Path] = {}

    def _prober(self, model: str) -> VLLMWeightSync:
        client = VLLMClient(self.url, model)
        return VLLMWeightSync(client, self._tokenizer, self._vocab_size, tolerance=self._tolerance)

    async def start(self, adapters: TrainedLoRAs, version: int) -> None:
        """Verify vLLM's base model against the trainer's (adapters off), then load and verify every adapter.

        Raises:
            WeightSyncMismatch: vLLM's base or an adapter gives other log-probs than the trainer's.
            VLLMError: vLLM refused an adapter.
        """
        with adapters.model.disable_adapter():
            await self._verify(self.base, adapters.model, version, FROZEN)
        self.versions[FROZEN] = version
        await self.sync(adapters, list(adapters.names), version)

    async def sync(self, adapters: TrainedLoRAs, names: list[str], version: int) -> None:
        """Load the adapters ``names`` (their current weights in ``adapters``) into vLLM as ``version``; verify each.

        Raises:
            VLLMError: vLLM still generates after ``idle_timeout_s`` (a request would span two versions) or refused
                an adapter (the one served before stays).
            WeightSyncMismatch: vLLM's log-probs of an adapter differ from the trainer's (names version and policy).
        """
        t0 = time.perf_counter()
        running = await self.base.client.wait_idle(self.idle_timeout_s)
        if running:
            raise VLLMError(
                f"adapter sync to version {version}: vLLM still generates {running} request(s) after "
                f"{self.idle_timeout_s:.0f} s; they would mix two versions (cancelled rollouts were not aborted?)"
            )
        load_s = verify_s = 0.0
        worst = 0.0
        for name in names:
            t_load = time.perf_counter()
            directory = await asyncio.to_thread(self._write, adapters, name, version)
            await asyncio.to_thread(load_vllm_lora, self.url, name, lora_folder(directory, name))
            t_verify = time.perf_counter()
            adapters.model.set_adapter(name)
            probe = await self._verify(self._prober(name), adapters.model, version, name)
            self._keep(name, directory)
            self.versions[name] = version
            worst = max(worst, probe.max_abs_diff)
            load_s += t_verify - t_load
            verify_s += time.perf_counter() - t_verify
        self.last = {
            "vllm_sync_wait_idle_s": time.perf_counter() - t0 - load_s - verify_s,
            "vllm_sync_load_s": load_s,
            "vllm_sync_verify_s": verify_s,
            "vllm_sync_adapters": float(len(names)),
            "vllm_sync_max_logprob_diff": worst,
        }

    async def verify(self, adapters: TrainedLoRAs, name: str, version: int) -> ProbeResult:
        """Compare vLLM's probe log-probs of policy ``name`` (`FROZEN`: the base) with the trainer's now.

        Raises:
            WeightSyncMismatch: They differ by more than the tolerance (the message names ``version`` and ``name``).
        """
        if name == FROZEN:
            with adapters.model.disable_adapter():
                return await self._verify(self.base, adapters.model, version, name)
        adapters.model.set_adapter(name)
        return await self._verify(self._prober(name), adapters.model, version, name)

    async def _verify(self, prober: VLLMWeightSync, model: Any, version: int, name: str) -> ProbeResult:
        try:
            probe = await prober.verify(model, version)
        except WeightSyncMismatch as error:
            raise WeightSyncMismatch(f"policy {name!r}: {error}") from error
        self.probes[name] = probe
        return probe

    def _write(self, adapters: TrainedLoRAs, name: str, version: int) -> Path:
        """Adapter ``name`` written by ``save_pretrained`` into a folder of its own (a new one per version)."""
        directory = self._root / f"{name}-v{version}-{time.time_ns()}"
        adapters.model.save_pretrained(str(directory / LORAS_FOLDER), selected_adapters=[name])
        return directory

    def _keep(self, name: str, directory: Path) -> None:
        """Keep the folder vLLM now serves ``name`` from; drop the previous version's."""
        old = self._folders.get(name)
        self._folders[name] = directory
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def close(self) -> None:
        """Delete the adapter folders (vLLM keeps serving what it loaded until it evicts it)."""
        shutil.rmtree(self._root, ignore_errors=True)
