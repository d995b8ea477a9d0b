"""LoRA through PEFT on Hugging Face policies: only the adapters train, the KL reference is the
base with the adapters disabled, and the saved adapter loads back with PEFT. Gradient
checkpointing gives the same update as storing the activations."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("peft")

from peft import PeftModel

from rlscope.config import ConfigError, RunConfig, TrainConfig, validate
from rlscope.methods import MethodConfig
from rlscope.policy import AdapterDisabled, ModelConfig, reference_of
from rlscope.policy.hf import HFPolicy
from rlscope.tasks import TaskConfig, make_task
from rlscope.tasks.base import make_policy_for
from rlscope.train import train

TASK = TaskConfig(seq_len=4, eval_batches=1, eval_batch_size=8)
MODEL = ModelConfig(arch="llama", d_model=32, n_heads=2, n_layers=1)
LORA = ModelConfig(arch="llama", d_model=32, n_heads=2, n_layers=1, lora_rank=4)
VOCAB = 3  # token_reversal's vocabulary with TASK


def _lora_run(tmp_path: Path) -> TrainConfig:
    return TrainConfig(
        method="grpo", task="token_reversal", task_options=TASK, model=LORA,
        components=MethodConfig(kl_coef=0.05, kl_target="ref"),  # a KL reference
        run=RunConfig(batch_size=16, num_steps=4, eval_every=0, runs_dir=str(tmp_path),
                      progress=False, device="cpu", log_samples=0, name="lora"))


def _fresh(cfg: ModelConfig, seed: int = 0) -> HFPolicy:
    torch.manual_seed(seed)
    policy = make_policy_for(make_task("token_reversal", TASK), cfg)
    assert isinstance(policy, HFPolicy)
    return policy.eval()


def test_lora_policy_trains_only_adapters_and_reference_is_the_base() -> None:
    policy = _fresh(LORA)
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    ref = reference_of(policy)
    assert isinstance(ref, AdapterDisabled)
    assert not list(ref.parameters())  # no second copy of the weights
    tokens_BT = torch.randint(0, VOCAB, (3, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for p in policy.parameters():
            if p.requires_grad:
                p.add_(0.1)
        base_logits = _fresh(MODEL)(tokens_BT)[0]
        torch.testing.assert_close(ref(tokens_BT)[0], base_logits)
        assert not torch.allclose(policy(tokens_BT)[0], base_logits)


def test_lora_run_changes_only_adapters_and_saved_adapter_reloads(tmp_path: Path) -> None:
    result = train(_lora_run(tmp_path))
    assert result.status == "completed"
    kl = [m["policy/kl_ref_k1"] for m in result.metrics]
    assert kl[0] == pytest.approx(0.0, abs=1e-6) and all(math.isfinite(v) for v in kl)
    latest = result.run_dir / "checkpoints" / (result.run_dir / "checkpoints" / "latest.pt"
                                               ).read_text().strip()
    trained_state = torch.load(latest, weights_only=True)["policy"]
    initial = _fresh(LORA)
    changed = {k for k, v in initial.state_dict().items() if not torch.equal(v, trained_state[k])}
    assert changed and all("lora_" in k for k in changed)  # base weights identical
    assert any("lora_A" in k for k in changed) and any("lora_B" in k for k in changed)

    trained = _fresh(LORA)
    trained.load_state_dict(trained_state)
    base = _fresh(MODEL)
    reloaded = HFPolicy(PeftModel.from_pretrained(base.unwrap(), result.run_dir / "adapter"))
    tokens_BT = torch.randint(0, VOCAB, (4, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(reloaded.eval()(tokens_BT)[0], trained(tokens_BT)[0])


def test_lora_is_rejected_on_the_tiny_transformer() -> None:
    with pytest.raises(ConfigError, match="lora_rank > 0 needs a Hugging Face policy"):
        validate(TrainConfig(model=ModelConfig(arch="tiny", lora_rank=4)))
    with pytest.raises(ConfigError, match="gradient_checkpointing needs a Hugging Face"):
        validate(TrainConfig(model=ModelConfig(arch="tiny", gradient_checkpointing=True)))


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_gradient_checkpointing_gives_the_same_update(tmp_path: Path, lora_rank: int) -> None:
    states = []
    for checkpointing in (False, True):
        cfg = _lora_run(tmp_path)
        cfg = dataclasses.replace(
            cfg, model=dataclasses.replace(LORA, lora_rank=lora_rank,
                                           gradient_checkpointing=checkpointing),
            run=dataclasses.replace(cfg.run, num_steps=2, name=f"gc{checkpointing}"))
        result = train(cfg)
        latest = result.run_dir / "checkpoints" / "step_2.pt"
        states.append(torch.load(latest, weights_only=True)["policy"])
    gc = _fresh(dataclasses.replace(LORA, lora_rank=lora_rank, gradient_checkpointing=True))
    assert any(getattr(m, "gradient_checkpointing", False) for m in gc.modules())
    if lora_rank == 0:
        assert not any(torch.equal(v, states[0][k]) for k, v in _fresh(MODEL).state_dict().items()
                       if k.endswith("q_proj.weight"))  # the update moved the weights
    for k, v in states[0].items():
        torch.testing.assert_close(states[1][k], v, atol=1e-6, rtol=1e-5)


def test_lora_on_top_of_an_init_checkpoint(tmp_path: Path) -> None:
    """--init loads full SFT weights, then LoRA adapters go on top: the first evaluation is
    the SFT model's, the KL reference (adapters off) is the SFT model, the base stays the SFT
    weights bit for bit, and the saved adapter on the SFT base reproduces the policy."""
    from rlscope.supervised.sft import SftConfig, sft

    full = dataclasses.replace(LORA, lora_rank=0)
    warm = sft(SftConfig(task="token_reversal", num_steps=20, batch_size=16, lr=3e-3,
                         eval_every=0, device="cpu", progress=False, runs_dir=str(tmp_path),
                         name="sft", task_options=TASK, model=full))
    cfg = _lora_run(tmp_path)
    cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, init=str(warm.out_dir),
                                                           eval_every=2))
    result = train(cfg)
    assert result.evals[0]["eval/test_error"] == pytest.approx(
        warm.evals[-1]["eval/test_error"], abs=1e-6)
    assert result.metrics[0]["policy/kl_ref_k1"] == pytest.approx(0.0, abs=1e-6)
    sft_state = torch.load(warm.out_dir / "sft.pt", weights_only=True)["policy"]
    latest = result.run_dir / "checkpoints" / (result.run_dir / "checkpoints" / "latest.pt"
                                               ).read_text().strip()
    trained_state = torch.load(latest, weights_only=True)["policy"]
    trained = _fresh(LORA)
    trained.load_state_dict(trained_state)
    base_of_trained = {k.replace("base_model.model.", "").replace(".base_layer", ""): v
                       for k, v in trained.unwrap().state_dict().items() if "lora_" not in k}
    sft_model = _fresh(full)
    sft_model.load_state_dict(sft_state)
    for name, value in sft_model.unwrap().state_dict().items():
        assert torch.equal(base_of_trained[name], value), name
    tokens_BT = torch.randint(0, VOCAB, (4, 8), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        sft_logits = sft_model.eval()(tokens_BT)[0]
        # PEFT injects the adapter into sft_model's own modules
        reloaded = HFPolicy(PeftModel.from_pretrained(sft_model.unwrap(),
                                                      result.run_dir / "adapter"))
        torch.testing.assert_close(reloaded.eval()(tokens_BT)[0], trained(tokens_BT)[0])
        assert not torch.allclose(sft_logits, trained(tokens_BT)[0])


def test_sft_with_lora_saves_the_adapter_and_a_merged_init(tmp_path: Path) -> None:
    """rlscope sft --lora_rank: the adapter goes to <out>/adapter (PEFT format) and sft.pt is
    the merged model, which rlscope train --init loads into a plain model (first evaluation =
    the SFT model's)."""
    from rlscope.supervised.sft import SftConfig, sft

    warm = sft(SftConfig(task="token_reversal", num_steps=15, batch_size=16, lr=1e-2,
                         eval_every=0, device="cpu", progress=False, runs_dir=str(tmp_path),
                         name="sft_lora", task_options=TASK, model=LORA))
    assert (warm.out_dir / "adapter" / "adapter_config.json").exists()
    payload = torch.load(warm.out_dir / "sft.pt", weights_only=True)
    assert payload["model"]["lora_rank"] == 0 and not any("lora_" in k for k in payload["policy"])
    base = _fresh(MODEL)
    initial = {k: v.clone() for k, v in base.state_dict().items()}
    tokens_BT = torch.randint(0, VOCAB, (4, 8), generator=torch.Generator().manual_seed(4))
    merged = _fresh(MODEL)
    merged.load_state_dict(payload["policy"])
    with torch.no_grad():
        adapted = HFPolicy(PeftModel.from_pretrained(base.unwrap(), warm.out_dir / "adapter"))
        torch.testing.assert_close(merged.eval()(tokens_BT)[0], adapted.eval()(tokens_BT)[0],
                                   atol=1e-5, rtol=1e-5)
    assert any(not torch.equal(initial[k], v) for k, v in payload["policy"].items())
    run = train(TrainConfig(task="token_reversal", task_options=TASK, model=MODEL,
                            run=RunConfig(num_steps=0, progress=False, device="cpu",
                                          runs_dir=str(tmp_path), init=str(warm.out_dir))))
    assert run.evals[0]["eval/test_error"] == pytest.approx(
        warm.evals[-1]["eval/test_error"], abs=1e-6)
