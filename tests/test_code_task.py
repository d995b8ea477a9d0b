"""``code_unit_tests`` (TASKS.md, "Real-model tasks"): the shipped specs, body extraction, and
rewards through the sandbox on hand-made completions (references score 1, garbage 0)."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import pytest
import torch

from rlscope.batch import RolloutBatch
from rlscope.cli import _tyro_parse
from rlscope.config import RunConfig, TrainConfig, stop_tokens
from rlscope.metrics.schema import unregistered
from rlscope.metrics.sinks import read_jsonl
from rlscope.sandbox import SandboxLimits, isolation_problem
from rlscope.tasks import make_task
from rlscope.tasks.base import TaskConfig
from rlscope.tasks.code import (
    END,
    CodeConfig,
    CodeUnitTestsTask,
    extract_body,
    load_specs,
    score_programs,
)
from rlscope.train import train

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")
PROBLEM = isolation_problem() if sys.platform.startswith("linux") else "not Linux"
needs_sandbox = pytest.mark.skipif(bool(PROBLEM), reason=f"no isolated sandbox: {PROBLEM}")

FAST = CodeConfig(completion_len=256, workers=2,
                  limits=SandboxLimits(cpu_seconds=1, wall_seconds=2.0, per_test_seconds=0.5))


@needs_sandbox
def test_specs_load_and_every_reference_passes_its_tests() -> None:
    specs = load_specs()
    assert len(specs) >= 20 and len({s.function for s in specs}) == len(specs)
    assert all(3 <= len(s.tests) <= 8 for s in specs)
    assert sum(s.heldout for s in specs) >= 3
    for s in specs:
        assert s.prompt.startswith(f"def {s.function}(") and s.prompt.endswith('"""\n')
    results = score_programs(specs, [s.reference for s in specs], FAST)
    assert [(r.status, r.reward) for r in results] == [("ok", 1.0)] * len(specs), [
        (s.function, r.reason, r.outcomes) for s, r in zip(specs, results, strict=True)
        if r.reward != 1.0]


@needs_sandbox
def test_wrong_bodies_score_below_one() -> None:
    specs = load_specs()
    results = score_programs(specs, ["    return None\n"] * len(specs), FAST)
    assert all(r.status == "ok" and r.reward < 1.0 for r in results)


def test_extract_body_cuts_at_end_and_at_top_level_code() -> None:
    assert extract_body(f"    return 1\n{END}garbage") == "    return 1\n"
    assert extract_body("    x = 1\n\n    return x\nprint(f(2))\ndef g(): pass\n") == (
        "    x = 1\n\n    return x\n")
    assert extract_body("    return 2") == "    return 2"
    assert extract_body("") == "" and extract_body("return 3\n") == ""


@needs_sandbox
@pytest.mark.parametrize("completion", [
    "", "\x00\x01\x02\xff", "    return '\udcff'\n", "é😀" * 500, "    " + "x" * 300_000,
    "    while True:\n        pass\n", "    import os\n    os.system('true')\n",
    f"{END}    return a + b\n", "return a + b\n"])
def test_garbage_scores_zero(completion: str) -> None:
    add = next(s for s in load_specs() if s.function == "add")
    [result] = score_programs([add], [completion], FAST)
    assert result.reward == 0.0


def _rollout(task: CodeUnitTestsTask, specs_idx: list[int], texts: list[str]) -> RolloutBatch:
    prompts = task._prompts([task.specs[i] for i in specs_idx])
    T = task.completion_len
    tokens_BT = torch.zeros(len(texts), T, dtype=torch.long)
    mask_BT = torch.zeros(len(texts), T)
    for b, text in enumerate(texts):
        ids = task.tokenizer.encode(text)[: T - 1]
        ids.append(task.end_id)
        tokens_BT[b, :len(ids)] = torch.tensor(ids)
        mask_BT[b, :len(ids)] = 1
    B = len(texts)
    return RolloutBatch(prompt_tokens_BP=prompts.tokens_BP,
                        prompt_mask_BP=prompts.attention_mask_BP,
                        completion_tokens_BT=tokens_BT, completion_mask_BT=mask_BT,
                        logp_sampler_BT=torch.zeros(B, T), logp_raw_BT=torch.zeros(B, T),
                        finished_by_stop_B=torch.ones(B, dtype=torch.bool),
                        group_id_B=torch.arange(B))


@needs_sandbox
def test_batch_of_32_is_scored_in_bounded_time() -> None:
    task = CodeUnitTestsTask(TaskConfig(), FAST)
    n = len(task.specs)
    idx = [b % n for b in range(32)]
    garbage = ["", "    while True:\n        pass\n", "\x00\xff", "    return ("]
    texts = [task.specs[i].reference if b % 2 == 0 else garbage[(b // 2) % 4]
             for b, i in enumerate(idx)]
    batch = _rollout(task, idx, texts)
    start = time.monotonic()
    rewards_B = task.score(batch).rewards_B
    elapsed = time.monotonic() - start
    assert rewards_B.shape == (32,)
    assert rewards_B[0::2].tolist() == [1.0] * 16 and rewards_B[1::2].tolist() == [0.0] * 16
    # 4 of the 16 garbage rows hang until their 1 s CPU limit; 2 workers: ~2-3 s in all
    assert elapsed < 15.0, elapsed
    metrics = task.eval_metrics(batch)
    assert metrics["test_error"].tolist() == (1.0 - rewards_B).tolist()
    assert metrics["solved"].sum() == 16


@needs_sandbox
def test_prompts_train_and_heldout_are_disjoint_and_decode() -> None:
    task = CodeUnitTestsTask(TaskConfig(eval_batches=2, eval_batch_size=8), FAST)
    assert task.validate() == []
    train = task.sample_prompts(torch.Generator().manual_seed(0), 16)
    evals = task.eval_prompts(0)
    assert len(evals) == 2 and evals[0].batch_size == 8
    assert torch.equal(evals[0].tokens_BP, task.eval_prompts(0)[0].tokens_BP)
    heldout = {s.function for s in task.eval_specs}
    for b in range(16):
        spec = task.spec_of(train.tokens_BP[b], train.attention_mask_BP[b]
                            if train.attention_mask_BP is not None else None)
        assert spec.function not in heldout
    assert task.vocab_size == 257 and task.stop_token_ids == (256,)
    assert "code_unit_tests" in task.describe()


@needs_sandbox
def test_registered_with_task_config_options_and_stop_token() -> None:
    cfg = TaskConfig(code_completion_len=32, code_workers=1, code_cpu_seconds=1,
                     code_wall_seconds=2.5, code_per_test_seconds=0.5)
    task = make_task("code_unit_tests", cfg)
    assert isinstance(task, CodeUnitTestsTask) and task.validate() == []
    assert task.completion_len == 32 and task.code_cfg.workers == 1
    assert task.code_cfg.limits == SandboxLimits(cpu_seconds=1, wall_seconds=2.5,
                                                 per_test_seconds=0.5)
    fields = {f.name for f in dataclasses.fields(TaskConfig)}
    assert set(task.options) <= fields
    # the task's END token is the stop token in force unless --stop_token_ids is given
    train_cfg = TrainConfig(task="code_unit_tests", task_options=cfg)
    assert stop_tokens(train_cfg, task) == (256,)
    # options of other tasks, reward noise and bad limits are refused by name
    errors = CodeUnitTestsTask(TaskConfig(seq_len=3, reward_noise=0.1, code_workers=0,
                                          code_wall_seconds=0.0)).validate()
    for word in ("task.seq_len", "task.reward_noise", "workers", "wall_seconds"):
        assert any(word in e for e in errors), (word, errors)


def test_heldout_set_is_the_fixed_heldout_specs_for_every_seed() -> None:
    """Unlike the generated tasks, every seed evaluates on the same held-out specs; the seed
    only picks which of them fill the rows. Training prompts never reach them. Prompts are
    left-padded to one width with an attention mask."""
    task = make_task("code_unit_tests", TaskConfig(eval_batches=3, eval_batch_size=16))
    assert isinstance(task, CodeUnitTestsTask)
    heldout = {s.function for s in task.eval_specs}
    a, b, other = task.eval_prompts(0), task.eval_prompts(0), task.eval_prompts(1)
    assert len(a) == 3 and all(p.batch_size == 16 for p in a)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x.tokens_BP, y.tokens_BP) and x.targets_BT is None
    assert not torch.equal(torch.cat([p.tokens_BP for p in a]),
                           torch.cat([p.tokens_BP for p in other]))
    seen: set[str] = set()
    for p in a + other:
        assert p.tokens_BP.shape[1] == task.prompt_len and p.attention_mask_BP is not None
        seen |= {task.spec_of(p.tokens_BP[i], p.attention_mask_BP[i]).function
                 for i in range(p.batch_size)}
    assert seen == heldout
    train_p = task.sample_prompts(torch.Generator().manual_seed(0), 64)
    assert train_p.attention_mask_BP is not None
    assert not {task.spec_of(train_p.tokens_BP[i], train_p.attention_mask_BP[i]).function
                for i in range(64)} & heldout


@needs_sandbox
def test_grpo_three_steps_end_to_end(tmp_path: Path) -> None:
    """3 GRPO steps of the tiny transformer on CPU: the sandbox scores every rollout, the
    metrics are finite and registered, and the run completes."""
    result = train(TrainConfig(
        method="grpo", task="code_unit_tests",
        task_options=TaskConfig(eval_batches=1, eval_batch_size=4, code_completion_len=48,
                                code_cpu_seconds=1, code_wall_seconds=3.0,
                                code_per_test_seconds=0.5),
        run=RunConfig(num_steps=3, batch_size=8, group_size=4, eval_every=0, progress=False,
                      device="cpu", threads=1, runs_dir=str(tmp_path), log_samples=2,
                      samples_every=1)))
    assert result.status == "completed"
    metrics = read_jsonl(result.run_dir / "metrics.jsonl")
    evals = read_jsonl(result.run_dir / "eval.jsonl")
    assert len(metrics) == 3 and [e["step"] for e in evals] == [3]
    for row in metrics + evals:
        assert unregistered(row) == []
        for key, value in row.items():
            if isinstance(value, float):
                assert math.isfinite(value), key
    for row in metrics:
        assert 0.0 <= row["reward/mean"] <= 1.0
    for e in evals:
        assert {"eval/test_error", "eval/solved", "eval/sandbox_ok"} <= set(e)
        assert 0.0 <= e["eval/solved"] <= 1.0 - e["eval/test_error"] + 1e-6
    config = json.loads((result.run_dir / "config.json").read_text())
    assert config["config"]["sampling"]["stop_token_ids"] == [256]
    assert config["derived"]["stop_token_ids"] == [256]


def test_unsafe_sandbox_option_reaches_the_task() -> None:
    """``--unsafe_sandbox`` is a flat train option, off by default, documented in --help."""
    cfg = _tyro_parse(TrainConfig, ["--task", "code_unit_tests", "--unsafe_sandbox"],
                      "rlscope train")
    assert isinstance(cfg, TrainConfig) and cfg.task_options.unsafe_sandbox
    task = make_task("code_unit_tests", cfg.task_options)
    assert isinstance(task, CodeUnitTestsTask) and task.code_cfg.unsafe
    assert "unsafe_sandbox" in task.options
    default = _tyro_parse(TrainConfig, ["--task", "code_unit_tests"], "rlscope train")
    assert isinstance(default, TrainConfig) and not default.task_options.unsafe_sandbox
