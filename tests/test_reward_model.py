"""The reward model: Bradley–Terry loss by hand, the packed layout, scores invariant to left
padding and batch composition, held-out accuracy above a measured threshold, its checkpoint
and its errors; `rlscope train --task preference_rm --rm_path` end to end with the KL term on,
and configuration errors rejected before training."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
from test_arithmetic import rollout

from rlscope.cli import main
from rlscope.config import ConfigError, OptimConfig, RunConfig, TrainConfig, validate
from rlscope.methods import MethodConfig
from rlscope.metrics.schema import unregistered
from rlscope.policy import ModelConfig
from rlscope.policy.reward_model import (
    RM_FILE,
    bradley_terry_loss,
    build_reward_model,
    last_real_index,
    load_reward_model,
    pack_sequences,
)
from rlscope.supervised.rm import (
    HELDOUT_SEED_OFFSET,
    RmConfig,
    RmResult,
    score_pairs,
    train_rm,
    validate_rm,
)
from rlscope.tasks import TaskConfig, make_task
from rlscope.train import train

LIMIT = 40
"""--length_limit of these tests (the default 64 costs half as much again)."""
RM_TASK = TaskConfig(length_limit=LIMIT)
SMALL_EVAL = TaskConfig(length_limit=LIMIT, eval_batches=1, eval_batch_size=16)
ACCURACY_STEPS = 60
ACCURACY_THRESHOLD = 0.78
"""Held-out pairwise accuracy after `ACCURACY_STEPS` steps of 32 pairs at lr 3e-3 (tiny
transformer, --length_limit 40, 256 held-out pairs). Measured on a 2-core CPU: 0.895 / 0.859
/ 0.891 for seeds 0 / 1 / 2 (chance is 0.5); the threshold leaves a margin of 0.08 below the
lowest. The recipe's 300 steps of 64 pairs reach 0.99 (docs/recipes.md)."""


def _rm_cfg(tmp: Path, steps: int, name: str = "rm", **kw: object) -> RmConfig:
    options: dict[str, object] = {"heldout_pairs": 256, **kw}
    return RmConfig(num_steps=steps, batch_size=32, lr=3e-3, eval_every=0, device="cpu",
                    threads=1, progress=False, runs_dir=str(tmp), name=name,
                    task_options=RM_TASK, **options)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def trained_rm(tmp_path_factory: pytest.TempPathFactory) -> RmResult:
    return train_rm(_rm_cfg(tmp_path_factory.mktemp("rm"), ACCURACY_STEPS))


def test_bradley_terry_loss_by_hand() -> None:
    loss, m = bradley_terry_loss(torch.tensor([2.0, 0.0, 1.0]), torch.tensor([0.0, 0.0, 3.0]))
    expected = (math.log1p(math.exp(-2.0)) + math.log(2.0) + math.log1p(math.exp(2.0))) / 3
    assert float(loss) == pytest.approx(expected, rel=1e-6)
    assert float(m["rm/accuracy"]) == pytest.approx(1 / 3)  # a tie counts as wrong
    assert float(m["rm/margin"]) == pytest.approx(0.0)
    # stable at extreme margins: −log σ(200) = 0, −log σ(−200) = 200
    loss, _ = bradley_terry_loss(torch.tensor([100.0, -100.0]), torch.tensor([-100.0, 100.0]))
    assert float(loss) == pytest.approx(100.0)
    # the gradient is −σ(−margin) for chosen and +σ(−margin) for rejected (per pair / B)
    c = torch.tensor([1.0], requires_grad=True)
    r = torch.tensor([0.0], requires_grad=True)
    bradley_terry_loss(c, r)[0].backward()
    assert c.grad is not None and r.grad is not None
    assert float(c.grad) == pytest.approx(-1 / (1 + math.e)) and float(r.grad) == -float(c.grad)
    with pytest.raises(ValueError, match=r"two \[B\] tensors"):
        bradley_terry_loss(torch.zeros(2, 1), torch.zeros(2, 1))


def test_packed_layout_and_last_token() -> None:
    tokens, attention = pack_sequences([[7, 8], [5]], [[1, 10], [2, 3, 4, 10]], width=6)
    assert tokens.tolist() == [[0, 0, 7, 8, 1, 10], [0, 5, 2, 3, 4, 10]]
    assert attention.tolist() == [[0, 0, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1]]
    assert last_real_index(attention).tolist() == [5, 5]
    assert last_real_index(torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]])).tolist() == [1, 0]
    with pytest.raises(ValueError, match="does not fit"):
        pack_sequences([[1, 2, 3]], [[4, 5]], width=4)


@pytest.mark.parametrize("arch", ["tiny", "llama"])
def test_score_is_invariant_to_left_padding_and_batch_composition(arch: str) -> None:
    """The same sequence alone (no padding) and inside two padded batches scores the same, for
    the tiny backbone (float64) and a Hugging Face one (float32: its float64 path gives NaN
    on padded rows in this transformers version)."""
    if arch != "tiny":
        pytest.importorskip("transformers")
    torch.manual_seed(0)
    dtype, tol = ("float64", 1e-10) if arch == "tiny" else ("float32", 1e-4)
    rm = build_reward_model(ModelConfig(arch=arch, dtype=dtype), 256, 48).eval()
    # a non-zero head so the scores differ between sequences
    torch.nn.init.normal_(rm.head.linear.weight)
    seq = [*b"Describe the sea.", *b"calm road\n"]
    with torch.no_grad():
        alone = rm(torch.tensor([seq]), torch.ones(1, len(seq), dtype=torch.long))
        batch1 = rm(*pack_sequences([seq[:17], [*b"Hi"]], [seq[17:], [*b"x\n"]], 48))
        batch2 = rm(*pack_sequences([[*b"A much longer prompt here."], seq[:17]],
                                    [[*b"warm kind bright\n"], seq[17:]], 48))
    assert float(batch1[0]) == pytest.approx(float(alone[0]), abs=tol)
    assert float(batch2[1]) == pytest.approx(float(alone[0]), abs=tol)
    assert abs(float(batch1[1]) - float(alone[0])) > 1e-3  # another sequence scores otherwise


def test_heldout_accuracy_above_threshold(trained_rm: RmResult) -> None:
    first, last = trained_rm.evals[0], trained_rm.evals[-1]
    assert first["step"] == ACCURACY_STEPS  # eval_every 0: only at the end
    assert last["rm/heldout_accuracy"] > ACCURACY_THRESHOLD
    assert last["rm/heldout_loss"] < math.log(2.0)
    # the training loss fell from chance (ln 2 at a zero-initialised head)
    assert trained_rm.metrics[0]["rm/loss"] == pytest.approx(math.log(2.0), abs=1e-6)
    tail = trained_rm.metrics[-20:]
    assert sum(r["rm/loss"] for r in tail) / len(tail) < 0.5
    # the repeat probe sits outside the pairs' distribution: the RM prefers the repetition
    assert last["rm/probe_accuracy"] < 0.5
    rows = [json.loads(x) for x in (trained_rm.out_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(unregistered(r) == [] for r in rows)


def test_checkpoint_round_trip_and_standardisation(trained_rm: RmResult) -> None:
    task = make_task("preference_rm", RM_TASK)
    rm = load_reward_model(str(trained_rm.out_dir), "preference_rm", task.prompt_len,
                           task.completion_len, torch.device("cpu"))
    assert not any(p.requires_grad for p in rm.parameters()) and not rm.training
    pairs = task.preference_pairs(torch.Generator().manual_seed(HELDOUT_SEED_OFFSET), 256)
    width = task.prompt_len + task.completion_len
    with torch.no_grad():
        chosen_B, rejected_B = score_pairs(rm, pairs, width, torch.device("cpu"))
    payload = torch.load(trained_rm.out_dir / RM_FILE, weights_only=True)
    assert float((chosen_B > rejected_B).float().mean()) == pytest.approx(
        payload["rm/heldout_accuracy"])
    scores_N = (torch.cat([chosen_B, rejected_B]) - rm.score_mean) / rm.score_std
    assert float(scores_N.mean()) == pytest.approx(0.0, abs=1e-4)
    assert float(scores_N.std()) == pytest.approx(1.0, abs=1e-4)
    # the task's training reward is that standardised score of prompt + counted completion
    with_rm = dataclasses.replace(RM_TASK, rm_path=str(trained_rm.out_dir))
    task = make_task("preference_rm", with_rm)
    prompt, answer = bytes(pairs[0].prompt).decode(), bytes(pairs[0].chosen)
    batch = rollout("preference_rm", [prompt], [answer + b"junk after the stop"], with_rm)
    assert float(task.score(batch).rewards_B[0]) == pytest.approx(float(scores_N[0]), abs=1e-5)
    assert float(task.eval_metrics(batch)["rm_score"][0]) == pytest.approx(
        float(scores_N[0]), abs=1e-5)


def test_reward_model_errors(trained_rm: RmResult, tmp_path: Path) -> None:
    def errors(path: str, **kw: object) -> list[str]:
        options = dataclasses.replace(RM_TASK, rm_path=path, **kw)  # type: ignore[arg-type]
        return make_task("preference_rm", options).validate()

    assert errors(str(trained_rm.out_dir)) == []
    assert errors(str(trained_rm.out_dir / RM_FILE)) == []
    (msg,) = errors(str(tmp_path / "none"))
    assert "no reward model there" in msg and "rlscope rm --task preference_rm" in msg
    torch.save({"policy": {}}, tmp_path / "sft.pt")
    (msg,) = errors(str(tmp_path / "sft.pt"))
    assert "not an rlscope reward model" in msg
    (tmp_path / "garbage.pt").write_bytes(b"not a torch file")
    (msg,) = errors(str(tmp_path / "garbage.pt"))
    assert "not an rlscope checkpoint" in msg and "garbage.pt" in msg
    (msg,) = errors(str(trained_rm.out_dir), length_limit=64)
    assert "reads at most" in msg and "--length_limit 40" in msg
    payload = torch.load(trained_rm.out_dir / RM_FILE, weights_only=True)
    torch.save({**payload, "task": "arithmetic"}, tmp_path / "other.pt")
    (msg,) = errors(str(tmp_path / "other.pt"))
    assert "trained for task 'arithmetic'" in msg


def _train_cfg(tmp: Path, rm_path: str, method: str = "ppo", steps: int = 3,
               components: MethodConfig | None = None, **task_kw: object) -> TrainConfig:
    return TrainConfig(
        task="preference_rm", method=method, optim=OptimConfig(lr=1e-3),
        components=components or MethodConfig(),
        task_options=dataclasses.replace(SMALL_EVAL, rm_path=rm_path, **task_kw),  # type: ignore[arg-type]
        run=RunConfig(num_steps=steps, batch_size=16, eval_every=2, progress=False,
                      device="cpu", threads=1, runs_dir=str(tmp)))


@pytest.mark.parametrize("method", ["ppo", "grpo"])
def test_train_against_the_reward_model_end_to_end(trained_rm: RmResult, tmp_path: Path,
                                                   method: str) -> None:
    """PPO (KL to the reference in the reward, its preset) and GRPO with its KL term pointed
    at the reference (--kl_target ref) run a few steps against the RM with finite metrics."""
    components = MethodConfig(kl_target="ref") if method == "grpo" else None
    run = train(_train_cfg(tmp_path, str(trained_rm.out_dir), method, components=components))
    assert run.status == "completed" and len(run.metrics) == 3 and len(run.evals) == 3
    for row in run.metrics + run.evals:
        assert all(math.isfinite(v) for v in row.values()), row
        assert unregistered(row) == []
    for row in run.metrics:  # the KL to the reference is on
        assert row["kl_ctrl/beta"] > 0 and "policy/kl_ref_k1" in row
    for row in run.evals:
        assert {"eval/true_reward", "eval/rm_score", "eval/test_error"} <= set(row)
    # the training reward is the RM score: standardised, so not the hidden preference's
    assert run.metrics[0]["reward/std"] > 0
    config = json.loads((run.run_dir / "config.json").read_text())
    assert config["config"]["task_options"]["rm_path"] == str(trained_rm.out_dir)


def test_config_errors_before_training(trained_rm: RmResult, tmp_path: Path) -> None:
    runs = tmp_path / "runs"

    def error(cfg: TrainConfig) -> str:
        with pytest.raises(ConfigError) as info:
            validate(cfg)
        with pytest.raises(ConfigError):
            train(cfg)
        return str(info.value)

    assert "give --rm_path runs/NAME" in error(_train_cfg(runs, ""))
    assert "no reward model there" in error(_train_cfg(runs, str(tmp_path / "missing")))
    msg = error(_train_cfg(runs, str(trained_rm.out_dir), difficulty=2))
    assert "task.difficulty does not apply to preference_rm" in msg
    assert not runs.exists()


def test_rm_init_starts_the_backbone_from_an_sft_model(tmp_path: Path) -> None:
    from rlscope.supervised.sft import SftConfig, sft

    policy_dir = sft(SftConfig(task="preference_rm", num_steps=1, batch_size=4, eval_every=0,
                               device="cpu", progress=False, runs_dir=str(tmp_path),
                               name="sft", task_options=dataclasses.replace(
                                   SMALL_EVAL, eval_batch_size=4))).out_dir
    result = train_rm(_rm_cfg(tmp_path, 0, heldout_pairs=8, init=str(policy_dir)))
    policy = torch.load(policy_dir / "sft.pt", weights_only=True)["policy"]
    rm = torch.load(result.out_dir / RM_FILE, weights_only=True)["reward_model"]
    assert all(torch.equal(rm[f"backbone.{k}"], v) for k, v in policy.items())
    assert validate_rm(_rm_cfg(tmp_path, 0, init=str(tmp_path / "nope"))) == [
        f"--init {tmp_path / 'nope'}: no such file or directory"]


def test_rm_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rm", "--num_steps", "2", "--batch_size", "4", "--heldout_pairs", "8",
                 "--device", "cpu", "--threads", "1", "--no_progress", "--runs_dir",
                 str(tmp_path), "--name", "x"]) == 0
    assert (tmp_path / "x" / RM_FILE).exists()
    assert "--rm_path" in capsys.readouterr().out
    assert main(["rm", "--task", "arithmetic", "--num_steps", "1"]) == 2
    assert "generates no preference pairs" in capsys.readouterr().err
    assert main(["rm", "--rm_path", "x", "--num_steps", "1"]) == 2
    assert main(["train", "--task", "preference_rm", "--num_steps", "1"]) == 2
    assert "--rm_path" in capsys.readouterr().err


@pytest.mark.slow
def test_rlhf_recipe_improves_the_true_preference_and_small_kl_overoptimises(tmp_path: Path
                                                                             ) -> None:
    """The recipe of docs/recipes.md, seed 0 (~5 min on a 2-core CPU): SFT → RM → PPO with its
    adaptive KL raises the hidden preference of greedy answers (measured 2.56 → 5.13, RM
    score 1.06 → 1.75); with the KL coefficient too small the RM score rises as far while the
    true preference collapses (→ 0.51) and the KL to the reference runs 30× higher."""
    from rlscope.supervised.sft import SftConfig, sft

    evals = TaskConfig(eval_batches=2, eval_batch_size=100)
    # the numbers above were measured under the balanced init (docs/recipes.md)
    balanced = ModelConfig(embed_init="balanced")
    policy_dir = sft(SftConfig(task="preference_rm", num_steps=600, batch_size=64, lr=3e-3,
                               model=balanced,
                               eval_every=0, device="cpu", threads=1, progress=False,
                               runs_dir=str(tmp_path), name="sft", task_options=evals)).out_dir
    rm = train_rm(RmConfig(num_steps=300, batch_size=64, lr=1e-3, eval_every=0, device="cpu",
                           model=balanced,
                           threads=1, progress=False, runs_dir=str(tmp_path), name="rm"))
    assert rm.evals[-1]["rm/heldout_accuracy"] > 0.95 and rm.evals[-1]["rm/probe_accuracy"] < 0.3

    def ppo(name: str, components: MethodConfig) -> tuple[list[dict[str, float]], float]:
        run = train(TrainConfig(
            task="preference_rm", method="ppo", optim=OptimConfig(lr=3e-4), model=balanced,
            components=components,
            task_options=dataclasses.replace(evals, rm_path=str(rm.out_dir)),
            run=RunConfig(num_steps=150, batch_size=64, eval_every=25, progress=False,
                          device="cpu", threads=1, runs_dir=str(tmp_path), name=name,
                          init=str(policy_dir))))
        kl = sum(r["policy/kl_ref_seq_k1"] for r in run.metrics[-10:]) / 10
        return run.evals, kl

    with_kl, kl = ppo("kl", MethodConfig())
    small_kl, kl_small = ppo("small_kl", MethodConfig(kl_control="fixed", kl_coef=0.001))
    start, end = with_kl[0], with_kl[-1]
    assert end["eval/true_reward"] > start["eval/true_reward"] + 1.5
    assert end["eval/rm_score"] > start["eval/rm_score"] + 0.4 and kl < 5.0
    assert small_kl[-1]["eval/rm_score"] > end["eval/rm_score"] - 0.1
    assert small_kl[-1]["eval/true_reward"] < end["eval/true_reward"] - 2.0
    assert kl_small > 5 * kl
