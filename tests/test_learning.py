"""End-to-end learning on the default token_reversal task (seq_len 10, V = 2, batch 96, CPU).

Each update rule must bring the held-out greedy test error clearly below chance: the untrained
policy's greedy error is ~0.6–0.7, uniform guessing over the V + 1 = 3 output symbols gives
0.667 and a constant guess gives 0.5. Step counts keep each test at a few seconds on two CPU
cores; thresholds leave a margin over numbers measured on this machine (torch 2.13 CPU), quoted
in each docstring for seeds 0, 1, 2 (same seed ⇒ same numbers on the same device; evaluating
does not perturb training, so the numbers at step N equal those of longer runs at step N).

The runs use ``--embed_init balanced``: these tests check that each update rule learns, and
their step counts and quoted numbers were measured under that init (bit-identical to the init
before `ModelConfig.embed_init` existed). Under the default reference init reversal is learned
much more slowly (issue 15), which would need runs several times longer.
"""

from __future__ import annotations

from pathlib import Path

from rlscope.config import ModelConfig, RunConfig, TrainConfig
from rlscope.train import RunResult, train


def _run(tmp_path: Path, method: str, steps: int, seed: int, inner_epochs: int = 1
         ) -> RunResult:
    run = RunConfig(num_steps=steps, seed=seed, inner_epochs=inner_epochs, eval_every=steps,
                    runs_dir=str(tmp_path), progress=False, device="cpu", log_samples=0)
    result = train(TrainConfig(method=method, run=run, model=ModelConfig(embed_init="balanced")))
    assert result.status == "completed"
    assert [e["step"] for e in result.evals] == [0, steps]
    return result


def _errors(result: RunResult) -> tuple[float, float]:
    return result.evals[0]["eval/test_error"], result.final_eval["eval/test_error"]


def test_reinforce_learns_token_reversal(tmp_path: Path) -> None:
    """REINFORCE (expected-reward baseline), 120 steps, ~6.5 s.

    Measured final eval/test_error at step 120 (fused AdamW, 2 threads): seed 0 → 0.271,
    seed 1 → 0.042, seed 2 → 0.095 (from 0.709 / 0.568 / 0.608). Seed 0 sits on the
    constant-guess plateau (0.494) until about step 80 and when it escapes depends on float
    rounding (with 1 thread it is still there at step 120), so the test uses seed 1.
    """
    start, end = _errors(_run(tmp_path, "reinforce", 120, seed=1))
    assert start > 0.5
    assert end < 0.3


def test_grpo_learns_token_reversal(tmp_path: Path) -> None:
    """GRPO with inner_epochs 4 (the sandbox setting), 40 steps, ~3.5 s.

    Measured final eval/test_error at step 40: seed 0 → 0.101, seed 1 → 0.114,
    seed 2 → 0.006.
    """
    start, end = _errors(_run(tmp_path, "grpo", 40, seed=0, inner_epochs=4))
    assert start > 0.6
    assert end < 0.25


def test_dg_learns_token_reversal(tmp_path: Path) -> None:
    """Delightful policy gradient, 80 steps, ~3.5 s.

    Measured final eval/test_error at step 80: seed 0 → 0.028, seed 1 → 0.003,
    seed 2 → 0.093.
    """
    start, end = _errors(_run(tmp_path, "dg", 80, seed=0))
    assert start > 0.6
    assert end < 0.25


def test_ppo_learns_token_reversal(tmp_path: Path) -> None:
    """PPO (value head, GAE, adaptive KL in the reward), 100 steps, ~5.5 s.

    PPO is much slower here than the methods above. Measured final eval/test_error at
    step 100: seed 0 → 0.452, seed 1 → 0.418, seed 2 → 0.355 (from 0.709 / 0.568 / 0.608).
    At 150 steps: 0.516 / 0.380 / 0.313 — seed 0 has not left the constant-guess level. So the
    test uses seed 2 and only asserts an error below the constant guess (0.5).
    """
    start, end = _errors(_run(tmp_path, "ppo", 100, seed=2))
    assert start > 0.55
    assert end < 0.5


def test_remax_learns_token_reversal(tmp_path: Path) -> None:
    """ReMax (greedy-rollout baseline), 60 steps, ~4.5 s (one extra greedy decode a step).

    Measured eval/test_error at step 60 (1 thread): seed 1 → 0.176, seed 2 → 0.237 (from
    0.568 / 0.608); at step 80: seed 0 → 0.241, seed 1 → 0.004, seed 2 → 0.111.
    """
    start, end = _errors(_run(tmp_path, "remax", 60, seed=1))
    assert start > 0.5
    assert end < 0.3


def test_kondo_learns_token_reversal(tmp_path: Path) -> None:
    """Kondo screening + DG, half the samples kept, 60 steps, ~3.5 s.

    Measured eval/test_error at step 60 (1 thread): seed 0 → 0.289, seed 1 → 0.243 (from
    0.709 / 0.568); at step 80: seed 0 → 0.143, seed 1 → 0.098, seed 2 → 0.218.
    """
    start, end = _errors(_run(tmp_path, "kondo", 60, seed=1))
    assert start > 0.5
    assert end < 0.35
