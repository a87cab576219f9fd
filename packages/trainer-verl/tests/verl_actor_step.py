"""One real verl actor update on a tiny local Llama, fed by our `to_data_proto`; prints one JSON line.

Run in a FRESH process (torch.distributed and verl's platform are process-global):

    python packages/trainer-verl/tests/verl_actor_step.py --device cpu   # registers the CPU platform first
    python packages/trainer-verl/tests/verl_actor_step.py --device cuda  # one GPU, no Ray, no vLLM

No network: the model (random init) and a word-level tokenizer are written to a temporary directory.
Used by test_verl_actor_update.py, test_verl_gpu.py and scripts/gpu_smoke.sh.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

VOCAB = 64


def build_tiny_model(path: Path, *, hidden: int, layers: int, seed: int = 0) -> None:
    """Write a random tiny LlamaForCausalLM and a matching word-level tokenizer to ``path``."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=1,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    vocab = {"<pad>": 0, "<eos>": 1, **{f"t{i}": i for i in range(2, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()  # pyright: ignore[reportAttributeAccessIssue]
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>").save_pretrained(path)


def build_batch(n_groups: int, n_per_group: int, prompt_len: int, response_len: int, seed: int = 1) -> Any:
    """A TrainingBatch with ragged lengths, an observation span per sample and GRPO-like advantages."""
    from agentlightning import TrainingBatch, TrainingSample

    rng = random.Random(seed)
    samples = []
    for g in range(n_groups):
        for k in range(n_per_group):
            p = prompt_len - rng.randint(0, prompt_len // 2)
            r = response_len - rng.randint(0, response_len // 2)
            mask = [1] * r
            if r >= 6:  # a tool observation in the middle (trajectory mode)
                mask[r // 2 : r // 2 + 2] = [0, 0]
            credit = float(k % 2)
            samples.append(
                TrainingSample(
                    prompt_token_ids=[rng.randint(2, VOCAB - 1) for _ in range(p)],
                    response_token_ids=[rng.randint(2, VOCAB - 1) for _ in range(r)],
                    response_mask=mask,
                    response_logprobs=[0.0] * r,  # replaced by the policy's own log-probs below
                    credit=credit,
                    advantage=1.0 if credit else -0.5,
                    group_id=f"task-{g}",
                    rollout_id=f"ro-{g}-{k}",
                    attempt_id=f"at-{g}-{k}",
                    step_index=0,
                )
            )
    return TrainingBatch(samples=samples)


def hf_response_logprobs(model_dir: Path, data: Any, device: str) -> Any:
    """Log-probs of each response token under the saved model, computed with plain transformers (reference)."""
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(model_dir, attn_implementation="eager", dtype=torch.float32).to(device)
    model.eval()
    ids = data.batch["input_ids"].to(device)
    attn = data.batch["attention_mask"].to(device)
    pos = data.batch["position_ids"].to(device)
    resp_len = data.batch["responses"].shape[1]
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits.float()
    logp = torch.log_softmax(logits[:, -resp_len - 1 : -1], dim=-1)
    out = torch.gather(logp, -1, data.batch["responses"].to(device).unsqueeze(-1)).squeeze(-1)
    return (out * data.batch["response_mask"].to(device).float()).cpu()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--per-group", type=int, default=2)
    parser.add_argument("--prompt-len", type=int, default=8)
    parser.add_argument("--response-len", type=int, default=8)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    if args.device == "cpu":
        from agentlightning_verl._cpu_rehearsal import install_cpu_platform

        install_cpu_platform()
    elif not torch.cuda.is_available():
        print(json.dumps({"error": "CUDA requested but torch.cuda.is_available() is False"}))
        return 2

    from agentlightning_verl import LocalVerlActor, VerlTrainerConfig, to_data_proto

    workdir = Path(tempfile.mkdtemp(prefix="agl-verl-"))
    build_tiny_model(workdir, hidden=args.hidden, layers=args.layers)
    cfg = VerlTrainerConfig(
        model_path=str(workdir),
        algorithm="grpo",
        n_rollouts_per_task=args.per_group,
        tasks_per_step=args.groups,
        ppo_mini_batch_size=args.groups,
        micro_batch_size_per_gpu=max(1, args.groups * args.per_group // 2),
        lr=args.lr,
        max_prompt_length=args.prompt_len,
        max_response_length=args.response_len,
        dtype="float32",
        attn_implementation="eager",
        gradient_checkpointing=False,
        overrides={
            "actor_rollout_ref.actor.use_torch_compile": False,
            "actor_rollout_ref.actor.fsdp_config.use_torch_compile": False,
            "actor_rollout_ref.actor.optim.weight_decay": 0.0,
        },
    )
    actor = LocalVerlActor(cfg.to_verl_config())
    batch = build_batch(args.groups, args.per_group, args.prompt_len, args.response_len)
    data = to_data_proto(
        batch, max_prompt_length=args.prompt_len, max_response_length=args.response_len, pad_token_id=0
    )
    reference = hf_response_logprobs(workdir, data, args.device)
    verl_before = actor.compute_log_prob(data)
    # On-policy: the PPO anchor is the current policy, so ratio == 1 and pg_loss == -token-mean(advantages).
    data.batch["old_log_probs"] = verl_before.clone()
    mask = data.batch["response_mask"].float()
    adv = data.batch["advantages"]
    objective_before = float((adv * verl_before * mask).sum())
    tokens = int(data.batch["attention_mask"].sum())
    step_times: list[float] = []
    metrics: dict[str, float] = {}
    for _ in range(args.steps):
        if args.device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        metrics = actor.update(data)
        if args.device == "cuda":
            torch.cuda.synchronize()
        step_times.append(time.perf_counter() - start)
    verl_after = actor.compute_log_prob(data)
    # The whole VerlEngine.update path (old log-probs by the actor, verl's GRPO advantages by uid, actor update).
    from agentlightning_verl import LocalVerlRuntime, VerlEngine

    algorithm_metrics = VerlEngine(cfg, runtime=LocalVerlRuntime(actor)).update(batch)
    result = {
        "device": args.device,
        "n_samples": len(data),
        "tokens_per_step": tokens,
        "step_s": step_times,
        "tokens_per_s": tokens / min(step_times),
        "metrics": metrics,
        "expected_pg_loss": float(-(adv * mask).sum() / mask.sum()),
        "max_abs_logprob_diff_vs_hf": float((reference - verl_before).abs().max()),
        "objective_before": objective_before,
        "objective_after": float((adv * verl_after * mask).sum()),
        "algorithm_update_metrics": algorithm_metrics,
        "logprob_change_on_padding": float((verl_after * (1 - mask)).abs().max()),
    }
    print("RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
