"""Learning on the multi-turn environments (issue 20): an `rlscope sft` warm start on the
environment's demonstrations, then GRPO from it, on CPU with the tiny model. The recipes and
the three-seed measurements are in docs/recipes.md, "Multi-turn environments"
(benchmarks/multiturn_learning.py runs them)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlscope.checkpoint import load_init
from rlscope.config import OptimConfig, RunConfig, TrainConfig
from rlscope.envs import EnvConfig
from rlscope.evaluation import heldout_batch, sampled_episodes
from rlscope.policy import ModelConfig
from rlscope.sandbox import isolation_problem
from rlscope.supervised.sft import SftConfig, sft
from rlscope.tasks import Interactive, TaskConfig, make_task
from rlscope.tasks.base import make_policy_for
from rlscope.train import train

GUESS = TaskConfig(env=EnvConfig(guess_high=20), max_turns=6, max_turn_tokens=4,
                   max_episode_tokens=48, eval_batches=2, eval_batch_size=32)


@pytest.mark.slow
def test_grpo_improves_guess_number_over_its_sft_warm_start(tmp_path: Path) -> None:
    """The line-environment family (guess_number; calculator_tool, the tool-use case, has its
    own test below). Seed 0 of the recipe: 200 SFT steps,
    then 100 GRPO steps of 128 episodes at lr 3e-4 (about 1 min alone on the CPU). Measured
    on seeds 0, 1, 2 (2-core CPU, 2–3 min each under load): greedy
    held-out success 0.81 → 0.84, 0.66 → 0.83, 0.78 → 0.78 (best evaluation 0.91, 0.83, 0.84);
    the sampled episodes' solved fraction (mean of steps 0–19 → 80–99) 0.77 → 0.84,
    0.67 → 0.78, 0.70 → 0.78. Thresholds: half the smallest measured gain."""
    warm = sft(SftConfig(task="guess_number", task_options=GUESS, num_steps=200, batch_size=32,
                         lr=3e-3, eval_every=0, device="cpu", threads=1, progress=False,
                         runs_dir=str(tmp_path), name="sft"))
    run = train(TrainConfig(
        task="guess_number", method="grpo", task_options=GUESS, optim=OptimConfig(lr=3e-4),
        run=RunConfig(num_steps=100, batch_size=128, eval_every=25, progress=False,
                      device="cpu", threads=1, runs_dir=str(tmp_path),
                      init=str(warm.out_dir))))
    assert run.evals[0]["eval/success"] == pytest.approx(warm.evals[-1]["eval/success"])
    solved = [m["episode/solved_frac"] for m in run.metrics]
    assert sum(solved[-20:]) / 20 >= sum(solved[:20]) / 20 + 0.035
    start = run.evals[0]["eval/success"]
    assert run.evals[-1]["eval/success"] >= start
    assert max(e["eval/success"] for e in run.evals[1:]) >= start + 0.045


TWENTY_QUESTIONS = TaskConfig(env=EnvConfig(twenty_questions_turn_penalty=0.1), max_turns=10,
                              max_turn_tokens=32, max_episode_tokens=232, eval_batches=1,
                              eval_batch_size=49)


@pytest.mark.slow
def test_dr_grpo_improves_twenty_questions_over_its_sft_warm_start(tmp_path: Path) -> None:
    """The multi-agent family (the policy asks, the answerer answers). Seed 0 of the recipe:
    1,000 SFT steps on the decision-tree demonstrations (4–7 min on the shared 2-core CPU),
    then 40 Dr. GRPO steps of 64 episodes at lr 1e-4 (~45 s); the test took 4.6 min.
    Measured on seeds 0, 1, 2: greedy held-out success 0.918 → 0.959 → 0.980, 0.796 → 0.857 → 0.796,
    0.571 → 0.694 → 0.694 (steps 0, 20, 40). Thresholds: a third of seed 0's gain."""
    warm = sft(SftConfig(task="twenty_questions", task_options=TWENTY_QUESTIONS,
                         num_steps=1000, batch_size=32, lr=3e-3, eval_every=0, device="cpu",
                         threads=1, progress=False, runs_dir=str(tmp_path), name="sft"))
    assert warm.evals[-1]["eval/success"] >= 0.5  # measured 0.57-0.92 over seeds 0-2
    run = train(TrainConfig(
        task="twenty_questions", method="dr_grpo", task_options=TWENTY_QUESTIONS,
        optim=OptimConfig(lr=1e-4),
        run=RunConfig(num_steps=40, batch_size=64, eval_every=20, progress=False,
                      device="cpu", threads=1, runs_dir=str(tmp_path),
                      init=str(warm.out_dir))))
    start = run.evals[0]["eval/success"]
    assert start == pytest.approx(warm.evals[-1]["eval/success"])
    assert run.evals[-1]["eval/success"] >= start + 0.02
    assert run.evals[-1]["eval/return"] > run.evals[0]["eval/return"]


CALCULATOR = TaskConfig(env=EnvConfig(calculator_difficulty=1, calculator_max_operand=9),
                        max_turns=3, max_turn_tokens=16, max_episode_tokens=48, eval_batches=2,
                        eval_batch_size=32)


@pytest.mark.slow
def test_grpo_improves_calculator_tool_over_its_sft_warm_start(tmp_path: Path) -> None:
    """The tool-use family (calc(...), then answer). Seed 0 of the recipe on one-digit numbers
    (`--calculator_max_operand 9`; with 2..99 the warm start copies neither operand): 1,000 SFT
    steps, then 100 GRPO steps of 128 episodes at lr 3e-4 (the test took 3.2 min).
    Measured (docs/recipes.md, "calculator_tool"), seed 0: greedy held-out success (64
    episodes) 0.953 → 0.984 → 1.0 → 1.0 → 1.0 (steps 0, 25, …, 100), the sampled episodes'
    solved fraction (mean of steps 0–19 → 80–99) 0.879 → 0.978. Thresholds: half the sampled
    gain; two episodes more than the warm start at the best evaluation."""
    warm = sft(SftConfig(task="calculator_tool", task_options=CALCULATOR, num_steps=1000,
                         batch_size=32, lr=3e-3, eval_every=0, device="cpu", threads=1,
                         progress=False, runs_dir=str(tmp_path), name="sft"))
    assert warm.evals[-1]["eval/success"] >= 0.5  # measured 0.95 (0.36 and 0.86 on seeds 1, 2)
    run = train(TrainConfig(
        task="calculator_tool", method="grpo", task_options=CALCULATOR,
        optim=OptimConfig(lr=3e-4),
        run=RunConfig(num_steps=100, batch_size=128, eval_every=25, progress=False,
                      device="cpu", threads=1, runs_dir=str(tmp_path),
                      init=str(warm.out_dir))))
    assert run.evals[0]["eval/success"] == pytest.approx(warm.evals[-1]["eval/success"])
    solved = [m["episode/solved_frac"] for m in run.metrics]
    assert sum(solved[-20:]) / 20 >= sum(solved[:20]) / 20 + 0.05
    start = run.evals[0]["eval/success"]
    assert run.evals[-1]["eval/success"] >= start
    assert max(e["eval/success"] for e in run.evals[1:]) >= start + 2 / 64


CODE_REPAIR = TaskConfig(env=EnvConfig(code_repair_max_reference_chars=50,
                                       code_repair_feedback_chars=80,
                                       code_repair_unsafe_sandbox=bool(isolation_problem())),
                         max_turns=2, max_turn_tokens=64, max_episode_tokens=320,
                         eval_batches=2, eval_batch_size=20)


def _sampled_success(init: Path, seed: int) -> float:
    """Solved fraction of the recipe's 40 held-out episodes played 10 times each at temperature
    1 by the policy of ``init`` (`sampled_episodes`: the same episodes and sampling seeds for
    every policy; what `benchmarks/sampled_success.py` measures)."""
    task = make_task("code_repair", CODE_REPAIR)
    assert isinstance(task, Interactive)
    policy = make_policy_for(task, ModelConfig())
    load_init(str(init), policy, torch.device("cpu"))
    seeds_B = heldout_batch(task, seed).env_seeds_B
    assert seeds_B is not None
    solved_N, _ = sampled_episodes(policy.eval(), task, seeds_B, 10, 1.0)
    return float(solved_N.mean())


@pytest.mark.slow
def test_grpo_improves_code_repair_sampled_success_over_its_sft_warm_start(
        tmp_path: Path) -> None:
    """The code family (the program runs in the sandbox, the failing test comes back). Seed 0
    of the recipe (docs/recipes.md, "code_repair"): 200 SFT steps on the 10 short specs, then
    GRPO, 64 episodes a step at lr 3e-4, for 60 steps (the recipe runs 120). The greedy
    success of the warm start is at its ceiling (1.0); RL's room is in the sampled episodes
    (temperature 1). Measured, seed 0 (seeds 1, 2): the training batches' solved fraction,
    mean of steps 0–19 → 40–59, 0.336 → 0.440 (0.244 → 0.374, 0.565 → 0.621); the held-out
    sampled success (40 episodes × 10) 0.380 → 0.418 after 60 steps (0.345 → 0.363,
    0.643 → 0.620) and 0.448 after 120 (0.428, 0.640); greedy 1.0 → 0.9. Thresholds: half of
    seed 0's training gain; no loss of sampled success; greedy ≥ 0.8. The test reproduced these
    seed-0 numbers exactly; it took 9 min beside a full test suite on the 2 cores (SFT 1.4 min,
    6.5 s a GRPO step) and 15 min beside three other CPU-bound jobs."""
    warm = sft(SftConfig(task="code_repair", task_options=CODE_REPAIR, num_steps=200,
                         batch_size=32, lr=3e-3, eval_every=0, device="cpu", threads=1,
                         progress=False, runs_dir=str(tmp_path), name="sft"))
    assert warm.evals[-1]["eval/success"] >= 0.8  # measured 1.0, 0.875, 1.0 on seeds 0-2
    run = train(TrainConfig(
        task="code_repair", method="grpo", task_options=CODE_REPAIR,
        optim=OptimConfig(lr=3e-4),
        run=RunConfig(num_steps=60, batch_size=64, eval_every=30, progress=False,
                      device="cpu", threads=1, runs_dir=str(tmp_path),
                      init=str(warm.out_dir))))
    assert run.evals[0]["eval/success"] == pytest.approx(warm.evals[-1]["eval/success"])
    solved = [m["episode/solved_frac"] for m in run.metrics]
    assert sum(solved[-20:]) / 20 >= sum(solved[:20]) / 20 + 0.05
    assert _sampled_success(run.run_dir, 0) >= _sampled_success(warm.out_dir, 0)
    assert run.evals[-1]["eval/success"] >= 0.8
