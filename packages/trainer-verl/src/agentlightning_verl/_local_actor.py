"""verl's actor (``TrainingWorker`` + FSDP engine + ``ppo_loss``) in THIS process, without Ray or vLLM.

verl 0.9.1 no longer has ``verl.workers.actor.dp_actor.DataParallelPPOActor``; its actor is
``verl.workers.engine_workers.TrainingWorker`` driving a training engine (``FSDPEngineWithLMHead`` for
``strategy=fsdp|fsdp2``) with a loss function (``verl.workers.utils.losses.ppo_loss``). ``RayPPOTrainer`` runs it inside
Ray actors; the worker's methods are plain methods underneath the ``@register`` dispatch decorators, so one process can
build and call it directly. `LocalVerlActor` does that and prepares the batch exactly like
``RayPPOTrainer._update_actor`` / ``_compute_old_log_prob`` (padding -> no-padding tensordict, the same meta keys).

Used by the single-GPU smoke test, by the CPU test (after `install_cpu_platform`), and by anyone who wants one verl
update step on one device without a Ray cluster.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentlightning_verl._serving import ExportedWeightsServing, NoServing, VLLMReplicaServing

if TYPE_CHECKING:
    import torch
    from omegaconf import DictConfig
    from verl import DataProto

__all__ = ["LocalVerlActor", "LocalVerlRuntime"]

logger = logging.getLogger(__name__)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _init_single_process_group(device_name: str) -> None:
    """A world of one; verl's own init would ask for ``cpu:gloo,<device>:<backend>``, invalid when device is cpu."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    backend = "gloo" if device_name == "cpu" else f"cpu:gloo,{device_name}:nccl"
    dist.init_process_group(
        backend=backend,
        rank=0,
        world_size=1,
        init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
    )


def _scalar_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in metrics.items():
        values = value if isinstance(value, list) else [value]
        numbers = [float(v) for v in values if isinstance(v, int | float) or hasattr(v, "__float__")]
        if numbers:
            out[key] = sum(numbers) / len(numbers)
    return out


class LocalVerlActor:
    """One verl actor (policy) in this process: ``update(data)`` is one verl PPO update, as in ``RayPPOTrainer``.

    Args:
        verl_config: verl's full trainer config (`VerlTrainerConfig.to_verl_config`), or any config with
            ``actor_rollout_ref.model`` and ``actor_rollout_ref.actor`` sections.

    Raises:
        ImportError: verl or torch is missing (with the install command).
    """

    def __init__(self, verl_config: DictConfig) -> None:
        try:
            from functools import partial

            from verl.utils.config import omega_conf_to_dataclass
            from verl.utils.device import get_device_name
            from verl.workers.config import TrainingWorkerConfig
            from verl.workers.engine_workers import TrainingWorker
            from verl.workers.utils.losses import ppo_loss
        except ImportError as exc:  # pragma: no cover - only without verl
            raise ImportError(f"LocalVerlActor needs verl: pip install 'agentlightning-verl' ({exc})") from exc

        self.config = verl_config
        arr = verl_config.actor_rollout_ref
        self.device_name: str = get_device_name()
        _init_single_process_group(self.device_name)

        model_config = omega_conf_to_dataclass(arr.model)
        actor_config = omega_conf_to_dataclass(arr.actor)
        actor_config.model_config = model_config
        self.actor_config = actor_config
        self.tokenizer = model_config.tokenizer
        worker_config = TrainingWorkerConfig(
            model_type="language_model",
            model_config=model_config,
            engine_config=actor_config.engine,
            optimizer_config=actor_config.optim,
            checkpoint_config=actor_config.checkpoint,
        )
        engine = worker_config.engine_config
        # The same assignments ActorRolloutRefWorker.init_model makes before building the worker.
        engine.use_dynamic_bsz = bool(arr.actor.use_dynamic_bsz)
        engine.max_token_len_per_gpu = arr.actor.ppo_max_token_len_per_gpu
        engine.micro_batch_size_per_gpu = arr.actor.ppo_micro_batch_size_per_gpu
        engine.infer_max_token_len_per_gpu = arr.rollout.get("log_prob_max_token_len_per_gpu", 16384)
        engine.infer_micro_batch_size_per_gpu = (
            arr.rollout.get("log_prob_micro_batch_size_per_gpu") or arr.actor.ppo_micro_batch_size_per_gpu
        )
        engine.use_remove_padding = bool(arr.model.get("use_remove_padding", False))
        self.worker: Any = TrainingWorker(config=worker_config)
        self.worker.reset()
        self.worker.set_loss_fn(partial(ppo_loss, config=actor_config))
        self.steps = 0
        logger.info("LocalVerlActor ready on %s (model %s)", self.device_name, arr.model.path)

    @property
    def module(self) -> torch.nn.Module:
        """The (FSDP-wrapped) policy module, e.g. to read weights in tests or export them."""
        return self.worker.engine.module

    def _prepare(self, data: DataProto) -> Any:
        from verl.workers.utils.padding import left_right_2_no_padding

        data.meta_info.setdefault("temperature", float(self.config.actor_rollout_ref.rollout.temperature))
        return left_right_2_no_padding(data.to_tensordict())

    def compute_log_prob(self, data: DataProto) -> torch.Tensor:
        """Current policy log-probs of ``data``'s responses, ``(B, R)`` and 0 on padding (as ``_compute_old_log_prob``).

        Args:
            data: A `DataProto` from `to_data_proto` (needs ``prompts``, ``responses``, masks and position ids).
        """
        return self.compute_log_prob_and_entropy(data)[0]

    def compute_log_prob_and_entropy(self, data: DataProto) -> tuple[torch.Tensor, torch.Tensor]:
        """`compute_log_prob` and the policy's entropy at each response position (both ``(B, R)``, 0 on padding)."""
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import no_padding_2_padding

        td = self._prepare(data)
        tu.assign_non_tensor(td, calculate_entropy=True, compute_loss=False)
        output = self.worker.infer_batch(td)
        mask = data.batch["response_mask"].float()
        log_probs = no_padding_2_padding(tu.get(output, "log_probs"), td).float().cpu() * mask
        entropy = no_padding_2_padding(tu.get(output, "entropy"), td).float().cpu() * mask
        return log_probs, entropy

    def update(self, data: DataProto) -> dict[str, float]:
        """One PPO/GRPO policy update on ``data`` (needs ``old_log_probs`` and ``advantages``); returns metrics.

        Mini-batch size, epochs and shuffling come from ``actor_rollout_ref.actor`` exactly as in
        ``RayPPOTrainer._update_actor`` (mini-batch = ``ppo_mini_batch_size * rollout.n`` samples, capped at the
        batch size so a small batch still makes one step).

        Raises:
            ValueError: ``data`` lacks ``old_log_probs`` or ``advantages``.
        """
        from verl.utils import tensordict_utils as tu

        # TensorDict refuses `in` membership tests, hence .keys()
        missing = [k for k in ("old_log_probs", "advantages", "response_mask") if k not in data.batch.keys()]  # noqa: SIM118
        if missing:
            raise ValueError(f"DataProto lacks {missing}; build it with to_data_proto(..., include_old_log_probs=True)")
        actor = self.config.actor_rollout_ref.actor
        mini = int(actor.ppo_mini_batch_size) * int(self.config.actor_rollout_ref.rollout.n)
        mini = min(mini, len(data))
        td = self._prepare(data)
        calculate_entropy = bool(actor.get("calculate_entropy", False)) or float(actor.entropy_coeff) != 0.0
        tu.assign_non_tensor(
            td,
            calculate_entropy=calculate_entropy,
            distillation_use_topk=False,
            distillation_only=False,
            global_batch_size=mini,
            mini_batch_size=mini,
            epochs=int(actor.ppo_epochs),
            seed=int(actor.data_loader_seed),
            dataloader_kwargs={"shuffle": bool(actor.shuffle)},
            compute_loss=True,
        )
        output = self.worker.train_mini_batch(td)
        self.steps += 1
        return _scalar_metrics(tu.get(output, "metrics"))


class LocalVerlRuntime:
    """`VerlEngine` runtime on one `LocalVerlActor`: actor-only algorithms (GRPO, RLOO, REINFORCE++), no serving.

    It trains but serves nothing: there is no inference server to sync weights into, so its `serving` is a
    `NoServing` (no address; a sync only records the version). Use it to run `VerlEngine.update` on one device (tests,
    debugging, offline data); `RayVerlRuntime` serves rollouts.
    """

    def __init__(self, actor: LocalVerlActor) -> None:
        self.actor = actor
        nothing = NoServing()
        self.serving: ExportedWeightsServing | VLLMReplicaServing | NoServing = nothing
        """Nothing serves (`NoServing`)."""
        self.synced_versions: list[int] = nothing.synced_versions
        """Every version the engine synced (the serving's record)."""

    def compute_log_prob(self, data: DataProto) -> tuple[torch.Tensor, torch.Tensor]:
        """See `LocalVerlActor.compute_log_prob_and_entropy`."""
        return self.actor.compute_log_prob_and_entropy(data)

    def compute_values(self, data: DataProto) -> torch.Tensor:
        """No critic here: PPO needs `RayVerlRuntime`."""
        raise NotImplementedError("LocalVerlRuntime has no critic; use algorithm grpo, rloo or reinforce_pp")

    def update_critic(self, data: DataProto) -> dict[str, float]:
        """See `compute_values`."""
        raise NotImplementedError("LocalVerlRuntime has no critic; use algorithm grpo, rloo or reinforce_pp")

    def update_actor(self, data: DataProto) -> dict[str, float]:
        """See `LocalVerlActor.update`."""
        return {k if k.startswith("actor/") else f"actor/{k}": v for k, v in self.actor.update(data).items()}

    def save_checkpoint(self, directory: Path, step: int) -> None:
        """verl's checkpoint of the actor (model, optimizer, scheduler) into ``directory/actor``."""
        self.actor.worker.save_checkpoint(str(directory / "actor"), None, step, None)

    def load_checkpoint(self, directory: Path) -> None:
        """Restore what `save_checkpoint` wrote.

        Raises:
            FileNotFoundError: ``directory`` holds no actor checkpoint.
        """
        if not (directory / "actor").is_dir():
            raise FileNotFoundError(f"no verl actor checkpoint in {directory}")
        self.actor.worker.load_checkpoint(str(directory / "actor"), None, False)
