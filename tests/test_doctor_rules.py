"""Every doctor rule on synthetic metric tables: it fires on its planted pattern, stays quiet on
a healthy table with the same metrics, and says which metrics it lacks (METRICS.md, "The
doctor"). Pure numpy series with fixed seeds; no torch.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlscope.doctor.findings import SEVERITIES, DoctorConfig, Finding, Unavailable
from rlscope.doctor.importers import load
from rlscope.doctor.rules import RULES, diagnose, link_causes
from rlscope.doctor.table import MetricTable

N = 60
STEPS = np.arange(N, dtype=float)
DEFAULT = DoctorConfig()

# An rlscope run's config.json (the layout `_facts` reads).
RUN_CONFIG: dict[str, Any] = {
    "config": {
        "run": {"delay": 0, "inner_epochs": 2, "num_minibatches": 1},
        "sampling": {"temperature": 1.0, "top_k": 0, "top_p": 0.9,
                     "replay_sampling_mask": False, "stop_token_ids": []},
        "replay": {"replay_capacity": 0},
        "optim": {"grad_clip": 1.0},
    },
    "method_spec": {"kl": {"control": "adaptive", "target_value": 6.0}},
}


def run_config(*, delay: int = 0, top_p: float = 1.0, top_k: int = 0, mask: bool = False,
               stop: tuple[int, ...] = (2,), replay_capacity: int = 0,
               grad_clip: float | None = 1.0, target: float | None = 6.0) -> dict[str, Any]:
    cfg = copy.deepcopy(RUN_CONFIG)
    cfg["config"]["run"]["delay"] = delay
    cfg["config"]["sampling"] |= {"top_p": top_p, "top_k": top_k, "replay_sampling_mask": mask,
                                  "stop_token_ids": list(stop)}
    cfg["config"]["replay"]["replay_capacity"] = replay_capacity
    cfg["config"]["optim"]["grad_clip"] = grad_clip
    if target is None:
        del cfg["method_spec"]["kl"]
    else:
        cfg["method_spec"]["kl"]["target_value"] = target
    return cfg


def table(series: dict[str, Any], config: dict[str, Any] | None = None,
          steps: np.ndarray = STEPS) -> MetricTable:
    """A table with one value per step for each metric (a scalar is held constant)."""
    t = MetricTable(source="synthetic", fmt="test", config=config or {})
    for name, values in series.items():
        values = np.broadcast_to(np.asarray(values, dtype=float), steps.shape)
        for s, v in zip(steps, values, strict=True):
            t.add(float(s), name, float(v))
    return t


def foreign(tmp_path: Path, series: dict[str, Any], steps: np.ndarray = STEPS) -> MetricTable:
    """A table read as the doctor reads a foreign JSON-lines log of ``series`` (a scalar is held
    constant): the framework guessed from its names, names translated, signs applied."""
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": float(s)} | {n: float(np.broadcast_to(v, steps.shape)[i])
                                  for n, v in series.items()} for i, s in enumerate(steps)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (t,) = load(path, "jsonl").tables
    return t


def noise(seed: int, scale: float, n: int = N) -> np.ndarray:
    return scale * np.random.default_rng(seed).standard_normal(n)


def fired(out: list[Finding] | Unavailable, rule_id: str) -> Finding:
    """The single finding a rule returned, checked for the common contract."""
    assert isinstance(out, list), out
    assert len(out) == 1, out
    f = out[0]
    assert f.id == rule_id
    assert f.severity in SEVERITIES
    assert 0.0 < f.confidence <= 1.0
    assert f.title and f.mechanism and f.actions
    # the evidence must serialise to strict JSON (no NaN/inf in findings.json)
    json.dumps(f.as_dict(), allow_nan=False)
    return f


def quiet(out: list[Finding] | Unavailable) -> None:
    assert out == [], out


# ---------------------------------------------------------------- the synthetic patterns

def collapsing_entropy(seed: int = 0) -> np.ndarray:
    """2 nats/token for 20 steps, then 2·exp(−0.15·(s − 20)), with 1% multiplicative noise.

    start = mean of the first window (12 points) ≈ 2, threshold = max(0.1, 0.1·2) = 0.2.
    2·exp(−0.15 k) < 0.2 ⇔ k > ln(10)/0.15 = 15.35, so the crossing is k = 16, step 36
    (k = 15 gives 0.2108, 5% above; k = 16 gives 0.1814, 9% below: far beyond 1% noise).
    """
    k = np.maximum(STEPS - 20, 0)
    return 2.0 * np.exp(-0.15 * k) * np.exp(noise(seed, 0.01))


def amplification(first: int, seed: int = 1) -> np.ndarray:
    """≈1.2 before step ``first``, ≈8 from it on."""
    return np.where(STEPS < first, 1.2, 8.0) + noise(seed, 0.05)


def healthy_series(seed: int = 100) -> dict[str, np.ndarray]:
    """A run that learns: reward rises, entropy drifts down slowly, nothing pathological."""
    rng = np.random.default_rng(seed)

    def nz(scale: float) -> np.ndarray:
        return scale * rng.standard_normal(N)

    return {
        "reward/mean": 0.2 + 0.008 * STEPS + nz(0.02),
        "policy/entropy": 2.0 - 0.005 * STEPS + nz(0.02),
        "adv/amplification": 1.2 + nz(0.05),
        "adv/frac_zero": 0.15 + nz(0.02),
        "length/mean": 200.0 + nz(5.0),
        "length/clip_ratio": np.abs(0.01 + nz(0.002)),
        "policy/kl_ref_seq_k1": 4.0 + nz(0.3),
        # ours is E_μ[ℓ − ℓ_μ] = −KL(μ‖π): negative after an update
        "policy/kl_behaviour_k1": -0.01 + nz(0.001),
        "policy/ratio_mean_first": 1.0 + nz(1e-5),
        "sampler/frac_outside_band": np.abs(0.001 + nz(1e-4)),
        "optim/grad_norm": 0.5 + nz(0.05),
        "optim/nonfinite_steps": np.zeros(N),
        "loss/value": 0.5 + nz(0.05),
        "value/explained_var": 0.6 + nz(0.05),
        "replay/age_mean": 2.0 + nz(0.2),
        "time/step": 10.0 + nz(0.3),
        "time/step_mean": 9.6 + nz(0.3),  # a data-parallel run with balanced ranks
        "time/sample": 7.0 + nz(0.2),
    }


def healthy_table(config: dict[str, Any] | None = None) -> MetricTable:
    t = table(healthy_series(), config if config is not None else run_config())
    for s, err in zip(range(0, 60, 10), (0.5, 0.45, 0.4, 0.35, 0.3, 0.25), strict=True):
        t.add(float(s), "eval/test_error", err)
    return t


# ---------------------------------------------------------------- contract over the registry

def test_registry_lists_every_documented_rule():
    assert list(RULES) == [
        "entropy_collapse", "sigma_amplification", "entropy_rising", "negative_kl",
        "kl_runaway", "kl_too_small", "value_instability", "no_signal", "length_hacking",
        "truncation", "env_tokens_in_loss", "turn_budget_exhaustion", "sampler_mismatch",
        "nonfinite_gradients", "grad_clip_saturation", "reward_peak_fall", "reward_plateau",
        "oscillation", "stale_replay", "throughput_regression", "rank_imbalance",
        "env_time_dominates", "learning_verdict"]


@pytest.mark.parametrize("rule_id", list(RULES))
def test_every_rule_is_unavailable_on_an_empty_table(rule_id):
    out = RULES[rule_id](MetricTable(source="empty", fmt="test"), DEFAULT)
    assert isinstance(out, Unavailable)
    assert out.needs and all(isinstance(n, str) and n for n in out.needs)


# ---------------------------------------------------------------- entropy_collapse

def test_entropy_collapse_fires_with_the_crossing_step():
    h = collapsing_entropy()
    f = fired(RULES["entropy_collapse"](table({"policy/entropy": h}), DEFAULT),
              "entropy_collapse")
    assert f.severity == "warning"
    assert f.evidence["metric"] == "policy/entropy"
    assert f.evidence["start"] == pytest.approx(2.0, rel=0.01)
    assert f.evidence["threshold"] == pytest.approx(0.2, rel=0.01)
    assert f.evidence["crossing_step"] == 36.0
    assert f.step == 36.0
    # the last window (steps 48..59, k = 28..39) is near 2·exp(−0.15·33.5) ≈ 0.013
    assert f.evidence["last"] == pytest.approx(2.0 * np.exp(-0.15 * np.arange(28, 40)).mean(),
                                               rel=0.02)
    # log entropy falls before the crossing
    assert f.evidence["decay_rate_per_step"] < 0


def test_entropy_collapse_accepts_sampled_entropy():
    f = fired(RULES["entropy_collapse"](table({"policy/entropy_sampled": collapsing_entropy()}),
                                        DEFAULT), "entropy_collapse")
    assert f.evidence["metric"] == "policy/entropy_sampled"


def test_entropy_collapse_stays_quiet_on_a_slow_decline():
    h = 2.0 - 0.005 * STEPS + noise(2, 0.02)  # ends near 1.7, far above 0.2
    quiet(RULES["entropy_collapse"](table({"policy/entropy": h}), DEFAULT))


def test_entropy_collapse_that_recovers_is_reported_as_an_episode():
    # below the floor for steps 30..44 only, then back at 2 for the last window: an event
    # with its start and length (issue 16), not a collapse that stays
    h = np.where((STEPS >= 30) & (STEPS < 45), 0.05, 2.0)
    f = fired(RULES["entropy_collapse"](table({"policy/entropy": h}), DEFAULT),
              "entropy_collapse")
    assert (f.evidence["crossing_step"], f.evidence["until_step"]) == (30.0, 44.0)
    assert f.evidence["steps_below"] == 15 and f.evidence["recovered"] is True
    assert f.step == 30.0 and "before rising again" in f.title
    # a 3-step dip (under max(min_steps/2, 20% of steps) = 12) stays quiet
    h = np.where((STEPS >= 30) & (STEPS < 33), 0.05, 2.0)
    quiet(RULES["entropy_collapse"](table({"policy/entropy": h}), DEFAULT))


def test_entropy_collapse_unavailable_without_entropy():
    out = RULES["entropy_collapse"](table({"reward/mean": 0.5}), DEFAULT)
    assert isinstance(out, Unavailable)
    assert "policy/entropy" in out.needs
    # too few points is the same as none
    out = RULES["entropy_collapse"](table({"policy/entropy": 0.05}, steps=np.arange(5.0)),
                                    DEFAULT)
    assert isinstance(out, Unavailable)


def test_entropy_collapse_after_an_isolated_early_dip():
    # One glitch (a logged 0) at step 5, healthy until step 30, then collapsed for good.
    # Points below the floor from step 5 on: 1 + 30 of 55 (56%), under the 80% bar; from
    # step 30 on: 30 of 30. The collapse starts at 30.
    h = np.where(STEPS >= 30, 0.02, 1.5)
    h[5] = 0.0
    f = fired(RULES["entropy_collapse"](table({"policy/entropy": h}), DEFAULT),
              "entropy_collapse")
    assert f.evidence["crossing_step"] == 30.0


def test_entropy_collapse_from_the_start_has_no_nan_decay_rate():
    # Entropy at 0.05 throughout: start 0.05, threshold max(0.1, 0.005) = 0.1, crossing at 0;
    # a decay rate needs points before the crossing, so it is absent rather than nan.
    f = fired(RULES["entropy_collapse"](table({"policy/entropy": 0.05}), DEFAULT),
              "entropy_collapse")
    assert f.evidence["crossing_step"] == 0.0
    assert f.evidence["threshold"] == 0.1
    assert f.evidence["decay_rate_per_step"] is None


# ---------------------------------------------------------------- sigma_amplification

def test_sigma_amplification_fires_from_the_first_run_of_three():
    amp = np.where(STEPS < 15, 1.0, 8.0)
    amp[5] = 9.0  # an isolated high step is not a stretch
    t = table({"adv/amplification": amp, "adv/group_std_mean": 0.05})
    f = fired(RULES["sigma_amplification"](t, DEFAULT), "sigma_amplification")
    assert f.severity == "warning"
    assert f.evidence["first_step"] == 15.0
    assert f.step == 15.0
    # 45 points at 8, 14 at 1, one at 9: median 8, max 9, 46/60 above 3
    assert f.evidence["median"] == 8.0
    assert f.evidence["max"] == 9.0
    assert f.evidence["frac_steps_above"] == round(46 / 60, 4)
    assert f.evidence["group_std_mean_median"] == 0.05


def test_sigma_amplification_stays_quiet_near_one():
    quiet(RULES["sigma_amplification"](table({"adv/amplification": 1.2 + noise(3, 0.3)}),
                                       DEFAULT))


def test_sigma_amplification_unavailable():
    out = RULES["sigma_amplification"](table({"adv/group_std_mean": 0.1}), DEFAULT)
    assert out == Unavailable(("adv/amplification",))


# ---------------------------------------------------------------- entropy_rising

def test_entropy_rising_fires_with_rising_length():
    t = table({"policy/entropy": 1.0 + 0.02 * STEPS + noise(4, 0.02),
               "length/mean": 100.0 + 2.0 * STEPS + noise(5, 3.0)})
    f = fired(RULES["entropy_rising"](t, DEFAULT), "entropy_rising")
    assert f.severity == "warning"
    assert f.evidence["with"] == {"length/mean": "up"}
    assert f.evidence["trend"]["direction"] == "up"
    assert f.evidence["trend"]["slope"] == pytest.approx(0.02, rel=0.05)
    assert f.evidence["trend"]["slope_low"] > 0


def test_entropy_rising_fires_with_falling_reward():
    t = table({"policy/entropy": 1.0 + 0.02 * STEPS + noise(4, 0.02),
               "reward/mean": 0.8 - 0.01 * STEPS + noise(6, 0.02)})
    f = fired(RULES["entropy_rising"](t, DEFAULT), "entropy_rising")
    assert f.evidence["with"] == {"reward/mean": "down"}


def test_entropy_rising_stays_quiet():
    # flat entropy while length grows
    t = table({"policy/entropy": 1.0 + noise(7, 0.02),
               "length/mean": 100.0 + 2.0 * STEPS + noise(5, 3.0)})
    quiet(RULES["entropy_rising"](t, DEFAULT))
    # rising entropy alone (flat length, rising reward) is not the pattern
    t = table({"policy/entropy": 1.0 + 0.02 * STEPS + noise(4, 0.02),
               "length/mean": 100.0 + noise(5, 3.0),
               "reward/mean": 0.2 + 0.01 * STEPS + noise(6, 0.02)})
    quiet(RULES["entropy_rising"](t, DEFAULT))


def test_entropy_rising_unavailable():
    out = RULES["entropy_rising"](table({"length/mean": 100.0}), DEFAULT)
    assert isinstance(out, Unavailable)
    assert set(out.needs) == {"policy/entropy", "policy/entropy_sampled"}


# ---------------------------------------------------------------- negative_kl

def alternating(mean: float, amplitude: float) -> np.ndarray:
    """mean ± amplitude, alternating: mean exactly ``mean``, population std ``amplitude``."""
    return mean + amplitude * np.where(STEPS % 2 == 0, 1.0, -1.0)


def test_negative_kl_many_standard_errors_below_zero_is_not_called_estimator_noise():
    # mean −6e-4, std 1e-3, se = 1e-3/√60 = 1.29e-4; −6e-4 < −max(1e-4, 3.87e-4): beyond noise.
    # The mean is 4.6 standard errors below zero, so "estimator noise" fails its test (issue
    # 16): the cause is a systematic gap (no sampling config recorded).
    kl = alternating(-6e-4, 1e-3)
    f = fired(RULES["negative_kl"](table({"policy/kl_ref_k1": kl}), DEFAULT), "negative_kl")
    assert f.severity == "warning"
    (name,) = f.evidence["metrics"]
    stats = f.evidence["metrics"][name]
    assert name == "policy/kl_ref_k1"
    assert stats["mean"] == pytest.approx(-6e-4)
    assert stats["stderr"] == pytest.approx(1e-3 / math.sqrt(60), rel=1e-3)
    assert stats["frac_negative_steps"] == 0.5  # the −1.6e-3 half
    assert stats["z"] == pytest.approx(-6e-4 / (1e-3 / math.sqrt(60)), rel=1e-3)
    assert stats["worst"] == pytest.approx(-1.6e-3)
    assert f.confidence == 0.6
    assert f.evidence["cause"].startswith("a systematic gap, not estimator noise")
    assert "4.6 standard errors" in f.evidence["cause"]
    assert f.evidence["sampling"] == "not recorded"


def test_negative_kl_dips_with_a_mean_within_noise_are_estimator_noise():
    # 80% of steps at +2e-3, a fifth dipping to −8e-3: the mean is exactly 0 (within 2
    # standard errors of zero), yet 20% of steps sit far below zero (MAD 0: any dip is far)
    kl = np.where(STEPS % 5 == 0, -8e-3, 2e-3)
    f = fired(RULES["negative_kl"](table({"policy/kl_ref_k1": kl}), DEFAULT), "negative_kl")
    stats = f.evidence["metrics"]["policy/kl_ref_k1"]
    assert stats["fired_by"] == "dips"
    assert stats["mean"] == pytest.approx(0.0, abs=1e-12)
    assert stats["frac_far_below_steps"] == pytest.approx(0.2)
    assert (stats["worst"], stats["worst_step"]) == (pytest.approx(-8e-3), 0.0)
    assert f.evidence["cause"].startswith("estimator noise")
    assert "20%" in f.title and "worst" in f.title
    # the same dips with a clearly negative mean: no longer noise
    kl2 = np.where(STEPS % 5 == 0, -8e-3, -1e-3)
    f2 = fired(RULES["negative_kl"](table({"policy/kl_ref_k1": kl2}), DEFAULT), "negative_kl")
    assert not f2.evidence["cause"].startswith("estimator noise")


def test_negative_kl_blames_filtered_sampling_recorded_in_the_config():
    kl = alternating(-6e-4, 1e-3)
    f = fired(RULES["negative_kl"](table({"policy/kl_ref_k1": kl}, RUN_CONFIG), DEFAULT),
              "negative_kl")
    assert f.evidence["metrics"]["policy/kl_ref_k1"]["mean"] < 0
    assert "top_p=0.9" in f.evidence["cause"]
    assert "replay_sampling_mask=False" in f.evidence["cause"]
    assert f.evidence["sampling"]["top_p"] == 0.9
    assert "top_p=0.9" in f.mechanism
    assert f.confidence == 0.8


def test_negative_kl_not_blamed_on_sampling_when_the_kept_set_is_replayed():
    kl = alternating(-6e-4, 1e-3)
    # top_p = 0.9 but the learner replays the kept set: the sampling config is no cause
    f = fired(RULES["negative_kl"](table({"policy/kl_ref_k1": kl},
                                         run_config(top_p=0.9, mask=True)), DEFAULT),
              "negative_kl")
    assert "top_p" not in f.evidence["cause"]
    assert f.evidence["cause"].startswith("a systematic gap")
    # unfiltered sampling: no cause in the config either
    f = fired(RULES["negative_kl"](table({"policy/kl_ref_k1": kl}, run_config(top_p=1.0)),
                                   DEFAULT), "negative_kl")
    assert f.evidence["cause"].startswith("a systematic gap")


def test_negative_kl_large_against_its_spread_is_engine_mismatch(tmp_path: Path):
    # verl's actor/ppo_kl = mean(ℓ_old − ℓ_new) ≥ 0 in expectation; mean −0.01, std 1e-3:
    # |mean| ≫ std, no sampling cause recorded. The importer stores it as our
    # policy/kl_behaviour_k1 (+0.01) and the rule reads it back with verl's sign, once.
    t = foreign(tmp_path, {"actor/ppo_kl": alternating(-0.01, 1e-3)})
    assert t.values("policy/kl_behaviour_k1").mean() == pytest.approx(0.01)
    f = fired(RULES["negative_kl"](t, DEFAULT), "negative_kl")
    ev = f.evidence["metrics"]["actor/ppo_kl"]
    assert ev["stored_as"] == "policy/kl_behaviour_k1" and ev["sign"] == -1.0
    assert ev["mean"] == pytest.approx(-0.01) and ev["frac_negative_steps"] == 1.0
    assert f.title.startswith("actor/ppo_kl is negative on average (-0.01")
    assert "engine mismatch" in f.evidence["cause"]
    assert f.confidence == 0.6


@pytest.mark.parametrize("framework_name", ["ppo/policy/policykl", "ppo_kl",
                                            "optim/kl_sample_train_v1", "rollout_corr/kl"])
def test_negative_kl_reads_every_foreign_behaviour_kl_with_its_own_sign(
        tmp_path: Path, framework_name: str):
    """TRL's classic policykl, OpenRLHF's ppo_kl, tinker-cookbook's kl_sample_train_v1 and
    verl's rollout_corr/kl are mean(ℓ_behaviour − ℓ_learner) ≥ 0 in expectation, translated to
    our k1 (last or first pass) with the sign flipped: −0.01 as logged fires, +0.01 does not."""
    companions = {"ppo/policy/policykl": {"ppo/loss/value": 0.1},  # so the framework is known
                  "ppo_kl": {"ppo_clip_ratio": 0.0, "actor_lr": 1e-6},
                  "optim/kl_sample_train_v1": {"env/all/reward/total": 0.5},
                  "rollout_corr/kl": {"actor/entropy": 1.0}}[framework_name]
    t = foreign(tmp_path, {framework_name: alternating(-0.01, 1e-3)} | companions)
    f = fired(RULES["negative_kl"](t, DEFAULT), "negative_kl")
    assert list(f.evidence["metrics"]) == [framework_name]
    assert f.evidence["metrics"][framework_name]["mean"] == pytest.approx(-0.01)
    t = foreign(tmp_path, {framework_name: alternating(0.01, 1e-3)} | companions)
    assert RULES["negative_kl"](t, DEFAULT) == []


def test_negative_kl_reads_our_behaviour_k1_with_its_sign():
    """policy/kl_behaviour_k1 = E_μ[ℓ − ℓ_μ] = −KL(μ‖π) ≤ 0 after an update: a negative mean
    is expected; a positive one beyond noise is the signal, reported as −k1 (the divergence)."""
    quiet(RULES["negative_kl"](table({"policy/kl_behaviour_k1": alternating(-0.01, 1e-3)}),
                               DEFAULT))
    f = fired(RULES["negative_kl"](table({"policy/kl_behaviour_k1": alternating(0.01, 1e-3)}),
                                   DEFAULT), "negative_kl")
    assert list(f.evidence["metrics"]) == ["−policy/kl_behaviour_k1"]
    assert f.evidence["metrics"]["−policy/kl_behaviour_k1"]["mean"] == pytest.approx(-0.01)
    # one pass per step: the first-pass k1 is the same series, and is not counted twice
    k1 = alternating(0.01, 1e-3)
    f = fired(RULES["negative_kl"](table({"policy/kl_behaviour_k1": k1,
                                          "policy/kl_behaviour_k1_first": k1}), DEFAULT),
              "negative_kl")
    assert list(f.evidence["metrics"]) == ["−policy/kl_behaviour_k1"]
    assert "more KL estimates" not in f.title


def test_negative_kl_stays_quiet():
    # a positive KL, and a k1 estimate whose negative mean is within 3 standard errors
    # (mean −1e-4, se 1.29e-4): neither is negative beyond noise
    t = table({"policy/kl_ref_k1": 0.02 + noise(8, 0.005),
               "policy/kl_behaviour_k1": alternating(-1e-4, 1e-3)}, RUN_CONFIG)
    quiet(RULES["negative_kl"](t, DEFAULT))


def test_negative_kl_unavailable():
    out = RULES["negative_kl"](table({"reward/mean": 0.5}), DEFAULT)
    assert isinstance(out, Unavailable)
    assert "policy/kl_ref_k1" in out.needs and "policy/kl_behaviour_k1" in out.needs


# ---------------------------------------------------------------- kl_runaway

def test_kl_runaway_fires_far_above_the_adaptive_target():
    # sequence KL 5 → 30 (linear); last window (steps 48..59) mean 5 + 25·53.5/59 ≈ 27.7
    # > 3 × target 6 = 18
    kl = 5.0 + 25.0 * STEPS / 59 + noise(9, 0.3)
    t = table({"policy/kl_ref_seq_k1": kl, "kl_ctrl/beta": 0.1 + 0.01 * STEPS}, run_config())
    f = fired(RULES["kl_runaway"](t, DEFAULT), "kl_runaway")
    assert f.severity == "critical"
    assert f.evidence["target"] == 6.0
    assert f.evidence["trend"]["last_mean"] == pytest.approx(5 + 25 * 53.5 / 59, rel=0.02)
    # β first window mean 0.1 + 0.01·5.5 = 0.155, last 0.1 + 0.01·53.5 = 0.635
    assert f.evidence["beta"] == {"first": pytest.approx(0.155), "last": pytest.approx(0.635)}
    # a linear rise from step 0: the onset is at (or next to) the start
    assert f.step is not None and f.step <= 3.0 and f.evidence["onset_step"] == f.step


def test_kl_runaway_fires_on_growth_without_a_target():
    # per-token KL 0.001 + (s/59)²: first window (s = 0..11, Σs² = 506) ≈ 0.001 + 506/12/3481
    # = 0.0131; last (s = 48..59, Σs² = 70210 − 35720 = 34490) ≈ 0.001 + 34490/12/3481 = 0.827,
    # 63× the first (a linear ramp from ~0 gives only ~9×: the windows are 12 steps wide)
    kl = 0.001 + (STEPS / 59) ** 2 + noise(10, 0.002)
    f = fired(RULES["kl_runaway"](table({"policy/kl_ref_k1": kl}), DEFAULT), "kl_runaway")
    assert "target" not in f.evidence
    assert f.evidence["trend"]["direction"] == "up"
    assert f.evidence["trend"]["first_mean"] == pytest.approx(0.001 + 506 / 12 / 3481, abs=0.002)
    assert f.evidence["trend"]["last_mean"] == pytest.approx(0.001 + 34490 / 12 / 3481, abs=0.002)


def test_kl_runaway_stays_quiet_near_target():
    t = table({"policy/kl_ref_seq_k1": 6.0 + noise(11, 0.5)}, run_config())
    quiet(RULES["kl_runaway"](t, DEFAULT))
    # growth within 10× (0.05 → 0.1) is not a runaway without a target
    quiet(RULES["kl_runaway"](table({"policy/kl_ref_k1": 0.05 + 0.05 * STEPS / 59}), DEFAULT))


def test_kl_runaway_unavailable():
    out = RULES["kl_runaway"](table({"policy/kl_behaviour_k1": 0.01}), DEFAULT)
    # no adaptive target recorded: the sequence KL is not needed, only per-token ones
    assert out == Unavailable(("policy/kl_ref_k1", "policy/kl_ref_k3"))


# ---------------------------------------------------------------- kl_too_small

def test_kl_too_small_fires_on_tiny_updates_and_flat_reward():
    t = table({"policy/kl_behaviour_k1": 1e-6 * (1 + noise(12, 0.1)),
               "reward/mean": 0.3 + noise(13, 0.02),
               "policy/clipfrac_region": 0.0})
    f = fired(RULES["kl_too_small"](t, DEFAULT), "kl_too_small")
    assert f.severity == "warning"
    assert f.evidence["metric"] == "policy/kl_behaviour_k1"
    assert f.evidence["median_abs"] == pytest.approx(1e-6, rel=0.05)
    assert f.evidence["frac_steps_below"] == 1.0
    assert f.evidence["reward_trend"]["direction"] == "flat"


def test_kl_too_small_is_a_point_check_on_verl_ppo_kl_with_the_learning_rate(tmp_path: Path):
    """Three steps of verl's actor/ppo_kl ~1e-5 at lr 1e-6 (the issue's verl DAPO log):
    the check runs from the steps it has and reports the learning rate; no reward needed.
    The importer stores it as policy/kl_behaviour_k1 (negated); the rule reads its size."""
    steps = np.arange(3.0)
    t = foreign(tmp_path, {"actor/ppo_kl": np.array([1e-5, -2e-5, 1.5e-5]), "actor/lr": 1e-6},
                steps=steps)
    assert t.values("policy/kl_behaviour_k1").tolist() == [-1e-5, 2e-5, -1.5e-5]
    f = fired(RULES["kl_too_small"](t, DEFAULT), "kl_too_small")
    assert f.evidence["metric"] == "policy/kl_behaviour_k1"
    assert f.severity == "info"  # no reward logged: the point check alone
    assert f.evidence["lr"] == 1e-6 and "lr 1e-06" in f.title
    assert f.evidence["median_abs"] == pytest.approx(1.5e-5)


def test_kl_too_small_stays_quiet():
    # a KL of 1e-2 per token is a real update
    t = table({"policy/kl_behaviour_k1": 0.01 + noise(12, 0.001),
               "reward/mean": 0.3 + noise(13, 0.02)})
    quiet(RULES["kl_too_small"](t, DEFAULT))
    # a tiny KL while reward climbs: the updates suffice
    t = table({"policy/kl_behaviour_k1": 1e-6, "reward/mean": 0.2 + 0.01 * STEPS})
    quiet(RULES["kl_too_small"](t, DEFAULT))
    # a tiny KL with clipping active is not conservative
    t = table({"policy/kl_behaviour_k1": 1e-6, "reward/mean": 0.3 + noise(13, 0.02),
               "policy/clipfrac_region": 0.1})
    quiet(RULES["kl_too_small"](t, DEFAULT))


def test_kl_too_small_unavailable():
    out = RULES["kl_too_small"](table({"reward/mean": 0.3}), DEFAULT)
    assert isinstance(out, Unavailable)
    assert out.reason == "missing" and "policy/kl_behaviour_k1" in out.needs
    assert "reward/mean" not in out.needs  # present: never listed as missing
    # one inner epoch of one minibatch: the config makes it inapplicable, and says so
    cfg = run_config()
    cfg["config"]["run"]["inner_epochs"] = 1
    out = RULES["kl_too_small"](table({"policy/kl_behaviour_k1": 1e-6}, cfg), DEFAULT)
    assert isinstance(out, Unavailable) and out.reason == "config"
    assert "inner_epochs" in str(out)


# ---------------------------------------------------------------- value_instability

def test_value_instability_fires_on_a_spike_and_negative_explained_variance():
    loss = 0.5 + noise(14, 0.05)
    loss[30] = 5.0  # ~90 robust standard deviations above the median
    ev = np.where(STEPS < 30, 0.5, -0.2) + noise(15, 0.02)
    t = table({"loss/value": loss, "value/explained_var": ev})
    f = fired(RULES["value_instability"](t, DEFAULT), "value_instability")
    assert f.severity == "warning"
    assert f.evidence["spike_steps"] == [30.0]
    assert f.evidence["max_robust_z"] > 50
    assert f.step == 30.0
    assert f.evidence["explained_var_late_mean"] == pytest.approx(-0.2, abs=0.02)


def test_value_instability_fires_on_explained_variance_alone():
    f = fired(RULES["value_instability"](table({"value/explained_var": -0.1 + noise(15, 0.02)}),
                                         DEFAULT), "value_instability")
    assert "spike_steps" not in f.evidence
    assert f.step is None


def test_value_instability_stays_quiet():
    t = table({"loss/value": 0.5 + noise(14, 0.05), "value/explained_var": 0.6 + noise(15, 0.05)})
    quiet(RULES["value_instability"](t, DEFAULT))


def test_value_instability_unavailable():
    out = RULES["value_instability"](table({"reward/mean": 0.1}), DEFAULT)
    assert out == Unavailable(("loss/value", "value/explained_var"))


# ---------------------------------------------------------------- no_signal

def test_no_signal_fires_when_most_advantages_are_zero():
    frac = np.where(STEPS < 40, 0.2, 0.9)  # last window (steps 48..59) all 0.9
    f = fired(RULES["no_signal"](table({"adv/frac_zero": frac}), DEFAULT), "no_signal")
    assert f.severity == "warning"
    assert f.evidence["metric"] == "adv/frac_zero"
    assert f.evidence["last_window_mean"] == 0.9
    # (40·0.2 + 20·0.9)/60 = 26/60
    assert f.evidence["mean"] == pytest.approx(26 / 60, rel=1e-3)


def test_no_signal_reads_zero_std_groups():
    """TRL's frac_reward_zero_std directly; a mixed-group rate of 0.3 means 70% uniform."""
    f = fired(RULES["no_signal"](table({"frac_reward_zero_std": 0.7}), DEFAULT), "no_signal")
    assert f.evidence["metric"] == "frac_reward_zero_std"
    f = fired(RULES["no_signal"](table({"group/mixed_rate": 0.3}), DEFAULT), "no_signal")
    assert f.evidence["last_window_mean"] == pytest.approx(0.7)
    quiet(RULES["no_signal"](table({"group/mixed_rate": 0.9}), DEFAULT))


def test_no_signal_stays_quiet():
    quiet(RULES["no_signal"](table({"adv/frac_zero": 0.15 + noise(16, 0.02)}), DEFAULT))


def test_no_signal_unavailable():
    out = RULES["no_signal"](table({"reward/mean": 0.1}), DEFAULT)
    assert out == Unavailable(("adv/frac_zero", "frac_reward_zero_std", "group/mixed_rate",
                               "group/fallback"))


# ---------------------------------------------------------------- length_hacking

def length_scored() -> dict[str, Any]:
    cfg = run_config()
    cfg["config"]["task"] = "length_target"
    return cfg


def test_length_hacking_fires_when_length_rises_but_correctness_does_not():
    t = table({"length/mean": 100.0 + 3.0 * STEPS + noise(17, 3.0),
               "reward/mean": 0.1 + 0.01 * STEPS + noise(18, 0.01),
               "reward/correct": 0.4 + noise(19, 0.01)})
    f = fired(RULES["length_hacking"](t, DEFAULT), "length_hacking")
    assert f.severity == "warning"
    assert f.evidence["correlation"] > 0.9
    assert f.evidence["length_trend"]["direction"] == "up"
    assert f.evidence["correctness"]["metric"] == "reward/correct"
    assert f.evidence["correctness"]["direction"] == "flat"
    assert f.step is not None and f.step <= 3.0


def test_length_hacking_is_not_named_when_correctness_rises_with_length():
    """The issue's false report: a run scored for correctness whose length and reward
    correlate. Correctness improves with length, so length hacking fails its test."""
    t = table({"length/mean": 100.0 + 3.0 * STEPS + noise(17, 3.0),
               "reward/mean": 0.1 + 0.01 * STEPS + noise(18, 0.01),
               "reward/correct": 0.1 + 0.01 * STEPS + noise(19, 0.01)})
    quiet(RULES["length_hacking"](t, DEFAULT))
    # and with no correctness metric and no length-scored task, it says what it lacks
    t = table({"length/mean": 100.0 + 3.0 * STEPS + noise(17, 3.0),
               "reward/mean": 0.1 + 0.01 * STEPS + noise(18, 0.01)})
    out = RULES["length_hacking"](t, DEFAULT)
    assert isinstance(out, Unavailable) and "correctness metric" in out.needs[0]


def test_length_hacking_fires_on_collapsing_length_under_a_length_scored_task():
    t = table({"length/mean": 300.0 - 3.0 * STEPS + noise(17, 3.0),
               "reward/mean": 0.1 + 0.01 * STEPS + noise(18, 0.01)}, length_scored())
    f = fired(RULES["length_hacking"](t, DEFAULT), "length_hacking")
    assert f.evidence["correlation"] < -0.9
    assert f.evidence["length_trend"]["direction"] == "down"
    assert "length_target" in f.evidence["reward_depends_on_length"]


def test_length_hacking_fires_on_a_length_that_collapses_in_a_few_steps_and_holds():
    """Regression (corpus case rlscope_ppo_kl_runaway, PPO at lr 1e-2 on length_target): the
    mean length fell 76 → 7.5 → 2.2 → 1.2 in three steps and held at ~2 while the reward rose,
    yet the first-vs-last-window trend called it flat because the jump itself inflated the
    step-to-step noise (first window 15.1, last 2.0, noise 8.9). A change point (noise measured
    within each segment) finds the shift."""
    length = np.r_[76.3, 7.5, 2.2, 1.2, 1.5, 1.9, 1.4, 1.5, np.full(N - 8, 2.0)] \
        + np.r_[np.zeros(8), noise(17, 0.2, N - 8)]
    reward = 2.0 - length / 16 + noise(18, 0.005)
    t = table({"length/mean": length, "reward/mean": reward}, length_scored())
    from rlscope.doctor.stats import trend
    assert not trend(STEPS, length).exceeds_noise  # what the rule used to rely on alone
    f = fired(RULES["length_hacking"](t, DEFAULT), "length_hacking")
    assert f.evidence["length_shift"]["after"] < 3.0 < 20.0 < f.evidence["length_shift"]["before"]
    assert f.step == f.evidence["length_shift"]["step"] <= 4.0
    assert "length down" in f.title
    # a length that only wanders (no shift, no trend) stays quiet under the same task, even
    # with the reward following it exactly
    wander = 2.0 + noise(17, 0.2)
    quiet(RULES["length_hacking"](table({"length/mean": wander, "reward/mean": 2.0 - wander / 16},
                                        length_scored()), DEFAULT))


def test_length_hacking_stays_quiet():
    # reward rises while length stays put: no correlation, no length trend
    t = table({"length/mean": 200.0 + noise(17, 5.0),
               "reward/mean": 0.1 + 0.01 * STEPS + noise(18, 0.01)})
    quiet(RULES["length_hacking"](t, DEFAULT))


def test_length_hacking_unavailable():
    out = RULES["length_hacking"](table({"length/mean": 100.0}), DEFAULT)
    # only the missing metric is listed, never the one that is present
    assert out == Unavailable(("reward/mean",))
    assert str(out) == "needs reward/mean"
    out = RULES["length_hacking"](table({"x": 1.0}), DEFAULT)
    assert out == Unavailable(("length/mean", "reward/mean"), all_of=True)
    assert str(out) == "needs length/mean and reward/mean"


# ---------------------------------------------------------------- truncation

def test_truncation_fires_when_many_responses_hit_the_limit():
    ratio = np.where(STEPS < 40, 0.02, 0.3)  # last window all 0.3
    t = table({"length/clip_ratio": ratio}, run_config(stop=(2,)))
    f = fired(RULES["truncation"](t, DEFAULT), "truncation")
    assert f.severity == "warning"
    assert f.evidence["last_window_mean"] == 0.3
    assert f.evidence["trend"]["direction"] == "up"
    assert "30%" in f.title


def test_truncation_runs_without_a_recorded_config():
    f = fired(RULES["truncation"](table({"length/clip_ratio": 0.5}), DEFAULT), "truncation")
    assert f.evidence["last_window_mean"] == 0.5


def test_truncation_stays_quiet():
    t = table({"length/clip_ratio": np.abs(0.01 + noise(19, 0.002))}, run_config(stop=(2,)))
    quiet(RULES["truncation"](t, DEFAULT))


def test_truncation_unavailable():
    out = RULES["truncation"](table({"length/mean": 100.0}, run_config()), DEFAULT)
    assert out == Unavailable(("length/clip_ratio",))


def test_truncation_unavailable_without_stop_tokens():
    # fixed-length completions (stop_token_ids = []) end at the limit by design
    t = table({"length/clip_ratio": 1.0}, RUN_CONFIG)
    out = RULES["truncation"](t, DEFAULT)
    assert isinstance(out, Unavailable) and out.reason == "config"
    assert "stop token" in str(out)


# ---------------------------------------------------------------- sampler_mismatch

def mismatched() -> dict[str, np.ndarray]:
    return {"policy/ratio_mean_first": 1.02 + noise(20, 0.002),
            "sampler/frac_outside_band": 0.05 + noise(21, 0.005)}


@pytest.mark.parametrize("config", [
    {"config": "text", "method_spec": 3},
    {"config": {"run": "x", "sampling": [1], "optim": None}},
    {"config": {"run": {"delay": 0, "num_minibatches": "two", "inner_epochs": None},
                "replay": {"replay_capacity": "x"}, "optim": {"grad_clip": "1.0x"},
                "sampling": {"top_k": "x", "top_p": [0.9], "stop_token_ids": 3}},
     "method_spec": {"kl": {"control": "adaptive", "target_value": "six"}}},
], ids=["not_objects", "wrong_sections", "wrong_values"])
def test_a_config_of_the_wrong_types_counts_as_not_recorded(config: dict[str, Any]) -> None:
    """A foreign log's config (TRL keeps every top-level key of trainer_state.json) or a
    hand-edited config.json may hold anything under our keys: every rule still runs."""
    t = table(mismatched() | {"policy/kl_ref_seq_k1": np.linspace(1.0, 40.0, N),
                              "optim/grad_norm": 2.0 + noise(3, 0.1)}, config)
    findings, unavailable = diagnose(t, DEFAULT)
    assert "sampler_mismatch" in {f.id for f in findings}
    assert unavailable["grad_clip_saturation"].reason == "config"


def test_sampler_mismatch_fires_on_policy_with_the_sampling_cause():
    t = table(mismatched(), run_config(delay=0, top_p=0.9, mask=False))
    f = fired(RULES["sampler_mismatch"](t, DEFAULT), "sampler_mismatch")
    assert f.severity == "warning"
    assert f.evidence["ratio_mean_first_abs_dev"] == pytest.approx(0.02, rel=0.05)
    assert f.evidence["frac_outside_band"] == pytest.approx(0.05, rel=0.05)
    assert "top_p=0.9" in f.evidence["cause"]
    assert f.evidence["sampling"]["replay_sampling_mask"] is False
    assert f.confidence == 0.8


def test_sampler_mismatch_blames_numerics_without_a_sampling_cause():
    t = table({"sampler/logp_diff_mean": -0.01 + noise(22, 0.001)}, run_config(top_p=1.0))
    f = fired(RULES["sampler_mismatch"](t, DEFAULT), "sampler_mismatch")
    assert f.evidence["logp_diff_mean_abs"] == pytest.approx(0.01, rel=0.05)
    assert f.evidence["cause"].startswith("numerics")


def test_sampler_mismatch_stays_quiet_off_policy():
    # the same mismatch, but the run is delayed (off-policy): ratio ≠ 1 is expected
    t = table(mismatched(), run_config(delay=2, top_p=0.9, mask=False))
    quiet(RULES["sampler_mismatch"](t, DEFAULT))
    # a replay buffer is off-policy as well
    t = table(mismatched(), run_config(delay=0, replay_capacity=64))
    quiet(RULES["sampler_mismatch"](t, DEFAULT))


def test_sampler_mismatch_does_not_apply_with_several_minibatches():
    """With num_minibatches = 2 the first pass scores the second minibatch after the first
    one's optimizer step (measured on `rlscope train --method grpo --inner_epochs 4
    --num_minibatches 2`: first-pass k1 −0.03 and 24% clipped at step 0, which the rule called
    a mismatch): the check says why it cannot run instead."""
    cfg = run_config(delay=0)
    cfg["config"]["run"]["num_minibatches"] = 2
    out = RULES["sampler_mismatch"](table(mismatched(), cfg), DEFAULT)
    assert isinstance(out, Unavailable) and out.reason == "config"
    assert "num_minibatches = 2" in str(out)


def test_sampler_mismatch_stays_quiet_when_ratios_are_one():
    t = table({"policy/ratio_mean_first": 1.0 + noise(20, 1e-5),
               "sampler/frac_outside_band": 0.001}, run_config())
    quiet(RULES["sampler_mismatch"](t, DEFAULT))


def test_sampler_mismatch_unavailable():
    out = RULES["sampler_mismatch"](table({"policy/ratio_mean": 1.0}, run_config()), DEFAULT)
    assert out == Unavailable(("policy/ratio_mean_first", "sampler/frac_outside_band",
                               "sampler/logp_diff_mean", "policy/kl_behaviour_k2_first",
                               "policy/clipfrac_region_first", "policy/kl_behaviour_k1_first"))


def test_sampler_mismatch_names_a_systematic_offset_only_when_its_test_passes(tmp_path: Path):
    """tinker-cookbook's kl_sample_train_v1 (= −our first-pass k1) and _v2 (our k2) with no
    sampling config: a log-ratio shifted alike on every token (k1 −0.04, k2 0.0012, measured
    on the corpus's top-p run: k1² / 2·k2 = 0.70) is a systematic offset; zero-mean numerical
    noise (k1 ≈ −k2 = −0.002: share 0.001) is numerics."""
    t = foreign(tmp_path, {"optim/kl_sample_train_v1": 0.0417 + noise(23, 0.002),
                           "optim/kl_sample_train_v2": 0.00124 + noise(24, 1e-5),
                           "env/all/reward/total": 0.4})
    f = fired(RULES["sampler_mismatch"](t, DEFAULT), "sampler_mismatch")
    assert f.evidence["kl_behaviour_k1_first_mean"] == pytest.approx(-0.0417, rel=0.02)
    assert f.evidence["cause"].startswith("a systematic offset")
    share = 0.0417 ** 2 / (2 * 0.00124)
    assert f"{share:.0%}" in f.evidence["cause"]
    t = foreign(tmp_path, {"optim/kl_sample_train_v1": 0.002 + noise(23, 1e-4),
                           "optim/kl_sample_train_v2": 0.002 + noise(24, 1e-5),
                           "env/all/reward/total": 0.4})
    f = fired(RULES["sampler_mismatch"](t, DEFAULT), "sampler_mismatch")
    assert f.evidence["cause"].startswith("numerics")
    # the recorded sampling config, where there is one, is the cause
    t = table({"policy/kl_behaviour_k1_first": -0.0417, "policy/kl_behaviour_k2_first": 0.00124},
              run_config(delay=0, top_p=0.9, mask=False))
    f = fired(RULES["sampler_mismatch"](t, DEFAULT), "sampler_mismatch")
    assert "top_p=0.9" in f.evidence["cause"]


def test_sampler_mismatch_offset_test_with_a_huge_k1_does_not_overflow() -> None:
    """A corrupt log's huge first-pass k1: k1² is inf (a float power would raise
    OverflowError), a share of 1."""
    t = table({"policy/kl_behaviour_k1_first": -1e200, "policy/kl_behaviour_k2_first": 1.0})
    f = fired(RULES["sampler_mismatch"](t, DEFAULT), "sampler_mismatch")
    assert f.evidence["cause"].startswith("a systematic offset")
    assert "explains 100%" in f.evidence["cause"]


# ---------------------------------------------------------------- grad_clip_saturation

def test_grad_clip_saturation_fires_from_clip_active():
    active = np.where(STEPS % 10 == 0, 0.0, 1.0)  # 54 of 60 steps clipped
    t = table({"optim/clip_active": active, "optim/grad_norm": 3.0})
    f = fired(RULES["grad_clip_saturation"](t, DEFAULT), "grad_clip_saturation")
    assert f.severity == "info"
    assert f.evidence["frac_steps_clipped"] == 0.9
    assert f.evidence["grad_norm_median"] == 3.0


def test_grad_clip_saturation_fires_from_grad_norm_and_the_recorded_clip():
    # grad_clip 1.0 in the config; norms ≈ 2: every step is clipped
    t = table({"optim/grad_norm": 2.0 + noise(23, 0.1)}, run_config(grad_clip=1.0))
    f = fired(RULES["grad_clip_saturation"](t, DEFAULT), "grad_clip_saturation")
    assert f.evidence["frac_steps_clipped"] == 1.0


def test_grad_clip_saturation_stays_quiet():
    t = table({"optim/grad_norm": 0.5 + noise(23, 0.05)}, run_config(grad_clip=1.0))
    quiet(RULES["grad_clip_saturation"](t, DEFAULT))


def test_grad_clip_saturation_unavailable_without_a_recorded_clip():
    out = RULES["grad_clip_saturation"](table({"optim/grad_norm": 2.0}), DEFAULT)
    # the norm is present: the reason is the missing config value, not a missing metric
    assert isinstance(out, Unavailable) and out.reason == "config"
    assert "clip threshold is not recorded" in str(out)
    # grad_clip 0 (disabled) records no clip either
    out = RULES["grad_clip_saturation"](table({"optim/grad_norm": 2.0}, run_config(grad_clip=0)),
                                        DEFAULT)
    assert isinstance(out, Unavailable)


# ---------------------------------------------------------------- oscillation

def test_oscillation_fires_on_balanced_up_and_down_steps():
    # 0.6, 0.4, 0.6, ...: the 59 moves alternate down, up, ..., down: 30 downs and 29 ups,
    # |29 − 30|/59 = 0.017 < 0.2; both 12-step windows average 0.5, so the change is 0
    reward = alternating(0.5, 0.1)
    f = fired(RULES["oscillation"](table({"reward/mean": reward}), DEFAULT), "oscillation")
    assert f.severity == "info"
    tr = f.evidence["trend"]
    assert (tr["ups"], tr["downs"]) == (29, 30)
    assert tr["change"] == 0.0
    assert tr["direction"] == "flat"
    # differences ±0.2 alternate: σ = 0.2/√2
    assert tr["noise"] == pytest.approx(0.2 / math.sqrt(2), rel=1e-3)


def test_oscillation_stays_quiet_on_a_learning_curve():
    quiet(RULES["oscillation"](table({"reward/mean": 0.2 + 0.01 * STEPS + noise(24, 0.02)}),
                               DEFAULT))


def test_oscillation_stays_quiet_on_a_constant_reward():
    # no moves at all: nothing oscillates (and nothing divides by zero)
    quiet(RULES["oscillation"](table({"reward/mean": 0.5}), DEFAULT))


def test_oscillation_unavailable():
    assert RULES["oscillation"](table({"length/mean": 1.0}), DEFAULT) == \
        Unavailable(("reward/mean",))
    # it needs 2 × min_steps = 20 points
    short = table({"reward/mean": alternating(0.5, 0.1)[:15]}, steps=STEPS[:15])
    out = RULES["oscillation"](short, DEFAULT)
    assert isinstance(out, Unavailable) and out.reason == "too_few_steps"
    assert str(out) == "too few steps (reward/mean has 15 logged steps, the check needs 20)"


# ---------------------------------------------------------------- stale_replay

def test_stale_replay_fires_far_above_the_delay():
    t = table({"replay/age_mean": 12.0 + noise(25, 0.5)}, run_config(delay=0, replay_capacity=64))
    f = fired(RULES["stale_replay"](t, DEFAULT), "stale_replay")
    assert f.severity == "warning"
    assert f.evidence["delay"] == 0
    assert f.evidence["age_trend"]["last_mean"] == pytest.approx(12.0, abs=0.5)


def test_stale_replay_fires_when_the_age_keeps_rising():
    # ages 1 → 4: never 5 above the delay, but rising beyond noise
    t = table({"replay/age_mean": 1.0 + 3.0 * STEPS / 59 + noise(25, 0.05)})
    f = fired(RULES["stale_replay"](t, DEFAULT), "stale_replay")
    assert f.evidence["age_trend"]["direction"] == "up"


def test_stale_replay_stays_quiet():
    quiet(RULES["stale_replay"](table({"replay/age_mean": 2.0 + noise(26, 0.2)}), DEFAULT))
    # an age of 12 with a configured delay of 10 is within 5 steps of the delay
    t = table({"replay/age_mean": 12.0 + noise(25, 0.5)}, run_config(delay=10))
    quiet(RULES["stale_replay"](t, DEFAULT))


def test_stale_replay_unavailable():
    assert RULES["stale_replay"](table({"replay/size": 64.0}), DEFAULT) == \
        Unavailable(("replay/age", "replay/age_mean"))


def test_stale_replay_reads_the_trained_age_after_the_warm_up():
    # capacity 5, delay 4: the warm-up trains on fresh batches (age 0), then always on the
    # batch exactly 4 steps old; the buffer's mean age rises while it fills, which is no alarm
    age = np.where(STEPS < 4, 0.0, 4.0)
    buffer_mean = np.minimum(STEPS, 4.0) / 2.0
    t = table({"replay/age": age, "replay/age_mean": buffer_mean},
              run_config(delay=4, replay_capacity=5))
    quiet(RULES["stale_replay"](t, DEFAULT))
    # the same run with the trained age growing past the delay fires, naming the metric
    t = table({"replay/age": np.where(STEPS < 4, 0.0, 4.0 + STEPS / 5)},
              run_config(delay=4, replay_capacity=64))
    f = fired(RULES["stale_replay"](t, DEFAULT), "stale_replay")
    assert f.evidence["metric"] == "replay/age" and f.evidence["delay"] == 4


# ---------------------------------------------------------------- throughput_regression

def test_throughput_regression_fires_on_slower_steps_with_longer_responses():
    length = 100.0 + 5.0 * STEPS + noise(27, 2.0)
    step_t = 10.0 + 0.2 * STEPS + noise(28, 0.2)  # 10 s → ~22 s
    t = table({"time/step": step_t, "time/sample": 0.7 * step_t, "length/mean": length})
    f = fired(RULES["throughput_regression"](t, DEFAULT), "throughput_regression")
    assert f.severity == "warning"
    assert f.evidence["trend"]["direction"] == "up"
    assert f.evidence["trend"]["last_mean"] > 1.2 * f.evidence["trend"]["first_mean"]
    assert f.evidence["correlation_with_length"] > 0.95
    # time/sample is exactly 0.7 of time/step at every step
    assert f.evidence["generation_share"] == pytest.approx(0.7)


def test_throughput_regression_stays_quiet():
    quiet(RULES["throughput_regression"](table({"time/step": 10.0 + noise(28, 0.3),
                                                "length/mean": 200.0 + noise(27, 5.0)}),
                                         DEFAULT))
    # +10% beyond noise is under the 1.2× bar
    quiet(RULES["throughput_regression"](table({"time/step": 10.0 + STEPS / 59}), DEFAULT))


def test_throughput_regression_unavailable():
    assert RULES["throughput_regression"](table({"time/sample": 7.0}), DEFAULT) == \
        Unavailable(("time/step", "throughput/sample_tokens_per_s",
                     "throughput/learn_tokens_per_s", "perf/throughput"))


# ---------------------------------------------------------------- learning_verdict

def evals(name: str, values: list[float]) -> MetricTable:
    t = MetricTable(source="synthetic", fmt="test")
    for i, v in enumerate(values):
        t.add(10.0 * i, name, v)
    return t


def test_learning_verdict_warns_when_validation_gets_worse():
    # test error 0.2 → 0.4 in steps of 0.04: gain = 0.2 − 0.4 = −0.2; noise 0 (equal steps)
    t = evals("eval/test_error", [0.2, 0.24, 0.28, 0.32, 0.36, 0.4])
    f = fired(RULES["learning_verdict"](t, DEFAULT), "learning_verdict")
    assert f.severity == "warning"
    assert f.evidence["verdict"] == "getting worse"
    assert f.evidence["lower_is_better"] is True
    assert (f.evidence["first"], f.evidence["last"], f.evidence["best"]) == (0.2, 0.4, 0.2)
    assert f.evidence["evaluations"] == 6
    assert f.confidence == 0.8


def test_learning_verdict_warns_when_validation_is_flat_within_noise():
    # accuracy 0.5, 0.6, 0.5, 0.6, 0.5, 0.52: gain 0.02; differences ±0.1 and 0.02,
    # noise ≈ 0.07 ≫ gain/2
    t = evals("val-core/acc/mean@4", [0.5, 0.6, 0.5, 0.6, 0.5, 0.52])
    f = fired(RULES["learning_verdict"](t, DEFAULT), "learning_verdict")
    assert f.severity == "warning"
    assert f.evidence["verdict"] == "not improving beyond noise"
    assert f.evidence["lower_is_better"] is False
    assert f.evidence["best"] == 0.6


def test_learning_verdict_is_info_when_validation_improves():
    # the verdict always reports; on a healthy run it is an info "improving", never a warning
    t = evals("eval/test_error", [0.5, 0.45, 0.4, 0.35, 0.3, 0.25])
    f = fired(RULES["learning_verdict"](t, DEFAULT), "learning_verdict")
    assert f.severity == "info"
    assert f.evidence["verdict"] == "improving"
    assert (f.evidence["first"], f.evidence["last"], f.evidence["best"]) == (0.5, 0.25, 0.25)
    assert f.evidence["noise"] == pytest.approx(0.0, abs=1e-9)
    assert f.confidence == 0.9


def test_learning_verdict_with_two_evaluations_is_low_confidence():
    f = fired(RULES["learning_verdict"](evals("eval/test_error", [0.5, 0.4]), DEFAULT),
              "learning_verdict")
    assert f.evidence["verdict"] == "improving"
    assert f.confidence == 0.4


def test_learning_verdict_falls_back_to_the_training_reward_and_says_so():
    f = fired(RULES["learning_verdict"](table({"reward/mean": 0.2 + 0.01 * STEPS}), DEFAULT),
              "learning_verdict")
    assert f.evidence["basis"] == "training reward (no validation logged)"
    assert f.evidence["verdict"] == "improving" and f.confidence == 0.5


def test_learning_verdict_finds_a_jump_that_then_holds_inside_the_first_window():
    # reward 1.15 at step 0, then 1.93 ± 0.1 (alternating) for 29 steps: the first window
    # holds the jump, so first vs last window is within noise; the change point is at step 1
    steps = np.arange(30, dtype=float)
    reward = np.where(steps == 0, 1.15, 1.93 + 0.1 * (-1.0) ** steps)
    f = fired(RULES["learning_verdict"](table({"reward/mean": reward}, steps=steps), DEFAULT),
              "learning_verdict")
    assert f.evidence["verdict"] == "improving"
    assert f.evidence["shift"]["step"] == 1.0
    assert f.evidence["shift"]["before"] == pytest.approx(1.15)
    assert f.evidence["shift"]["after"] == pytest.approx(1.93, abs=0.01)
    assert f.step == 1.0 and "a shift at step 1" in f.title
    # the same noise without the jump stays "not improving beyond noise", with no shift
    flat = fired(RULES["learning_verdict"](table({"reward/mean": 1.93 + 0.1 * (-1.0) ** steps},
                                                 steps=steps), DEFAULT), "learning_verdict")
    assert flat.evidence["verdict"] == "not improving beyond noise"
    assert "shift" not in flat.evidence


def test_an_entropy_collapse_is_a_caveat_of_an_improving_verdict():
    steps = np.arange(30, dtype=float)
    reward = np.where(steps == 0, 1.15, 1.93 + 0.1 * (-1.0) ** steps)
    entropy = np.where(steps < 4, 0.9, 3e-4)
    findings, _ = diagnose(table({"reward/mean": reward, "policy/entropy": entropy},
                                 steps=steps))
    verdict = next(f for f in findings if f.id == "learning_verdict")
    assert any(f.id == "entropy_collapse" for f in findings)
    [caveat] = [c for c in verdict.evidence["caveats"] if "entropy collapsed" in c]
    assert caveat.startswith("entropy collapsed at step 4")
    assert "one shift at step 1 that then held" in caveat
    # the reward held flat after the shift: that plateau stalls it, so no "keep training"
    assert verdict.actions[0].startswith("fix what stalls it before training longer")
    assert not any(a.startswith("keep training") for a in verdict.actions)


def test_learning_verdict_unavailable():
    out = RULES["learning_verdict"](table({"length/mean": 0.5}), DEFAULT)
    assert isinstance(out, Unavailable)
    assert "eval/test_error" in out.needs
    # one evaluation is not a comparison
    assert isinstance(RULES["learning_verdict"](evals("eval/test_error", [0.5]), DEFAULT),
                      Unavailable)


# ---------------------------------------------------------------- thresholds

def pattern_tables() -> dict[str, tuple[MetricTable, dict[str, Any]]]:
    """rule id → (a table where it fires at the default, a config override that silences it)."""
    amp = amplification(15)
    spike = 0.5 + noise(14, 0.05)
    spike[30] = 5.0
    return {
        # lowering the floor (0.2 → 0.001·2 = 0.002 or 0.001) leaves the last window above it
        "entropy_collapse": (table({"policy/entropy": collapsing_entropy()}),
                             {"entropy_floor": 0.001, "entropy_floor_frac": 0.001}),
        "sigma_amplification": (table({"adv/amplification": amp}), {"amplification": 10.0}),
        "negative_kl": (table({"policy/kl_ref_k1": alternating(-6e-4, 1e-3)}),
                        {"kl_negative_tol": 1e-3}),
        # 27.7 < 10 × 6; and growth 5.9 → 27.7 is under 10×
        "kl_runaway": (table({"policy/kl_ref_seq_k1": 5.0 + 25.0 * STEPS / 59}, run_config()),
                       {"kl_runaway_factor": 10.0}),
        "kl_too_small": (table({"policy/kl_behaviour_k1": 1e-6,
                                "reward/mean": 0.3 + noise(13, 0.02)}), {"kl_small": 1e-7}),
        "value_instability": (table({"loss/value": spike}), {"value_spike_z": 1000.0}),
        "no_signal": (table({"adv/frac_zero": 0.9}), {"no_signal_frac": 0.95}),
        "length_hacking": (table({"length/mean": 100.0 + 3.0 * STEPS + noise(17, 3.0),
                                  "reward/mean": 0.1 + 0.01 * STEPS + noise(18, 0.01)},
                                 length_scored()), {"length_corr": 1.0}),
        "truncation": (table({"length/clip_ratio": 0.3}, run_config()), {"clip_ratio": 0.5}),
        "sampler_mismatch": (table(mismatched(), run_config(top_p=0.9)),
                             {"mismatch_tol": 0.1, "outside_band": 0.1}),
        "grad_clip_saturation": (table({"optim/clip_active": 0.9}), {"clip_saturation": 0.95}),
        "stale_replay": (table({"replay/age_mean": 12.0}), {"stale_age": 20.0}),
    }


@pytest.mark.parametrize("rule_id", list(pattern_tables()))
def test_a_threshold_silences_a_finding_that_fires_at_the_default(rule_id):
    t, override = pattern_tables()[rule_id]
    rule = RULES[rule_id]
    fired(rule(t, DEFAULT), rule_id)
    quiet(rule(t, replace(DEFAULT, **override)))


@pytest.mark.parametrize("rule_id", ["entropy_collapse", "entropy_rising", "kl_runaway",
                                     "value_instability", "length_hacking",
                                     "grad_clip_saturation", "oscillation",
                                     "throughput_regression"])
def test_min_steps_makes_trend_rules_unavailable(rule_id):
    t = healthy_table()
    assert not isinstance(RULES[rule_id](t, DEFAULT), Unavailable)
    assert isinstance(RULES[rule_id](t, replace(DEFAULT, min_steps=N + 1)), Unavailable)


# ---------------------------------------------------------------- causes and diagnose

def finding(rule_id: str, step: float | None) -> Finding:
    return Finding(rule_id, "warning", rule_id, {}, "", ("",), 0.5, step=step)


def test_link_causes_by_hand():
    collapse = finding("entropy_collapse", 36.0)
    linked = link_causes([finding("sigma_amplification", 15.0), collapse])
    assert linked[1].causes == ("sigma_amplification",)
    assert linked[0].causes == ()
    # amplification that starts after the collapse is not its cause
    assert link_causes([finding("sigma_amplification", 45.0), collapse])[1].causes == ()
    # no amplification: nothing linked
    assert link_causes([collapse])[0].causes == ()


@pytest.mark.parametrize(("amp_start", "causes"), [(15, ("sigma_amplification",)), (45, ())])
def test_diagnose_links_amplification_before_collapse(amp_start, causes):
    t = table({"policy/entropy": collapsing_entropy(),
               "adv/amplification": amplification(amp_start)})
    findings, unavailable = diagnose(t)
    by_id = {f.id: f for f in findings}
    assert by_id["sigma_amplification"].step == float(amp_start)
    assert by_id["entropy_collapse"].step == 36.0
    assert by_id["entropy_collapse"].causes == causes
    # rules lacking their metrics are listed, not guessed
    assert "learning_verdict" in unavailable and "truncation" in unavailable


def test_diagnose_on_a_healthy_run_raises_no_warning():
    findings, unavailable = diagnose(healthy_table())
    assert [f for f in findings if f.severity in ("warning", "critical")] == []
    # every rule ran on this table
    assert unavailable == {}
    # what remains is the verdict: improving
    verdict = [f for f in findings if f.id == "learning_verdict"]
    assert len(verdict) == 1 and verdict[0].evidence["verdict"] == "improving"


@pytest.mark.parametrize("rule_id", list(RULES))
def test_every_rule_stays_quiet_on_the_healthy_run(rule_id):
    out = RULES[rule_id](healthy_table(), DEFAULT)
    assert isinstance(out, list)
    if rule_id == "learning_verdict":
        assert [f.severity for f in out] == ["info"]
    else:
        assert out == []


@pytest.mark.parametrize("rule_id", list(RULES))
def test_every_rule_survives_constant_and_short_series(rule_id):
    # constant series of every metric, at the minimum length and at 3 points: no crash,
    # no nan in the evidence
    series = {name: 0.5 for name in healthy_series()} | {"eval/test_error": 0.3,
                                                         "policy/clipfrac_region": 0.0,
                                                         "kl_ctrl/beta": 0.1}
    for n in (3, DEFAULT.min_steps, 2 * DEFAULT.min_steps):
        out = RULES[rule_id](table(series, run_config(), steps=np.arange(float(n))), DEFAULT)
        if isinstance(out, Unavailable):
            continue
        for f in out:
            json.dumps(f.as_dict(), allow_nan=False)
        # a constant series has no trend; only level rules may fire on its values (a clip
        # ratio of 0.5 is truncation, a first-pass ratio of 0.5 a mismatch, any skipped step
        # a non-finite gradient), and the verdict on a flat evaluation is "not improving"
        if rule_id == "learning_verdict":
            assert [f.evidence["verdict"] for f in out] == ["not improving beyond noise"]
        elif rule_id in ("truncation", "sampler_mismatch", "nonfinite_gradients",
                         "negative_kl"):  # k1 = +0.5: a behaviour KL of −0.5
            assert [f.id for f in out] == [rule_id]
        elif rule_id == "reward_plateau":  # a constant reward never moved: that is a plateau
            assert [f.evidence["moved_before"] for f in out] in ([], [False])
        else:
            assert out == [], (rule_id, n, out)


def test_throughput_regression_ignores_slower_steps_at_constant_length():
    """Steps 10 s → 22 s while length stays at 200 tokens: the machine slowed, not the run."""
    t = table({"time/step": 10.0 + 0.2 * STEPS + noise(28, 0.2),
               "length/mean": 200.0 + noise(27, 2.0)})
    quiet(RULES["throughput_regression"](t, DEFAULT))


def test_kl_too_small_needs_a_kl_measured_after_an_update():
    """One inner epoch of one minibatch: the last pass is also before any update (KL 0)."""
    config = run_config()
    config["config"]["run"] |= {"inner_epochs": 1, "num_minibatches": 1}
    out = RULES["kl_too_small"](table({"policy/kl_behaviour_k1": 1e-6, "reward/mean": 0.3},
                                      config), DEFAULT)
    assert isinstance(out, Unavailable) and "after an update" in out.needs[0]


def test_sampler_mismatch_reads_first_pass_clipping():
    t = table({"policy/ratio_mean_first": 1.0, "policy/clipfrac_region_first": 0.02},
              run_config())
    f = fired(RULES["sampler_mismatch"](t, DEFAULT), "sampler_mismatch")
    assert f.evidence["clipfrac_region_first"] == pytest.approx(0.02)


def test_kl_runaway_ignores_steady_linear_growth_without_a_target():
    """0.001 → 0.2 nats/token, linear: 100× its first window but neither above the 0.5
    ceiling nor accelerating (both thirds share one slope)."""
    quiet(RULES["kl_runaway"](table({"policy/kl_ref_k1": 0.001 + 0.2 * STEPS / 59}), DEFAULT))


def test_kl_runaway_fires_on_accelerating_growth_below_the_ceiling():
    """Linear 0.0025/step to step 40, then doubling every 8 steps: last third's slope ≫ the
    first two thirds', though the KL ends below 0.5."""
    kl = np.where(STEPS <= 40, 0.0025 * STEPS, 0.1 * 2 ** ((STEPS - 40) / 8))
    f = fired(RULES["kl_runaway"](table({"policy/kl_ref_k1": kl}), DEFAULT), "kl_runaway")
    assert f.evidence["slope_late"] > 3 * f.evidence["slope_early"]
    assert f.evidence["trend"]["last_mean"] < 0.5


def test_nonfinite_gradients_fires_on_skipped_steps_and_not_otherwise():
    n = np.zeros(len(STEPS))
    n[[7, 9]] = [1, 2]
    f = fired(RULES["nonfinite_gradients"](table({"optim/nonfinite_steps": n}), DEFAULT),
              "nonfinite_gradients")
    assert f.evidence["skipped_optimizer_steps"] == 3
    assert f.evidence["training_steps_affected"] == 2
    assert f.evidence["first_step"] == float(STEPS[7]) == f.step
    quiet(RULES["nonfinite_gradients"](table({"optim/nonfinite_steps": 0.0}), DEFAULT))


def test_nonfinite_gradients_with_counts_whose_sum_overflows_still_reports():
    """A corrupt log's counts (finite, but summing to ±inf or NaN) give a capped count, not an
    OverflowError."""
    n = np.zeros(len(STEPS))
    n[[3, 5, 7, 9]] = [-1e308, -1e308, 1e308, 1e308]  # a negative count is no skipped step
    f = fired(RULES["nonfinite_gradients"](table({"optim/nonfinite_steps": n}), DEFAULT),
              "nonfinite_gradients")
    assert f.evidence["skipped_optimizer_steps"] == 2 ** 53
    assert f.evidence["training_steps_affected"] == 2
    assert f.evidence["first_step"] == float(STEPS[7])


# ---------------------------------------------------------------- events (issue 16)

def test_reward_peak_then_fall_reports_the_peak_step_and_the_fall():
    """Reward rises 0.1 → 0.7 at step 30 then falls by a third to ~0.47: "peak at step 30
    then fell by 33%", not "no trend"."""
    r = np.where(STEPS < 30, 0.1 + 0.02 * STEPS, 0.7 - 0.233 * (STEPS - 30) / 29) \
        + noise(40, 0.01)
    t = table({"reward/mean": r})
    f = fired(RULES["reward_peak_fall"](t, DEFAULT), "reward_peak_fall")
    assert abs(f.evidence["peak_step"] - 30) <= 1 and f.step == f.evidence["peak_step"]
    # last window (steps 48–59) mean ≈ 0.7 − 0.233·23.5/29 ≈ 0.511: 27% of the peak value
    assert f.evidence["fall_frac"] == pytest.approx(0.27, abs=0.04)
    assert "then fell by" in f.title
    # and the oscillation rule does not call it "up and down with no trend"
    findings, _ = diagnose(t)
    assert "oscillation" not in {x.id for x in findings}
    quiet(RULES["reward_peak_fall"](table({"reward/mean": 0.1 + 0.01 * STEPS}), DEFAULT))


def test_reward_plateau_after_a_rise_names_its_start():
    r = np.where(STEPS < 20, 0.1 + 0.02 * STEPS, 0.5) + noise(41, 0.01)
    f = fired(RULES["reward_plateau"](table({"reward/mean": r}), DEFAULT), "reward_plateau")
    assert abs(f.evidence["start_step"] - 20) <= 1
    assert f.evidence["moved_before"] is True and f.severity == "info"
    assert f.evidence["frac_steps"] == pytest.approx(40 / 60, abs=0.03)
    # at the logged ceiling it is convergence
    t = table({"reward/mean": r, "reward/max": 0.51})
    assert fired(RULES["reward_plateau"](t, DEFAULT), "reward_plateau").evidence["at_ceiling"]
    # a reward that never moved is a warning
    flat = fired(RULES["reward_plateau"](table({"reward/mean": 0.3 + noise(46, 0.01)}),
                                         DEFAULT), "reward_plateau")
    assert flat.severity == "warning" and flat.evidence["moved_before"] is False
    quiet(RULES["reward_plateau"](table({"reward/mean": 0.1 + 0.01 * STEPS}), DEFAULT))


def test_truncation_rising_steadily_is_reported_with_its_onset():
    """The issue's verl DAPO miss: the clip ratio rises steadily but stays under 10%."""
    ratio = np.where(STEPS < 20, 0.0, 0.002 * (STEPS - 20)) + np.abs(noise(42, 0.002))
    t = table({"length/clip_ratio": ratio}, run_config(stop=(2,)))
    f = fired(RULES["truncation"](t, DEFAULT), "truncation")
    assert f.evidence["last_window_mean"] < DEFAULT.clip_ratio
    assert abs(f.evidence["onset_step"] - 20) <= 2
    assert "rise steadily" in f.title


def test_truncation_point_check_from_one_step():
    one = table({"length/clip_ratio": 0.4}, steps=np.array([0.0]))
    f = fired(RULES["truncation"](one, DEFAULT), "truncation")
    assert f.evidence["last_window_mean"] == 0.4


def test_throughput_falling_is_reported_with_its_onset():
    """Tokens per second flat at 1000 until step 25, then falling to ~600 (verl's
    perf/throughput, kept under its own name)."""
    tp = np.where(STEPS < 25, 1000.0, 1000.0 - 12.0 * (STEPS - 25)) + noise(43, 5.0)
    f = fired(RULES["throughput_regression"](table({"perf/throughput": tp}), DEFAULT),
              "throughput_regression")
    assert abs(f.evidence["throughput"]["onset_step"] - 25) <= 2
    assert f.evidence["throughput"]["fall"] > 0.3
    assert "throughput fell" in f.title


def test_sampler_mismatch_growing_by_orders_of_magnitude_has_onset_and_factor():
    k2 = 1e-5 * 10 ** (np.maximum(0.0, STEPS - 30) / 8) * np.exp(noise(44, 0.1))
    t = table({"policy/kl_behaviour_k2_first": k2}, run_config())
    f = fired(RULES["sampler_mismatch"](t, DEFAULT), "sampler_mismatch")
    g = f.evidence["growth"]
    assert g["metric"] == "policy/kl_behaviour_k2_first"
    # last window (steps 48–59): 10^((53.5 − 30)/8) ≈ 870×
    assert abs(g["onset_step"] - 30) <= 1 and 300 < g["factor"] < 3000
    assert f.step == g["onset_step"] and "grew" in f.title


def test_point_checks_run_on_one_step():
    one = np.array([0.0])
    t = table({"sampler/frac_outside_band": 0.3, "adv/frac_zero": 0.9,
               "policy/kl_behaviour_k1": -1e-6, "length/clip_ratio": 0.5}, steps=one)
    findings, unavailable = diagnose(t)
    assert {"sampler_mismatch", "no_signal", "kl_too_small", "truncation"} <= {
        f.id for f in findings}
    # trend rules say "too few steps" for a metric that is there, never "needs" it
    t3 = table({"policy/entropy": 1.0, "reward/mean": 0.2}, steps=np.arange(3.0))
    _, unavailable = diagnose(t3)
    assert unavailable["entropy_collapse"].reason == "too_few_steps"
    assert "policy/entropy has 3 logged steps" in str(unavailable["entropy_collapse"])


def test_unavailable_never_lists_a_metric_that_is_present():
    """Every rule on tables holding subsets of the healthy metrics, long and short (1, 3 and 6
    steps, below the trend rules' minimum): a 'missing' reason names only metrics absent from
    the table (a short one is 'too few steps')."""
    names = sorted(healthy_series())
    rng = np.random.default_rng(0)
    for i in range(40):
        keep = [n for n in names if rng.random() < 0.5]
        n_steps = (N, 1, 3, 6)[i % 4]
        t = table({n: healthy_series()[n][:n_steps] for n in keep},
                  steps=STEPS[:n_steps])
        _, unavailable = diagnose(t)
        for rule_id, u in unavailable.items():
            if u.reason == "missing":
                assert not any(t.has(n) for n in u.needs), (rule_id, u, keep)


# ---------------------------------------------------------------- conflicts, verdict, advice

def test_kl_too_small_removes_lower_the_learning_rate_from_other_findings():
    """KL ~1e-6 at lr 1e-6 with a collapsed entropy: the collapse must not advise lowering the
    learning rate (the issue's contradiction)."""
    t = table({"policy/kl_behaviour_k1": 1e-6, "optim/lr": 1e-6,
               "reward/mean": 0.3 + noise(13, 0.02),
               "policy/entropy": collapsing_entropy()}, run_config())
    findings, _ = diagnose(t)
    by_id = {f.id: f for f in findings}
    assert "kl_too_small" in by_id and "entropy_collapse" in by_id
    for f in findings:
        if f.id != "kl_too_small":
            assert not any(a.startswith("lower the learning rate") for a in f.actions), f.id
    assert "advice_removed" in by_id["entropy_collapse"].evidence
    assert by_id["kl_too_small"].actions[0].startswith("raise the learning rate")


def test_verdict_is_not_keep_training_beside_collapse_and_zero_variance_groups():
    t = table({"policy/entropy": collapsing_entropy(), "frac_reward_zero_std": 0.9,
               "reward/mean": 0.2 + 0.005 * STEPS + noise(45, 0.01)})
    t.add(0.0, "eval_reward", 0.1)
    t.add(30.0, "eval_reward", 0.2)
    t.add(59.0, "eval_reward", 0.3)
    findings, _ = diagnose(t)
    verdict = next(f for f in findings if f.id == "learning_verdict")
    assert verdict.evidence["verdict"] == "improving, but stalling"
    assert "keep training" not in verdict.actions
    assert verdict.severity == "warning"
    assert set(verdict.evidence["weighed"]) >= {"entropy_collapse_step", "zero_signal_frac"}
    assert "90% of groups carry no reward variance" in verdict.actions[0]


def test_actions_name_the_source_frameworks_settings():
    from rlscope.doctor.advice import framework_of, render_action

    collapse = {"policy/entropy": collapsing_entropy()}
    for fmt, expected, absent in (
            ("verl", "`actor_rollout_ref.actor.optim.lr`", "--lr"),
            ("trl", "`learning_rate`", "--lr"),
            ("tinker", "`learning_rate`", "--lr"),
            ("run", "`--lr`", "actor_rollout_ref")):
        t = table(collapse)
        t.fmt = fmt
        findings, _ = diagnose(t)
        f = next(x for x in findings if x.id == "entropy_collapse")
        text = " ".join(f.actions)
        assert expected in text and absent not in text, (fmt, text)
        assert f.evidence["framework"] == framework_of(t)
    # TRL's GRPOConfig has no entropy bonus: that action is dropped, not given an rlscope flag
    t = table(collapse)
    t.fmt = "trl"
    f = next(x for x in diagnose(t)[0] if x.id == "entropy_collapse")
    assert not any("entropy bonus" in a for a in f.actions)
    assert any("`epsilon_high`" in a for a in f.actions)
    assert render_action("raise β ({kl_coef})", "tinker") == "raise β (`kl_penalty_coef`)"
    assert render_action("x ({adv_std_floor})", "verl") == "x"
    # TRL's PPO trainer (classic names) gets PPOConfig fields
    t = table({"objective/kl": 1.0})
    t.fmt = "wandb"
    t.original["policy/kl_ref_seq_k1"] = "objective/kl"
    assert framework_of(t) == "trl_ppo"


def test_a_trl_ppo_wandb_history_with_the_train_prefix_gets_ppoconfig_advice(tmp_path: Path):
    """transformers' W&B callback writes `train/objective/kl`, `train/ppo/loss/value`: the
    prefix does not hide that the log is TRL's PPO trainer."""
    from rlscope.doctor.advice import framework_of

    t = foreign(tmp_path, {"train/objective/kl": 1.0, "train/ppo/loss/value": 0.1,
                           "train/env/reward_mean": 0.3})
    assert t.framework == "trl" and t.original["loss/value"] == "train/ppo/loss/value"
    assert framework_of(t) == "trl_ppo"


def test_kl_too_small_does_not_read_a_kl_that_is_zero_to_float_precision(tmp_path: Path):
    """verl's actor/ppo_kl with one epoch of one mini-batch is ~1e-9 every step: measured
    before any update, it says nothing about the update size."""
    t = foreign(tmp_path, {"actor/ppo_kl": 2e-9 * (1 + noise(47, 0.3)),
                           "critic/score/mean": 0.3})
    out = RULES["kl_too_small"](t, DEFAULT)
    assert isinstance(out, Unavailable) and out.reason == "config"
    assert "zero to float precision" in str(out)


def test_kl_runaway_with_only_a_sequence_kl_and_no_target_says_what_is_missing():
    """TRL PPO's objective/kl is per sequence; with no adaptive target recorded, the reason
    is the missing target, not a 'missing' KL that is in the log."""
    out = RULES["kl_runaway"](table({"policy/kl_ref_seq_k1": 5.0 + STEPS}), DEFAULT)
    assert isinstance(out, Unavailable) and out.reason == "config"
    assert "no adaptive KL target is recorded" in str(out)


def test_entropy_rising_reports_its_onset():
    h = np.where(STEPS < 30, 1.0, 1.0 + 0.05 * (STEPS - 30)) + noise(48, 0.01)
    t = table({"policy/entropy": h, "length/mean": 100.0 + 2.0 * STEPS + noise(49, 1.0)})
    f = fired(RULES["entropy_rising"](t, DEFAULT), "entropy_rising")
    assert abs(f.evidence["onset_step"] - 30) <= 1 and f.step == f.evidence["onset_step"]


def test_verdict_on_training_reward_is_stalling_when_it_peaked_and_fell():
    """No validation: the training reward's peak and fall are the verdict's own basis, so
    they stall it (no 'keep training' left in any form)."""
    r = np.where(STEPS < 20, 0.1 + 0.03 * STEPS, 0.7 - 0.3 * (STEPS - 20) / 39) + noise(50, 0.01)
    t = table({"reward/mean": r, "policy/kl_behaviour_k1": 1e-6}, run_config())
    findings, _ = diagnose(t)
    verdict = next(f for f in findings if f.id == "learning_verdict")
    assert verdict.evidence["basis"].startswith("training reward")
    assert any("peaked at step" in s for s in verdict.evidence["stalled_by"])
    assert not any(a.startswith("keep training") for a in verdict.actions)


# ---------------------------------------------------------------- rank_imbalance

def test_rank_imbalance_fires_on_a_slow_rank_and_names_the_phase():
    # the slowest rank samples 60% longer than the mean; learning is balanced
    t = table({"time/step": 10.0 + noise(31, 0.1), "time/step_mean": 7.0 + noise(32, 0.1),
               "time/sample": 8.0 + noise(33, 0.1), "time/sample_mean": 5.0 + noise(34, 0.1),
               "time/learn": 2.0 + noise(35, 0.01), "time/learn_mean": 2.0 + noise(36, 0.01)})
    f = fired(RULES["rank_imbalance"](t, DEFAULT), "rank_imbalance")
    assert f.evidence["worst_phase"] == "time/sample"
    assert 0.35 < f.evidence["median_gap"] < 0.5
    assert f.step == STEPS[0]


def test_rank_imbalance_stays_quiet_on_balanced_ranks():
    t = table({"time/step": 10.0 + noise(37, 0.1), "time/step_mean": 9.5 + noise(38, 0.1)})
    quiet(RULES["rank_imbalance"](t, DEFAULT))
    quiet(RULES["rank_imbalance"](table({"time/step": 10.0 + noise(39, 0.1),
                                         "time/step_mean": 6.0 + noise(40, 0.1)}),
                                  replace(DEFAULT, rank_imbalance=1.0)))


def test_rank_imbalance_does_not_apply_to_single_process_runs():
    quiet(RULES["rank_imbalance"](table({"time/step": 7.0 + noise(41, 0.1)}), DEFAULT))
    assert RULES["rank_imbalance"](table({"time/step_mean": 7.0 + noise(42, 0.1)}),
                                   DEFAULT) == Unavailable(("time/step",))
