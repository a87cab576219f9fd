"""`VerlTrainer.run` end to end on a local Ray cluster: verl worker groups as Ray actors, rollouts served by the
embedded torch backend behind the LLM proxy, runners with a plain OpenAI agent. Prints ``RESULT {json}``.

Run in a FRESH process (Ray, torch.distributed and verl's platform are process-global):

    python packages/trainer-verl/tests/verl_ray_loop.py --device cpu
    python packages/trainer-verl/tests/verl_ray_loop.py --device cuda   # real vLLM on one GPU (scripts/gpu_smoke.sh)

One Ray worker process holds verl's actor (``ActorRolloutRefWorker``, role ``actor``) and critic
(``TrainingWorker``, value model), both FSDP2 on the CPU platform. Phases, each with its own store, proxy and runners:

1. GRPO, 2 steps.
2. PPO with the critic, 1 step, checkpoint (verl's actor + critic checkpoints and our step/version).
3. The workers are rebuilt from the model folder (weights back to the initial ones, as in a new process), then a
   new `VerlTrainer` resumes from that checkpoint into step 2.

After every weight sync it records the actor's checksum (verl's engine export) and the served model's checksum;
it records the model version of every LLM call per step. No network: model and tokenizer are made here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

WORDS = 56  # t4 .. t59
SPECIALS = ["<|user|>", "<|assistant|>", "<|system|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<|' + m['role'] + '|> ' + m['content'] + ' ' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
GOOD = {f"t{i}" for i in range(4, 24)}  # the agent's reward: share of answer words in this set


def build_model_folder(path: Path, *, hidden: int = 32, layers: int = 2, seed: int = 0) -> None:
    """A random tiny Llama + a word-level HF tokenizer (built with `tokenizers`) with a chat template."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, "<bos>": 3, **{f"t{i}": i for i in range(4, 4 + WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()  # pyright: ignore[reportAttributeAccessIssue]
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="<eos>",
        unk_token="<unk>",
        bos_token="<bos>",
        additional_special_tokens=SPECIALS,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=3,
    )
    LlamaForCausalLM(config).save_pretrained(path)


class HFTokenizer:
    """The tokenizer interface `LocalBackend` uses, over a Hugging Face tokenizer (smallest loader for this test)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.pad_token_id = int(tokenizer.pad_token_id)
        self.eos_token_id = int(tokenizer.eos_token_id)
        self.bos_token_id = int(tokenizer.bos_token_id)
        self.vocab_size = len(tokenizer)

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        ids = list(self.tok.encode(text, add_special_tokens=False))
        return ([self.bos_token_id] if add_bos else []) + ids + ([self.eos_token_id] if add_eos else [])

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return str(self.tok.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        return list(self.tok.convert_ids_to_tokens(list(ids)))


class HFChatTemplate:
    """`ChatTemplate` over the tokenizer's own Jinja chat template; responses are plain content."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> list[int]:
        out = self.tok.apply_chat_template(
            [dict(m) for m in messages], add_generation_prompt=add_generation_prompt, tokenize=True
        )
        return list(out["input_ids"] if isinstance(out, Mapping) else out)

    def parse_response(self, token_ids: Sequence[int], *, tools: Sequence[Mapping[str, Any]] | None = None) -> Any:
        from agentlightning_torch import ParsedResponse

        return ParsedResponse(content=self.tok.decode(list(token_ids), skip_special_tokens=True))


class ServedModel:
    """`agentlightning_verl.LocalServer` over the torch backend and its HTTP server."""

    def __init__(self, server: Any, backend: Any) -> None:
        self.server = server
        self.backend = backend

    @property
    def base_url(self) -> str:
        return str(self.server.base_url)

    @property
    def running(self) -> int:
        return int(self.backend.running)

    def abort(self) -> None:
        self.backend.abort()

    def load_state_dict(self, state_dict: Mapping[str, Any], version: int | None = None) -> int:
        return int(self.backend.load_state_dict(state_dict, version))


def make_agent() -> Any:
    import openai

    import agentlightning as agl

    @agl.rollout
    async def word_agent(task: dict[str, Any], resources: agl.Resources) -> float:
        """An ordinary OpenAI-client agent: one chat call; reward = share of 'good' words in the answer."""
        assert resources.llm is not None
        client = openai.AsyncOpenAI(base_url=agl.llm_base_url(), api_key=resources.llm.api_key, max_retries=5)
        reply = await client.chat.completions.create(
            model=resources.llm.model,
            messages=[{"role": "user", "content": task["prompt"]}],
            max_tokens=6,
            temperature=1.0,
        )
        words = (reply.choices[0].message.content or "").split()
        return sum(w in GOOD for w in words) / max(len(words), 1)

    return word_agent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)

    import logging

    import torch

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("agentlightning_verl").setLevel(logging.INFO)
    torch.set_num_threads(1)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import ray

    from agentlightning_verl import RayVerlRuntime, VerlTrainerConfig, cpu_ray_init_kwargs
    from agentlightning_verl._cpu_rehearsal import install_cpu_platform

    cuda = args.device == "cuda"
    if not cuda:
        install_cpu_platform()
    started = time.monotonic()
    if cuda:
        ray.init(include_dashboard=False)
    else:
        ray.init(**cpu_ray_init_kwargs(num_cpus=2, object_store_mb=128))
    timings = {"ray_init_s": time.monotonic() - started}
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="agl-verl-ray-"))
    model_dir = workdir / "model"
    # on CUDA: head_dim 64, a size vLLM's attention kernels take
    build_model_folder(model_dir, hidden=256 if cuda else 32)

    overrides: dict[str, Any] = {
        "actor_rollout_ref.actor.use_torch_compile": False,
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile": False,
        "critic.fsdp.use_torch_compile": False,
        "actor_rollout_ref.actor.optim.weight_decay": 0.0,
    }
    if cuda:
        overrides["actor_rollout_ref.rollout.enforce_eager"] = True  # no CUDA-graph capture for a two-step check
    common: dict[str, Any] = {
        "model_path": str(model_dir),
        "n_rollouts_per_task": 2,
        "tasks_per_step": 2,
        "ppo_mini_batch_size": 2,
        "micro_batch_size_per_gpu": 4,
        "lr": 1e-2,
        "critic_lr": 1e-2,
        "max_prompt_length": 32,
        "max_response_length": 8,
        "dtype": "bfloat16" if cuda else "float32",
        "attn_implementation": "sdpa" if cuda else "eager",
        "gradient_checkpointing": False,
        "gpu_memory_utilization": 0.3,
        "total_steps": 2,
        "rollout_timeout_s": 300.0,
        "overrides": overrides,
    }
    grpo_cfg = VerlTrainerConfig(algorithm="grpo", **common)
    ppo_cfg = VerlTrainerConfig(algorithm="ppo", **common)

    from agentlightning_verl import named_tensors_checksum

    server: Any = None
    local: Any = None
    served: Any = None
    initial = None
    if not cuda:
        from transformers import AutoTokenizer, LlamaForCausalLM

        from agentlightning_torch import LocalBackend, serve_backend

        hf_tokenizer = AutoTokenizer.from_pretrained(model_dir)
        local = LocalBackend(
            LlamaForCausalLM.from_pretrained(model_dir),
            hf_tokenizer,  # the general HF path: the tokenizer's own chat template renders the prompts
            model_name="tiny",
            num_threads=1,
            batch_wait_ms=2.0,
        )
        server = serve_backend(local)
        served = ServedModel(server, local)
        initial = named_tensors_checksum(local.model.state_dict().items())
    t = time.monotonic()
    runtime = RayVerlRuntime(ppo_cfg, device=args.device, local_server=served)
    timings["workers_s"] = time.monotonic() - t
    if initial is None:
        initial = runtime.actor_checksum()
    try:
        result = asyncio.run(_phases(runtime, local, grpo_cfg, ppo_cfg, workdir, timings))
    finally:
        if server is not None:
            server.stop()
        runtime.shutdown()
        ray.shutdown()
    result["initial_checksum"] = initial
    result["timings"] = timings
    print("RESULT " + json.dumps(result))
    return 0


async def _phases(
    runtime: Any, local: Any, grpo_cfg: Any, ppo_cfg: Any, workdir: Path, timings: dict[str, float]
) -> dict[str, Any]:
    from agentlightning import RLLoop
    from agentlightning_verl import VerlEngine, named_tensors_checksum

    class Observed(VerlEngine):
        """`VerlEngine` noting, after every sync, what the actor holds and what the server serves."""

        syncs: list[dict[str, Any]]

        def _observe(self, version: int) -> None:
            self.syncs.append(
                {
                    "version": version,
                    "actor": runtime.actor_checksum(),
                    "served": None if local is None else named_tensors_checksum(local.model.state_dict().items()),
                    "served_version": None if local is None else local.model_version,
                }
            )

        async def start_servers(self, model_version: int) -> list[str]:
            self.syncs = []
            addresses = await super().start_servers(model_version)
            self._observe(model_version)
            return addresses

        async def sync_weights(self, version: int) -> None:
            await super().sync_weights(version)
            self._observe(version)

    tasks = [{"prompt": "t5 t9 t11"}, {"prompt": "t30 t31"}, {"prompt": "t40 t7 t50 t51"}, {"prompt": "t12"}]
    out: dict[str, Any] = {}

    t = time.monotonic()
    grpo = RLLoop(grpo_cfg.loop_config(output_dir=workdir / "grpo"), Observed(grpo_cfg, runtime=runtime))
    out["grpo"] = await _run_phase(grpo, tasks)
    timings["grpo_s"] = time.monotonic() - t

    ppo_dir = workdir / "ppo"
    t = time.monotonic()
    runtime.reset()  # fresh actor and critic for PPO
    first_cfg = ppo_cfg.model_copy(update={"total_steps": 1})
    first = RLLoop(first_cfg.loop_config(output_dir=ppo_dir, checkpoint_every=1), Observed(first_cfg, runtime=runtime))
    from agentlightning import MemoryStore

    ppo_store = MemoryStore()
    out["ppo_first"] = await _run_phase(first, tasks, ppo_store)
    timings["ppo_first_s"] = time.monotonic() - t

    t = time.monotonic()
    runtime.reset()  # as a new process would: the initial weights, fresh optimizers
    out["after_reset_checksum"] = runtime.actor_checksum()
    resumed = RLLoop(ppo_cfg.loop_config(output_dir=ppo_dir, resume=True), Observed(ppo_cfg, runtime=runtime))
    out["ppo_resumed"] = await _run_phase(resumed, tasks, ppo_store)
    timings["ppo_resumed_s"] = time.monotonic() - t
    checkpoint = ppo_dir / "checkpoint"
    out["checkpoint_files"] = sorted(str(p.relative_to(checkpoint)) for p in checkpoint.rglob("*") if p.is_file())
    return out


async def _run_phase(loop: Any, tasks: list[dict[str, Any]], store: Any = None) -> dict[str, Any]:
    import agentlightning as agl
    from agentlightning.adapters import instrument_openai, uninstrument_openai

    store = store or agl.MemoryStore()
    instrument_openai()
    runner = agl.Runner(make_agent(), store=store, n_workers=4, worker_mode="async", poll_interval=0.02)
    runner_task = asyncio.create_task(runner.arun())
    try:
        await loop.run(store, tasks)  # the RLLoop: it starts the LLM proxy in front of the rollout servers
    finally:
        await loop.stop()
        runner.stop()
        await asyncio.wait_for(runner_task, 60)
        uninstrument_openai()
    versions: dict[str, list[int | None]] = {}
    for rollout in await store.query_rollouts():
        step = (rollout.group_id or "?").split("-")[0]  # the loop's groups: it<iteration>-<time>-t<task>
        calls = await store.query_llm_calls(rollout.rollout_id)
        versions.setdefault(step, []).extend(call.model_version for call in calls)
    history = [
        {**r.metrics, "iteration": r.iteration, "seconds": r.seconds, "rollouts": r.rollouts, "finished": r.finished}
        for r in loop.history
    ]
    return {
        "steps": loop.iteration,
        "model_version": loop.model_version,
        "history": history,
        "syncs": loop.engine.syncs,
        "call_versions": {k: sorted(set(v), key=lambda x: -1 if x is None else x) for k, v in versions.items()},
        "calls_per_step": {k: len(v) for k, v in versions.items()},
    }


if __name__ == "__main__":
    raise SystemExit(main())
