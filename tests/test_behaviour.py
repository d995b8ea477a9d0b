"""One behavioural test per method family on the sandbox (issue 4).

Each test runs a family's preset and a contrast on seeds 0, 1 and 2 and checks a property
the family is built for. The thresholds leave a margin below numbers measured on this machine
(2-core CPU, torch 2.13, 2 threads). Those numbers are quoted in each docstring as
(seed 0, seed 1, seed 2); the same seed gives the same numbers on the same device.

The runs use ``--embed_init balanced``, the init those numbers were measured under (the init
before `ModelConfig.embed_init` existed, bit-identical): the tests check each family's
mechanism, and under the default reference init the regime differs (issue 15).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from rlscope.config import ModelConfig, RunConfig, TrainConfig
from rlscope.replay import ReplayConfig
from rlscope.train import RunResult, train

SEEDS = (0, 1, 2)


def _run(tmp_path: Path, method: str, seed: int, steps: int, task: str = "token_reversal",
         replay: ReplayConfig | None = None, **run: Any) -> RunResult:
    cfg = TrainConfig(method=method, task=task, replay=replay or ReplayConfig(),
                      # digits_bandit trains its own MLP, which has no embedding init
                      model=ModelConfig(embed_init="balanced" if task != "digits_bandit"
                                        else "reference"),
                      run=RunConfig(seed=seed, num_steps=steps, eval_every=0, progress=False,
                                    device="cpu", log_samples=0, runs_dir=str(tmp_path),
                                    name=f"{method}_s{seed}", **run))
    result = train(cfg)
    assert result.status == "completed"
    return result


def _final_errors(tmp_path: Path, method: str, steps: int, **kw: Any) -> list[float]:
    return [_run(tmp_path, method, seed, steps, **kw).final_eval["eval/test_error"]
            for seed in SEEDS]


def test_dapo_clip_higher_leaves_fewer_tokens_clipped_above(tmp_path: Path) -> None:
    """PPO-clip family. DAPO's ε_high = 0.28 lets a positive-advantage token's ratio rise to
    1.28 where GRPO clips it at 1.2. Over 20 steps of 4 inner epochs (batch 48), the
    mean upper clip fraction falls and the largest ratio rises.
    Measured upper clip fraction: grpo (.0543, .0524, .0504), dapo (.0385, .0382, .0336).
    Measured mean ratio_max: grpo (1.739, 1.774, 1.687), dapo (1.864, 1.942, 1.677).
    The issue's example says clip-higher *raises* the upper clip fraction. That holds only if
    the fraction is counted at GRPO's bound: counted at its own higher bound, DAPO clips fewer
    tokens."""
    stats: dict[str, list[tuple[float, float]]] = {}
    for method in ("grpo", "dapo"):
        stats[method] = []
        for seed in SEEDS:
            rows = _run(tmp_path, method, seed, 20, batch_size=48, inner_epochs=4).metrics
            stats[method].append((statistics.mean(r["policy/clipfrac_high"] for r in rows),
                                  statistics.mean(r["policy/ratio_max"] for r in rows)))
    for (grpo_high, _), (dapo_high, _) in zip(stats["grpo"], stats["dapo"], strict=True):
        assert dapo_high < 0.85 * grpo_high
    assert statistics.mean(s[1] for s in stats["dapo"]) > \
        statistics.mean(s[1] for s in stats["grpo"]) + 0.03


def test_tpo_token_solves_the_scored_suffix_of_masked_reversal(tmp_path: Path) -> None:
    """TPO family, candidate form. With 8 next-token candidates per prefix and dense rewards,
    60 steps bring masked_reversal's held-out error (on the scored suffix) from about 0.7 to
    (0.000, 0.000, 0.012)."""
    errors = _final_errors(tmp_path, "tpo_token", 60, task="masked_reversal")
    assert max(errors) <= 0.05, errors


def test_tpo_anchor_beats_the_reward_only_target(tmp_path: Path) -> None:
    """TPO family, group form. 60 steps on token_reversal: tpo (0.242, 0.187, 0.263) against
    tpo_no_anchor (0.308, 0.278, 0.286). The behaviour anchor keeps the target near what the
    policy can reach."""
    anchored = _final_errors(tmp_path, "tpo", 60)
    no_anchor = _final_errors(tmp_path, "tpo_no_anchor", 60)
    assert statistics.mean(anchored) < statistics.mean(no_anchor) - 0.03, (anchored, no_anchor)


def test_tpo_full_action_beats_reinforce_on_digits(tmp_path: Path) -> None:
    """TPO family, full-action form. 100 steps on digits_bandit: tpo_full_action (0.447, 0.511,
    0.524) against reinforce (0.791, 0.553, 0.549). Every class gets a target, not only the
    sampled one."""
    full = _final_errors(tmp_path, "tpo_full_action", 100, task="digits_bandit")
    reinforce = _final_errors(tmp_path, "reinforce", 100, task="digits_bandit")
    assert all(f < r for f, r in zip(full, reinforce, strict=True)), (full, reinforce)
    assert statistics.mean(full) < statistics.mean(reinforce) - 0.05


def test_label_distillation_speeds_up_dg(tmp_path: Path) -> None:
    """Delight family with a supervised term. 40 steps on token_reversal: dg (0.295, 0.294,
    0.313), self_distill_dg (0.132, 0.070, 0.134), scope_lite (0.141, 0.080, 0.113)."""
    dg = _final_errors(tmp_path, "dg", 40)
    for method in ("self_distill_dg", "scope_lite"):
        errors = _final_errors(tmp_path, method, 40)
        assert all(e < d - 0.1 for e, d in zip(errors, dg, strict=True)), (method, errors, dg)


def test_stale_replay_degrades_dg_and_freshness_weighting_limits_it(tmp_path: Path) -> None:
    """Delight family off-policy. With a 32-batch replay buffer sampled uniformly, the trained
    batch is on average 16 steps stale. After 100 steps replay_dg's error is (0.513, 0.934,
    0.501), fresh_dg's with a strong age decay (λ_age = 0.5) is (0.341, 0.488, 0.444), and
    on-policy dg's is (0.005, 0.033, 0.053)."""
    # uniform draws (not the default fresh_delight): the gate alone limits the staleness
    replay = _final_errors(tmp_path, "replay_dg", 100,
                           replay=ReplayConfig(replay_capacity=32, replay_priority="uniform"))
    fresh = _final_errors(tmp_path, "fresh_dg", 100,
                          replay=ReplayConfig(replay_capacity=32, replay_priority="uniform",
                                              replay_age_decay=0.5))
    assert all(f <= r for f, r in zip(fresh, replay, strict=True)), (fresh, replay)
    assert statistics.mean(fresh) < statistics.mean(replay) - 0.1, (fresh, replay)
    assert min(replay) > 0.3  # far from the on-policy run, which is below 0.06 on every seed
