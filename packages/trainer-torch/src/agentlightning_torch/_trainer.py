"""`TorchEngine`: the embedded-default engine — a local batched backend behind the LLM proxy, PPO on one machine.

The RL step itself is core's `agentlightning.RLLoop` (rollouts → transitions → LightningRL credit → update → new
model version served); `TorchEngine` is the engine behind it: it builds the policy and its optimizer, serves the
policy with `LocalBackend` (which reports the version of the weights behind every answer) or vLLM, runs
`ppo_update`, swaps the weights into the backend, and saves/loads checkpoints. `TorchTrainer` is the convenience
that builds both from one `TorchTrainerConfig`: an `RLLoop` whose ``engine`` is a `TorchEngine`. Rollouts run
wherever runners are (other processes, other machines); the trainer only talks to the store and serves the model.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from agentlightning import Engine, IterationReport, RLLoop, TrainingBatch
from agentlightning.loop import BEST_CHECKPOINT
from agentlightning.proxy import register_backend, unregister_backend
from agentlightning_torch._backend import LocalBackend, merged_state_dict
from agentlightning_torch._checkpoint import load_adapter_weights, load_trainer_state, merged_model, save_checkpoint
from agentlightning_torch._endpoint import OpenAIEndpoint
from agentlightning_torch._loading import load_model
from agentlightning_torch._lora import is_lora
from agentlightning_torch._policy_adapters import PolicyAdapters
from agentlightning_torch._policy_serving import FullBackends, PolicyEndpoint
from agentlightning_torch._policy_set import TrainedPolicies
from agentlightning_torch._ppo import make_optimizer, ppo_update, prepare_policy
from agentlightning_torch._server import BackendServer
from agentlightning_torch._trainer_config import TorchTrainerConfig
from agentlightning_torch._vllm_serving import VLLMServing

__all__ = ["IterationReport", "TorchEngine", "TorchTrainer"]

logger = logging.getLogger(__name__)


class TorchEngine(Engine):
    """PPO/GRPO on one machine (CPU or one CUDA GPU): the policy, its optimizer and its inference server.

    Train it with ``agentlightning.RLLoop(config.loop_config(), TorchEngine(config))``, or build both at once with
    `TorchTrainer`. A subclass (to check or record each batch, say) goes to `RLLoop` the same way.

    The backend generates with its own copy of the weights (`LocalBackend` copies the model it is given; a
    weight sync copies the policy's state dict into it), so the model's parameters are held twice, plus the
    optimizer state; in exchange the backend keeps serving the current version while `update` changes the policy in
    place, which ``max_staleness=1`` (the next iteration's rollouts run during the update) relies on.

    Args:
        config: Validated settings (the loop's share is ``config.loop_config()``).
    """

    serves_during_update = True
    """The backend serves its own copy of the weights until `sync_weights`, so it can serve while `update` runs."""

    def __init__(self, config: TorchTrainerConfig) -> None:
        self.config = config
        torch.set_num_threads(config.num_threads)
        loaded = load_model(config.model_dir, device=config.device)
        self.tokenizer = loaded.tokenizer
        self.generation_config = loaded.generation_config
        self.trained: TrainedPolicies | None = None
        """With ``config.policies``: every trained policy, a LoRA adapter on the base or full weights of its own."""
        self.adapters: PolicyAdapters | None = None
        """The LoRA policies (served together by one backend, or by vLLM's multi-LoRA serving)."""
        self.policies_unsupported = None if config.policies else "TorchTrainerConfig.policies is not set"
        if config.policies is not None:
            trained = TrainedPolicies(loaded.model, config.policies.trained, config.ppo, config.policy_settings)
            self.trained, self.adapters = trained, trained.lora
            self.policy: torch.nn.Module = trained.base
            self.optimizer = next(iter(trained.optimizers.values()))
        else:
            self.policy = prepare_policy(loaded.model, config.ppo)
            self.optimizer = make_optimizer(self.policy, config.ppo)
        # The KL penalty's reference exists only when the penalty does; a LoRA policy's reference is its own base
        # with the adapters switched off (no copy at all).
        self.ref_model: torch.nn.Module | None = None
        if config.ppo.kl_coef > 0 and self.trained is None and not is_lora(self.policy):
            self.ref_model = load_model(config.model_dir, device=config.device).model.requires_grad_(False)
        self._backend: LocalBackend | None = None
        self._full_backends: FullBackends | None = None
        self.vllm: VLLMServing | None = None
        if config.backend == "vllm":
            self.vllm = VLLMServing(
                config.vllm,
                model_dir=config.model_dir,
                model_name=config.model_name,
                tool_parser=config.tool_parser,
                device=config.device,
                tokenizer=self.tokenizer,
                vocab_size=int(getattr(loaded.model.config, "vocab_size", len(self.tokenizer))),
                # policies: vLLM serves each one's adapter (multi-LoRA) beside the frozen base
                lora=None if self.adapters is None else (len(self.adapters.names), self.adapters.max_rank),
            )
        self._server: BackendServer | None = None
        self._backend_url: str | None = None
        # backend batches, requests, busy seconds, decode steps, rows, generation CPU and tokens at the last call
        self._seen: tuple[int, int, float, int, int, float, int] = (0, 0, 0.0, 0, 0, 0.0, 0)

    async def start_servers(self, model_version: int) -> list[str]:
        """Start the local backend (a copy of the policy, reported as ``model_version``); returns how the proxy
        reaches it: in-process (an ``inproc://`` URL, no HTTP), or its HTTP server's URL with ``backend_http``.
        With policies, every adapter is served beside the frozen base, and each full-weight policy by a backend of
        its own behind the same in-process endpoint (`PolicyEndpoint`, routed by the request's ``model``).

        With ``backend="vllm"``: launch (or reach) vLLM, load the policy's weights into it and verify them (with
        policies: verify its base and load every policy's adapter, each verified)."""
        if self.vllm is not None:
            if self._backend_url is None and self.adapters is not None:
                self._backend_url = await self.vllm.start_adapters(self.adapters, model_version)
            elif self._backend_url is None:
                self._backend_url = await self.vllm.start(merged_state_dict(self.policy), self.policy, model_version)
            return [self._backend_url]
        if self._backend_url is None:
            multi = self.trained is not None
            served: Any = self.policy if self.serves_adapter or multi else merged_model(self.policy)
            backend = self._local_backend(served, self.config.model_name)
            backend.model_version = model_version
            if self.adapters is not None:  # every policy's adapter, served beside the frozen base
                for name in self.adapters.names:
                    backend.load_adapter(name, self.policy, version=model_version)
            self._backend = backend
            if self.config.backend_http:
                self._server = BackendServer(backend).start()
                self._backend_url = self._server.url
            else:
                backend.start()
                self._backend_url = register_backend(self._endpoint(backend, model_version))
        return [self._backend_url]

    def _local_backend(self, model: Any, model_name: str) -> LocalBackend:
        """A `LocalBackend` (a copy of ``model``) with the config's batching, threads and parsers."""
        return LocalBackend(
            model,
            self.tokenizer,
            device=self.config.device,
            max_batch_size=self.config.max_batch_size,
            batch_wait_ms=self.config.batch_wait_ms,
            max_batch_wait_ms=self.config.max_batch_wait_ms,
            model_name=model_name,
            num_threads=self.config.num_threads,
            seed=self.config.seed,
            tool_parser=self.config.tool_parser,
            generation_config=self.generation_config,
        )

    def _endpoint(self, backend: LocalBackend, model_version: int) -> OpenAIEndpoint | PolicyEndpoint:
        """The in-process endpoint: ``backend``'s, or with full-weight policies one routing to each one's backend."""
        if self.trained is None or self.trained.full is None:
            return OpenAIEndpoint(backend)
        self._full_backends = FullBackends(self.trained.full, self._local_backend, model_version)
        return PolicyEndpoint(OpenAIEndpoint(backend), self._full_backends.endpoints())

    async def stop_servers(self) -> None:
        """Stop the backend (and its HTTP server), or a vLLM server the trainer launched."""
        if self.vllm is not None:
            self._backend_url = None
            await asyncio.to_thread(self.vllm.stop)
            return
        if self._backend_url is not None:
            unregister_backend(self._backend_url)
            self._backend_url = None
        if self._server is not None:
            self._server.stop()
            self._server = None
        elif self._backend is not None:
            self._backend.stop()
        if self._full_backends is not None:
            self._full_backends.stop()
            self._full_backends = None

    async def drain_servers(self, timeout_s: float) -> int:
        """Wait (at most ``timeout_s``) until the backend generates nothing: the calls the proxy aborted have left
        `LocalBackend`'s batch, or vLLM's ``vllm:num_requests_running`` is 0; returns the requests still running."""
        if self.vllm is not None:
            return await self.vllm.wait_idle(timeout_s)
        backend = self._backend
        if backend is None:
            return 0
        deadline = time.monotonic() + timeout_s
        full = self._full_backends
        while (backend.running or (full is not None and full.running)) and time.monotonic() < deadline:
            await asyncio.sleep(0.005)  # the decode thread drops aborted rows before its next step
        return backend.running + (full.running if full is not None else 0)

    def update(self, batch: TrainingBatch) -> dict[str, float]:
        """One PPO step on ``batch`` (the `Engine` contract); with policies, one per policy with samples."""
        if self.trained is not None:
            return self.trained.update(batch, self.config.device)
        return ppo_update(
            self.policy, self.optimizer, batch, self.config.ppo, self.config.device, ref_model=self.ref_model
        )

    @property
    def serves_adapter(self) -> bool:
        """Whether the backend serves the LoRA adapter on its base (else a plain model with the adapter merged)."""
        lora = self.config.ppo.lora
        return lora is not None and lora.serve == "adapter"

    def served_weights(self) -> dict[str, torch.Tensor]:
        """The state dict the backend loads at a sync: the PEFT model's own, or the merged plain model's."""
        if self.serves_adapter:
            return {k: v.detach() for k, v in self.policy.state_dict().items()}
        return merged_state_dict(self.policy)

    async def sync_weights(self, version: int) -> None:
        """Copy the policy's weights (see `served_weights`) into the backend, which reports ``version`` from now on.

        vLLM: the merged weights are loaded and verified by log-probs (`VLLMServing.sync`); a mismatch raises
        `WeightSyncMismatch` naming ``version``, which stops the run. With policies, only the adapters the update
        changed are loaded into vLLM (in place, under their names) and verified (the error names the policy too); on
        the local backend, the updated adapters and full-weight policies (each into its own backend)."""
        if self.vllm is not None and self.adapters is not None:
            await self.vllm.sync_adapters(self.adapters, list(self.adapters.updated), version)
            return
        if self.vllm is not None:
            await self.vllm.sync(merged_state_dict(self.policy), self.policy, version)
            return
        if self._backend is None:
            raise RuntimeError("the backend is not started; call `await loop.start(store)` first")
        if self.trained is not None:  # only the policies this update changed get the new version
            for name in self.adapters.updated if self.adapters is not None else []:
                await asyncio.to_thread(self._backend.load_adapter, name, self.policy, version=version)
            if self._full_backends is not None:
                await self._full_backends.sync(self.trained.updated, version)
            return
        await asyncio.to_thread(self._backend.load_state_dict, self.served_weights(), version)

    def policy_versions(self) -> dict[str, int]:
        """Per policy, the version vLLM serves it with (vLLM reports none; `LocalBackend` reports its own)."""
        return {} if self.vllm is None else self.vllm.policy_versions()

    def iteration_metrics(self) -> dict[str, float]:
        """Backend admission groups and their mean size, decode steps and their mean rows, generation time (wall and
        the generation thread's CPU) since the previous call; with vLLM, the last sync's timings and probe
        difference."""
        if self.vllm is not None:
            return self.vllm.metrics()
        if self._backend is None:
            return {}
        backends = [self._backend, *(self._full_backends.backends.values() if self._full_backends else [])]
        every = [b.stats for b in backends]
        now = (
            sum(s.batches for s in every),
            sum(s.requests for s in every),
            sum(s.busy_seconds for s in every),
            sum(s.steps for s in every),
            sum(s.row_steps for s in every),
            sum(s.cpu_seconds for s in every),
            sum(s.tokens for s in every),
        )
        batches, requests, busy, steps, row_steps, cpu, tokens = (a - b for a, b in zip(now, self._seen, strict=True))
        self._seen = now
        return {
            "backend_batches": float(batches),
            "backend_mean_batch": requests / max(batches, 1),
            "backend_steps": float(steps),
            "backend_mean_rows": row_steps / max(steps, 1),
            "time_generating": busy,
            "cpu_generating": cpu,
            "tokens_generated": float(tokens),
            # generated tokens per second of the backend's prefill + decode (what generation throughput is)
            "tokens_per_s": tokens / busy if busy > 0 else 0.0,
        }

    def save_state(self, directory: Path) -> None:
        """A plain ``save_pretrained`` folder (LoRA merged; ``adapter/`` too for LoRA) plus the optimizer state.

        With policies: every adapter as ``adapters/<policy>/`` (``save_pretrained``) with every optimizer's state,
        every full-weight policy as ``policies/<policy>/`` (``save_pretrained`` and ``optimizer.pt``),
        and the tokenizer. The best checkpoint inside it (``best/``) is kept."""
        if self.trained is not None:
            self.trained.save(directory)
            self.tokenizer.save_pretrained(str(directory))
            return
        state = {"optimizer": self.optimizer.state_dict()}
        save_checkpoint(self.policy, self.tokenizer, directory, state, keep=(BEST_CHECKPOINT,))

    def load_state(self, directory: Path) -> None:
        """Load the weights (or LoRA adapter) and optimizer state `save_state` wrote (with policies: all of them)."""
        if self.trained is not None:
            self.trained.load(directory, self.config.device)
            return
        if is_lora(self.policy):
            load_adapter_weights(self.policy, directory)
        else:
            saved: Any = load_model(directory, device=self.config.device).model
            self.policy.load_state_dict(saved.state_dict())
        state = load_trainer_state(directory, self.config.device)
        if state is None:
            raise FileNotFoundError(f"{directory} has no trainer state: not a checkpoint written by TorchEngine")
        self.optimizer.load_state_dict(state["optimizer"])


class TorchTrainer(RLLoop[TorchEngine]):
    """The `RLLoop` of a `TorchEngine`, both built from one `TorchTrainerConfig`.

    Everything loop-side (`run`, `train_iteration`, `evaluate`, `start`, `stop`, `proxy`, `history`, `iteration`,
    `model_version`, checkpoints) is `RLLoop`'s own; everything model-side is on ``trainer.engine`` (``policy``,
    ``tokenizer``, ``update``, ``sync_weights``...). With ``config.resume`` the latest checkpoint in
    ``config.output_dir`` is loaded here, so ``iteration`` and the weights are restored before `start`.

    Args:
        config: Validated settings.
        on_iteration: Called after every iteration with its report (progress bars, early stopping).
    """

    def __init__(
        self, config: TorchTrainerConfig, on_iteration: Callable[[IterationReport], None] | None = None
    ) -> None:
        super().__init__(config.loop_config(), TorchEngine(config), on_iteration=on_iteration)
        if config.resume:
            self.restore()
