"""On-policy exactness through the real loop (METHODS.md, "Training protocol").

The first learner pass of a step sees the very policy that sampled the batch, so its ratio,
KL-to-behaviour and clip metrics must be exactly 1 / 0 / 0 and the sampler-learner mismatch
metrics exactly 0 and ESS 1 — for the tiny transformer and the Hugging Face adapter, at
temperature 1 and with temperature + top-p/top-k replayed by the learner. Turning the replay off
must make the mismatch visible.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from rlscope.config import RunConfig, TrainConfig
from rlscope.policy import ModelConfig
from rlscope.sampling import SamplingConfig
from rlscope.tasks import TaskConfig
from rlscope.train import train

TOL = 1e-6
SETTINGS = {
    "T1": SamplingConfig(),
    "T0.7-p0.9": SamplingConfig(temperature=0.7, top_p=0.9),
    # top-k 2 of 3 symbols filters at every position; the stop token ends rows early, so the
    # learner also replays positions after a stop (where the pad token may lie outside the set).
    "T0.7-k2-stop": SamplingConfig(temperature=0.7, top_k=2, stop_token_ids=(0,)),
}
MODELS = {
    # balanced: under the reference init's first step no ppo row samples the stop token here,
    # which would make the stop case vacuous (the test checks the identity, not the init)
    "tiny": ModelConfig(embed_init="balanced"),
    "qwen2": ModelConfig(arch="qwen2", d_model=32, n_heads=2, n_layers=1),
    "llama": ModelConfig(arch="llama", d_model=32, n_heads=2, n_layers=1),
}


def _first_step(tmp_path: Path, method: str, model: ModelConfig, sampling: SamplingConfig,
                task: TaskConfig | None = None) -> dict[str, float]:
    if model.arch != "tiny":
        pytest.importorskip("transformers")
    cfg = TrainConfig(
        method=method,
        run=RunConfig(num_steps=1, batch_size=16, group_size=4 if method == "grpo" else 0,
                      inner_epochs=2, progress=False, runs_dir=str(tmp_path), eval_every=0,
                      device="cpu", log_samples=0),
        task_options=task or TaskConfig(seq_len=4, eval_batches=1, eval_batch_size=8),
        sampling=sampling,
        model=model,
    )
    result = train(cfg)
    assert result.status == "completed"
    assert len(result.metrics) == 1
    return result.metrics[0]


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("arch", list(MODELS))
@pytest.mark.parametrize("method", ["grpo", "ppo"])
def test_first_pass_is_exactly_on_policy(tmp_path: Path, method: str, arch: str,
                                         setting: str) -> None:
    m = _first_step(tmp_path, method, MODELS[arch], SETTINGS[setting])
    bad = {k: v for k, v in m.items() if not math.isfinite(v)}
    assert not bad, f"non-finite metrics: {bad}"
    assert abs(m["policy/ratio_mean_first"] - 1.0) < TOL
    assert abs(m["policy/ratio_min_first"] - 1.0) < TOL
    assert abs(m["policy/ratio_max_first"] - 1.0) < TOL
    assert m["policy/clipfrac_region_first"] == 0.0
    assert abs(m["policy/kl_behaviour_k1_first"]) < TOL
    assert abs(m["policy/kl_behaviour_k3_first"]) < TOL
    assert m["sampler/logp_diff_max"] < 1e-5
    assert abs(m["sampler/is_ess"] - 1.0) < TOL
    assert m["sampler/frac_outside_band"] == 0.0
    # The second pass runs after an optimizer step: the first-pass metrics are not just the
    # last pass's, and the update really moved the policy.
    assert m["policy/kl_behaviour_k2"] > 1e-6
    if setting == "T0.7-k2-stop":
        assert m["length/mean"] < 4.0, "no row stopped early: the stop case is vacuous"


# A fresh HF model's head (init std 0.02) is nearly flat, so top-p 0.9 keeps every symbol
# there; top-k 2 of 5 or top-p 0.5 always filters.
MISMATCH = [("tiny", 2, 0, 0.9), ("tiny", 4, 2, 1.0), ("qwen2", 4, 2, 1.0), ("qwen2", 4, 0, 0.5)]


@pytest.mark.parametrize(("arch", "vocab", "top_k", "top_p"), MISMATCH,
                         ids=[f"{a}-V{v}-k{k}-p{p}" for a, v, k, p in MISMATCH])
def test_without_mask_replay_the_mismatch_shows(tmp_path: Path, arch: str, vocab: int,
                                                top_k: int, top_p: float) -> None:
    task = TaskConfig(vocab=vocab, seq_len=4, eval_batches=1, eval_batch_size=8)
    runs = {}
    for replay in (True, False):
        sampling = SamplingConfig(temperature=0.7, top_k=top_k, top_p=top_p,
                                  replay_sampling_mask=replay)
        runs[replay] = _first_step(tmp_path, "grpo", MODELS[arch], sampling, task)
    exact, off = runs[True], runs[False]
    assert exact["sampler/logp_diff_max"] < 1e-5
    assert abs(exact["sampler/is_ess"] - 1.0) < TOL
    # The learner's unfiltered distribution gives every sampled token less mass than the
    # sampler's filtered one: log-ratios are negative, KL-to-behaviour k1 too.
    assert off["sampler/logp_diff_max"] > 1e-3
    assert off["sampler/logp_diff_mean"] > 1e-3
    assert off["sampler/frac_outside_band"] > 0 or off["sampler/is_ess"] < 1.0 - 1e-4
    assert off["policy/ratio_max_first"] < 1.0 + TOL
    assert off["policy/ratio_mean_first"] < 1.0 - 1e-4
    assert off["policy/kl_behaviour_k1_first"] < -1e-4
