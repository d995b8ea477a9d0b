"""The recipe scripts of examples/recipes run end to end (a few steps each, tiny model, CPU),
and the warm-start pairs they rely on are what the tasks promise."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from rlscope.tasks import TaskConfig, make_task
from rlscope.tasks.length_target import INSTRUCTIONS, SFT_WORDS

RECIPES = Path(__file__).resolve().parents[1] / "examples" / "recipes"
SHORT = {"SFT_STEPS": "2", "RM_STEPS": "2", "RL_STEPS": "2", "EVAL_BATCHES": "1",
         "EVAL_BATCH_SIZE": "4"}


def _run(script: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, **SHORT, "RUNS": str(tmp_path), "OMP_NUM_THREADS": "1", **env}
    return subprocess.run(["bash", str(RECIPES / script)], env=full, capture_output=True,
                          text=True, timeout=600)


def _metrics(run_dir: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(("script", "runs"), [
    ("arithmetic_grpo.sh", ["sft_arith_tiny_s0", "grpo_arith_tiny_s0"]),
    ("ppo_length_target.sh", ["sft_length_tiny_s0", "ppo_length_tiny_s0_lr1e-2",
                              "ppo_length_tiny_s0_lr1e-4"]),
    ("code_grpo.sh", ["sft_code_tiny_s0", "grpo_code_tiny_s0"]),
    ("rlhf_preference_rm.sh", ["sft_pref_tiny_s0", "ppo_pref_tiny_s0_kl",
                               "ppo_pref_tiny_s0_small_kl"]),
])
def test_recipe_runs_end_to_end(script: str, runs: list[str], tmp_path: Path) -> None:
    done = _run(script, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    for name in runs:
        rows = _metrics(tmp_path / name)
        assert rows and all(torch.isfinite(torch.tensor(v)) for r in rows for v in r.values()
                            if isinstance(v, float))
    rl = [r for r in _metrics(tmp_path / runs[-1]) if "reward/mean" in r]
    assert len(rl) == 2  # RL_STEPS
    if script == "rlhf_preference_rm.sh":
        rm_rows = _metrics(tmp_path / "rm_pref_tiny_s0")
        assert [r["step"] for r in rm_rows if "rm/loss" in r] == [0, 1]
        evals = (tmp_path / runs[1] / "eval.jsonl").read_text().splitlines()
        assert all("eval/rm_score" in json.loads(e) for e in evals)
    if script == "ppo_length_target.sh":
        report = (tmp_path / runs[1] / "doctor.md").read_text()
        assert report.startswith(f"## {runs[1]}") and "### Findings" in report


@pytest.mark.parametrize("env", [
    "guess_number",  # the others run the same script (slow: ~30 s each on 2 cores)
    *(pytest.param(env, marks=pytest.mark.slow)
      for env in ("twenty_questions", "calculator_tool", "code_repair"))])
def test_multiturn_recipe_runs_end_to_end(env: str, tmp_path: Path) -> None:
    done = _run("multiturn.sh", tmp_path, ENV=env)
    assert done.returncode == 0, done.stderr[-2000:]
    method = "dr_grpo" if env == "twenty_questions" else "grpo"
    rl = _metrics(tmp_path / f"{method}_{env}_tiny_s0")
    assert [r["step"] for r in rl if "reward/mean" in r] == [0, 1]  # RL_STEPS
    assert all("episode/turns" in r for r in rl if "reward/mean" in r)
    config = json.loads((tmp_path / f"{method}_{env}_tiny_s0" / "config.json").read_text())
    assert config["config"]["run"]["init"] == str(tmp_path / f"sft_{env}_tiny_s0")


def test_multiturn_recipe_rejects_an_unknown_environment(tmp_path: Path) -> None:
    done = _run("multiturn.sh", tmp_path, ENV="chess")
    assert done.returncode == 2 and "unknown ENV=chess" in done.stderr


def test_recipe_rejects_an_unknown_size(tmp_path: Path) -> None:
    done = _run("arithmetic_grpo.sh", tmp_path, SIZE="gpt5")
    assert done.returncode == 2 and "unknown SIZE=gpt5: use tiny or qwen2-100m" in done.stderr


def test_length_target_warm_start_pairs_are_corpus_words_that_fit() -> None:
    task = make_task("length_target", TaskConfig(length_limit=48))
    pairs = task.sft_pairs(torch.Generator().manual_seed(0), 200)  # type: ignore[attr-defined]
    again = task.sft_pairs(torch.Generator().manual_seed(0), 200)  # type: ignore[attr-defined]
    assert pairs == again
    words_seen = []
    for prompt, completion in pairs:
        assert task.tokenizer.decode(prompt) in INSTRUCTIONS
        assert completion[-1] == 10 and 10 not in completion[:-1]
        assert 1 < len(completion) <= 48
        words_seen.append(len(task.tokenizer.decode(completion[:-1]).split()))
    assert max(words_seen) <= SFT_WORDS[1] and min(words_seen) >= 1
    assert sum(words_seen) / len(words_seen) > 5  # 47 bytes hold about 8 words


def test_code_warm_start_pairs_are_training_references_only() -> None:
    task = make_task("code_unit_tests")
    pairs = task.sft_pairs(torch.Generator().manual_seed(0), 300)  # type: ignore[attr-defined]
    train = {s.prompt: s.reference for s in task.train_specs}  # type: ignore[attr-defined]
    heldout = {s.prompt for s in task.eval_specs}  # type: ignore[attr-defined]
    seen = set()
    for prompt, completion in pairs:
        text = task.tokenizer.decode(prompt)
        assert text not in heldout and completion[-1] == task.end_id  # type: ignore[attr-defined]
        assert task.tokenizer.decode(completion[:-1]) == train[text]
        seen.add(text)
    assert len(seen) == len(train)
