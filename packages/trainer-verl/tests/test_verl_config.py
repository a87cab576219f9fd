"""VerlTrainerConfig validation and its expansion into verl's own config dataclasses; import hygiene."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError
from verl.utils.config import omega_conf_to_dataclass

import agentlightning as agl
from agentlightning_verl import RayVerlRuntime, VerlEngine, VerlTrainer, VerlTrainerConfig, named_tensors_checksum


def test_expands_into_verl_dataclasses() -> None:
    cfg = VerlTrainerConfig(
        model_path="Qwen/Qwen2.5-0.5B-Instruct",
        algorithm="ppo",
        n_rollouts_per_task=4,
        tasks_per_step=16,
        ppo_mini_batch_size=8,
        lr=2e-6,
        lora_rank=32,
        rollout_tensor_parallel_size=2,
        n_gpus_per_node=8,
        nnodes=2,
        overrides={"trainer.save_freq": 10},
    )
    v = cfg.to_verl_config()
    algo = omega_conf_to_dataclass(v.algorithm)
    actor = omega_conf_to_dataclass(v.actor_rollout_ref.actor)
    rollout = omega_conf_to_dataclass(v.actor_rollout_ref.rollout)
    assert algo.adv_estimator == "gae" and v.critic.enable is True
    assert actor.optim.lr == 2e-6 and actor.ppo_mini_batch_size == 8
    assert rollout.n == 4 and rollout.tensor_model_parallel_size == 2 and rollout.name == "vllm"
    assert rollout.prompt_length == 2048  # resolved from data.max_prompt_length
    assert v.actor_rollout_ref.model.lora_rank == 32
    assert (v.trainer.nnodes, v.trainer.n_gpus_per_node, v.trainer.save_freq) == (2, 8, 10)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"algorithm": "grpo", "n_rollouts_per_task": 1}, "needs n_rollouts_per_task >= 2"),
        ({"tasks_per_step": 10, "ppo_mini_batch_size": 4}, "multiple of ppo_mini_batch_size"),
        (
            {"n_gpus_per_node": 3, "tasks_per_step": 4, "ppo_mini_batch_size": 4, "n_rollouts_per_task": 2},
            "divisible by the number of GPUs",
        ),
        ({"n_gpus_per_node": 2, "rollout_tensor_parallel_size": 4}, "must divide the number of GPUs"),
        ({"use_remove_padding": True}, "flash_attention_2"),
        ({"algorithm": "ppo", "advantages_from": "agentlightning"}, "use advantages_from='verl'"),
        ({"lr": 0}, "greater than 0"),
        ({"algorithm": "dpo"}, "algorithm"),
        ({"unknown": 1}, "Extra inputs"),
    ],
)
def test_bad_settings_are_refused(kwargs, message) -> None:
    with pytest.raises(ValidationError, match=message):
        VerlTrainerConfig(model_path="m", **kwargs)


def test_reinforce_pp_is_one_name_and_verls_spelling_an_alias() -> None:
    for name in ("reinforce_pp", "reinforce_plus_plus"):
        cfg = VerlTrainerConfig(model_path="unused", algorithm=name)  # pyright: ignore[reportArgumentType]
        assert cfg.algorithm == "reinforce_pp"
        assert cfg.to_verl_config().algorithm.adv_estimator == "reinforce_plus_plus"  # verl's own name, for verl
        assert cfg.loop_config(output_dir="unused").estimator == "reinforce_pp"
    with pytest.raises(ValidationError, match="n_rollouts_per_task >= 2"):
        VerlTrainerConfig(model_path="unused", algorithm="rloo", n_rollouts_per_task=1)


def test_unknown_override_key_is_refused() -> None:
    with pytest.raises(KeyError, match=r"trainer\.no_such_key"):
        VerlTrainerConfig(model_path="m", overrides={"trainer.no_such_key": 1}).to_verl_config()


def test_dtype_attention_and_padding_reach_actor_and_critic() -> None:
    cfg = VerlTrainerConfig(model_path="m", algorithm="ppo", dtype="float32", attn_implementation="eager")
    v = cfg.to_verl_config()
    assert v.actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype == "fp32"
    assert v.critic.fsdp.mixed_precision.param_dtype == "fp32"
    # verl's critic defaults to packed sequences (needs flash-attn); ours follows the actor's settings
    assert v.critic.model.use_remove_padding is False
    assert v.critic.model.override_config.attn_implementation == "eager"
    assert v.critic.strategy == "fsdp2" and v.critic.fsdp.strategy == "fsdp2"
    engine = omega_conf_to_dataclass(v.critic.fsdp)  # verl's FSDPEngineConfig accepts what we set
    assert engine.mixed_precision["param_dtype"] == "fp32" and engine.strategy == "fsdp2"
    bf16 = VerlTrainerConfig(model_path="m").to_verl_config()
    assert bf16.critic.fsdp.mixed_precision.param_dtype == "bf16"


def test_cpu_backend_without_vllm_names_the_cpu_build_and_the_command() -> None:
    try:
        import vllm  # noqa: F401

        pytest.skip("vLLM is installed here")
    except ImportError:
        pass
    with pytest.raises(ImportError, match=r"vLLM's CPU build with: python3 scripts/dev.py verl-vllm"):
        RayVerlRuntime(VerlTrainerConfig(model_path="m"), device="cpu")


def test_vllm_path_without_vllm_names_the_module_and_the_install_command() -> None:
    try:
        import vllm  # noqa: F401

        pytest.skip("vLLM is installed here")
    except ImportError:
        pass
    engine = VerlEngine(VerlTrainerConfig(model_path="m"))
    with pytest.raises(ImportError, match=r"needs vllm; install it with: pip install 'agentlightning-verl\[gpu\]'"):
        _ = engine.runtime


def test_a_multi_policy_loop_is_refused_in_one_line(tmp_path) -> None:
    cfg = VerlTrainerConfig(model_path="m")
    loop = cfg.loop_config(output_dir=tmp_path, policies=agl.PolicyMap(agents={"writer": "writer"}))
    with pytest.raises(ValueError, match="VerlEngine cannot train several policies: verl trains one actor model"):
        agl.RLLoop(loop, VerlEngine(cfg))


def test_loop_config_takes_the_loop_settings_from_the_verl_config(tmp_path) -> None:
    cfg = VerlTrainerConfig(
        model_path="/models/m",
        algorithm="ppo",
        n_rollouts_per_task=4,
        tasks_per_step=6,
        ppo_mini_batch_size=3,
        total_steps=7,
        temperature=0.7,
        credit_strategy="discounted",
        rollout_timeout_s=30.0,
    )
    loop = cfg.loop_config(output_dir=tmp_path, checkpoint_every=2, resume=True)
    assert (loop.iterations, loop.tasks_per_iteration, loop.samples_per_task) == (7, 6, 4)
    assert (loop.temperature, loop.credit, loop.rollout_timeout_s) == (0.7, "discounted", 30.0)
    assert loop.estimator == "passthrough"  # PPO: verl's GAE sets the advantages from the critic
    assert loop.model_name == "/models/m"  # the name vLLM serves the model under
    assert (loop.output_dir, loop.checkpoint_every, loop.resume) == (tmp_path, 2, True)
    assert VerlTrainerConfig(model_path="m", algorithm="rloo").loop_config().estimator == "rloo"
    trainer = VerlTrainer(cfg, loop=loop)
    assert isinstance(trainer, agl.RLLoop) and isinstance(trainer.engine, VerlEngine) and trainer.config is loop
    with pytest.raises(ValueError, match=r"\['iterations'\] come from VerlTrainerConfig"):
        cfg.loop_config(iterations=3)
    # colocated vLLM sleeps while verl updates: no one-step off-policy loop
    with pytest.raises(ValueError, match="max_staleness=1 needs an engine that serves while it updates; VerlEngine"):
        VerlTrainer(cfg, loop=cfg.loop_config(max_staleness=1))


def test_the_old_name_of_verl_trainer_is_gone() -> None:
    import agentlightning_verl

    with pytest.raises(AttributeError, match="has no attribute 'VerlAlgorithm'"):
        _ = agentlightning_verl.VerlAlgorithm  # pyright: ignore[reportAttributeAccessIssue]


def test_checksum_sees_every_bit_name_and_dtype() -> None:
    import torch

    weights = {"a.weight": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b.bias": torch.ones(3)}
    base = named_tensors_checksum(weights.items())
    assert named_tensors_checksum(reversed(list(weights.items()))) == base  # order-free
    flipped = dict(
        weights, **{"b.bias": torch.tensor([1.0, 1.0, torch.nextafter(torch.tensor(1.0), torch.tensor(2.0))])}
    )
    assert named_tensors_checksum(flipped.items()) != base
    assert named_tensors_checksum({"a.weight": weights["a.weight"], "c.bias": weights["b.bias"]}.items()) != base
    assert named_tensors_checksum({**weights, "b.bias": weights["b.bias"].double()}.items()) != base


def test_importing_the_package_imports_neither_verl_nor_torch() -> None:
    code = "import sys, agentlightning_verl; print(sorted(m for m in ('verl', 'torch', 'ray') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def test_a_short_batch_gets_micro_batches_that_split_it_evenly() -> None:
    from agentlightning_verl._ray_runtime import fitting_micro_batch

    # verl asserts rows % micro_batch_size_per_gpu == 0: a step whose late rollouts were cancelled has fewer rows
    assert fitting_micro_batch(4, 8) == 4
    assert fitting_micro_batch(4, 2) == 2
    assert fitting_micro_batch(4, 6) == 3
    assert fitting_micro_batch(4, 7) == 1
    assert fitting_micro_batch(4, 0) == 1
