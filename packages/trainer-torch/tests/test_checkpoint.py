"""Checkpoints are plain save_pretrained folders; the trainer resumes weights, optimizer, iteration and version."""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

import pytest
import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast, Qwen2ForCausalLM

from agentlightning import TrainingBatch, TrainingSample
from agentlightning_torch import (
    LoRASettings,
    PPOConfig,
    SinglePolicy,
    TorchEngine,
    TorchTrainer,
    TorchTrainerConfig,
    load_trainer_state,
    make_optimizer,
    ppo_update,
    prepare_policy,
    save_checkpoint,
)
from agentlightning_torch.testing import tiny_qwen2

TEMPLATE = (
    "{% for m in messages %}{{ m.role }}:{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def char_tokenizer() -> PreTrainedTokenizerFast:
    specials = ["<pad>", "<eos>"]
    vocab = {token: i for i, token in enumerate([*specials, *string.ascii_lowercase, *":\n "])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=None))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([AddedToken(t, special=True) for t in specials])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>")
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def tiny_model(vocab: int, seed: int = 0) -> Qwen2ForCausalLM:
    """`tiny_qwen2` with the char tokenizer's pad/eos ids and untied embeddings, in eval mode."""
    config = {"max_position_embeddings": 64, "eos_token_id": 1, "pad_token_id": 0, "tie_word_embeddings": False}
    return tiny_qwen2(vocab, seed=seed, **config).eval()


@pytest.fixture
def model_folder(tmp_path: Path) -> Path:
    tokenizer = char_tokenizer()
    folder = tmp_path / "base"
    tiny_model(len(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def batch() -> TrainingBatch:
    def sample(response: list[int], advantage: float) -> TrainingSample:
        return TrainingSample(
            prompt_token_ids=[3, 4, 5, 6],
            response_token_ids=response,
            response_mask=[1] * len(response),
            credit=advantage,
            advantage=advantage,
            group_id="g",
            rollout_id="r",
            attempt_id="a",
            step_index=0,
        )

    return TrainingBatch(samples=[sample([7, 8, 1], 1.0), sample([9, 10, 1], -1.0)])


def logits(model: Any, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits


def test_checkpoint_is_a_folder_plain_transformers_loads_with_identical_logits(tmp_path: Path) -> None:
    tokenizer = char_tokenizer()
    model = tiny_model(len(tokenizer))
    config = PPOConfig(lr=1e-2)
    ppo_update(model, make_optimizer(model, config), batch(), config)  # trained weights, not the initial ones
    folder = save_checkpoint(model.eval(), tokenizer, tmp_path / "ckpt", {"model_version": 1})
    reloaded = AutoModelForCausalLM.from_pretrained(folder)
    ids = [3, 4, 5, 6, 7, 8]
    assert not torch.allclose(logits(model, ids), logits(tiny_model(len(tokenizer)), ids))  # the update moved them
    assert torch.equal(logits(model, ids), logits(reloaded, ids))
    reloaded_tokenizer = AutoTokenizer.from_pretrained(folder)
    assert reloaded_tokenizer.chat_template == TEMPLATE
    messages = [{"role": "user", "content": "hi"}]
    assert reloaded_tokenizer.apply_chat_template(messages, tokenize=False) == "user:hi\n"
    assert reloaded_tokenizer.encode("user:hi", add_special_tokens=False) == tokenizer.encode(
        "user:hi", add_special_tokens=False
    )
    assert load_trainer_state(folder) == {"model_version": 1}
    assert load_trainer_state(tmp_path) is None
    # saving again replaces the folder in one step and leaves no staging folders behind
    save_checkpoint(model, tokenizer, folder)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    assert load_trainer_state(folder) is None


def test_lora_checkpoint_holds_the_merged_model_and_the_adapter(tmp_path: Path) -> None:
    peft = pytest.importorskip("peft")
    tokenizer = char_tokenizer()
    config = PPOConfig(lr=5e-2, lora=LoRASettings(r=4, alpha=8))
    policy = prepare_policy(tiny_model(len(tokenizer)), config)
    optimizer = make_optimizer(policy, config)
    for _ in range(2):
        ppo_update(policy, optimizer, batch(), config)
    folder = save_checkpoint(policy.eval(), tokenizer, tmp_path / "ckpt")
    ids = [3, 4, 5, 6, 7, 8]
    merged = AutoModelForCausalLM.from_pretrained(folder)
    torch.testing.assert_close(logits(merged, ids), logits(policy, ids), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(logits(merged, ids), logits(tiny_model(len(tokenizer)), ids))
    adapted = peft.PeftModel.from_pretrained(tiny_model(len(tokenizer)), folder / "adapter")
    torch.testing.assert_close(logits(adapted, ids), logits(policy, ids), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("lora", [None, LoRASettings(r=4, alpha=8)], ids=["full", "lora"])
def test_resume_continues_weights_optimizer_iteration_and_version(
    model_folder: Path, tmp_path: Path, lora: LoRASettings | None
) -> None:
    if lora is not None:
        pytest.importorskip("peft")
    settings = {"model_dir": model_folder, "output_dir": tmp_path / "run", "ppo": PPOConfig(lr=1e-2, lora=lora)}
    first = TorchTrainer(TorchTrainerConfig(**settings))
    ids = [3, 4, 5, 6, 7, 8]
    base = logits(first.engine.policy, ids)
    first.engine.update(batch())
    assert not torch.allclose(logits(first.engine.policy, ids), base)  # moved: resuming the base would fail below
    first.iteration, first.model_version = 3, 7  # as after 3 iterations and 7 weight syncs
    folder = first.save_checkpoint()
    assert AutoModelForCausalLM.from_pretrained(folder) is not None  # the checkpoint is a plain model folder

    resumed = TorchTrainer(TorchTrainerConfig(**settings, resume=True))
    assert (resumed.iteration, resumed.model_version) == (3, 7)
    old, new = first.engine, resumed.engine
    torch.testing.assert_close(logits(new.policy, ids), logits(old.policy, ids), atol=1e-6, rtol=1e-6)
    before, after = old.optimizer.state_dict(), new.optimizer.state_dict()
    assert len(before["state"]) == len(after["state"]) > 0
    for key, value in before["state"].items():
        assert torch.equal(value["exp_avg"], after["state"][key]["exp_avg"])
    # the next update continues Adam (same step count), so both trainers make the same step
    old.update(batch())
    new.update(batch())
    torch.testing.assert_close(logits(new.policy, ids), logits(old.policy, ids), atol=1e-5, rtol=1e-5)

    fresh = TorchTrainer(TorchTrainerConfig(**{**settings, "output_dir": tmp_path / "other"}, resume=True))
    assert (fresh.iteration, fresh.model_version) == (0, 0)  # nothing to resume from: starts from the base


def test_reference_model_only_with_a_kl_coefficient(model_folder: Path, tmp_path: Path) -> None:
    without = TorchEngine(TorchTrainerConfig(model_dir=model_folder, output_dir=tmp_path))
    assert isinstance(without.policies, SinglePolicy) and without.policies.ref_model is None
    with_kl = TorchEngine(TorchTrainerConfig(model_dir=model_folder, output_dir=tmp_path, ppo=PPOConfig(kl_coef=0.1)))
    assert isinstance(with_kl.policies, SinglePolicy) and with_kl.policies.ref_model is not None
    assert not any(p.requires_grad for p in with_kl.policies.ref_model.parameters())
    assert with_kl.update(batch())["kl"] == pytest.approx(0.0, abs=1e-9)  # the policy starts at the reference


def test_missing_model_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        TorchTrainerConfig(model_dir=tmp_path / "nowhere")
    assert TorchTrainerConfig(model_dir="Qwen/Qwen2.5-0.5B-Instruct").model_dir == "Qwen/Qwen2.5-0.5B-Instruct"


def test_the_best_checkpoint_survives_saving_the_last_one(model_folder: Path, tmp_path: Path) -> None:
    """``checkpoint/best`` sits inside the last checkpoint's folder, which every save replaces: it is carried over."""
    run = tmp_path / "run"
    trainer = TorchTrainer(TorchTrainerConfig(model_dir=model_folder, output_dir=run, ppo=PPOConfig(lr=1e-2)))
    ids = [3, 4, 5, 6, 7, 8]
    trainer.iteration, trainer.model_version = 1, 1
    best = trainer.save_checkpoint(trainer.best_checkpoint_dir)
    best_logits = logits(trainer.engine.policy, ids)
    trainer.engine.update(batch())
    trainer.iteration, trainer.model_version = 2, 2
    last = trainer.save_checkpoint()
    trainer.iteration, trainer.model_version = 3, 3
    last = trainer.save_checkpoint()  # a second replacement carries it again
    assert best == last / "best"
    torch.testing.assert_close(logits(AutoModelForCausalLM.from_pretrained(best), ids), best_logits)
    assert not torch.allclose(logits(AutoModelForCausalLM.from_pretrained(last), ids), best_logits)
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint"]  # no staging or old folder left behind
