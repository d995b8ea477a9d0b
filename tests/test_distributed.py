"""Data-parallel training (rlscope.distributed) on CPU with gloo: two ranks × B/2 give the
update of one process × B in float64 (loss, gradients, parameters after 3 steps, every
metric) for grpo, ppo and dg and for methods that read batch statistics and select rows, and
a 2-rank checkpoint resumes exactly on 1 and on 2 ranks."""

from __future__ import annotations

import itertools
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest
import torch

from rlscope.cli import _without_option, main
from rlscope.config import ConfigError
from rlscope.distributed import DataParallel, check_layout, split

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src"
sys.path.insert(0, str(TESTS))
from dp_worker import run_job  # noqa: E402

TOL = 1e-10
F32, F64 = torch.float32, torch.float64
TIMING = ("time/", "throughput/", "perf/")
COMMON = ["--seq_len", "4", "--eval_batches", "1", "--eval_batch_size", "8", "--threads", "1",
          "--device", "cpu", "--no-progress", "--d_model", "16", "--n_layers", "1",
          "--doctor_every", "0", "--dtype", "float64", "--eval_every", "2",
          "--log_samples", "2", "--samples_every", "1"]
METHODS = {
    # two minibatches of 2 groups each: every optimizer step is split over the ranks
    "grpo": ["--method", "grpo", "--batch_size", "16", "--group_size", "4",
             "--num_minibatches", "2", "--micro_batch_size", "4"],
    # a critic (GAE, value loss) and two inner epochs
    "ppo": ["--method", "ppo", "--batch_size", "16", "--num_minibatches", "2",
            "--inner_epochs", "2", "--micro_batch_size", "3"],
    "dg": ["--method", "dg", "--batch_size", "16", "--micro_batch_size", "4"],
    # batch statistics and selection: DAPO's mixed-group filter refilled by --fill_batch, its
    # overlong penalty and token-mean aggregation, top-p (the kept sets gathered);
    # REINFORCE++'s advantages whitened over the whole batch; kondo's batch-wide selection
    "dapo": ["--method", "dapo", "--batch_size", "16", "--group_size", "4", "--fill_batch",
             "--top_p", "0.9", "--micro_batch_size", "4"],
    "reinforce_pp": ["--method", "reinforce_pp", "--batch_size", "16", "--group_size", "4",
                     "--num_minibatches", "2"],
    "kondo": ["--method", "kondo", "--batch_size", "16"],
}


def _torchrun(jobs: list[dict[str, Any]], out: Path, nproc: int = 2) -> None:
    jobs_file = out / "jobs.json"
    jobs_file.write_text(json.dumps(jobs))
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
         str(nproc), str(TESTS / "dp_worker.py"), str(jobs_file), str(out)],
        env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]


def _load(out: Path, name: str, rank: int) -> dict[str, Any]:
    return torch.load(out / f"{name}.rank{rank}.pt", weights_only=False)


def _assert_rows_close(a: list[dict[str, float]], b: list[dict[str, float]], what: str
                       ) -> None:
    assert len(a) == len(b) > 0, what
    for ra, rb in zip(a, b, strict=True):
        untimed = {k for k in ra if not k.startswith(TIMING)}
        assert untimed == {k for k in rb if not k.startswith(TIMING)}, what
        for k in untimed:
            assert math.isclose(ra[k], rb[k], rel_tol=0, abs_tol=TOL) or (
                math.isnan(ra[k]) and math.isnan(rb[k])), (what, ra["step"], k, ra[k], rb[k])


def _assert_tensors_close(a: list[torch.Tensor | None], b: list[torch.Tensor | None],
                          what: str) -> None:
    assert len(a) == len(b) > 0, what
    for x, y in zip(a, b, strict=True):
        assert (x is None) == (y is None), what
        if x is not None and y is not None:
            assert x.dtype == torch.float64
            torch.testing.assert_close(x, y, rtol=0, atol=TOL, msg=what)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One torchrun launch on 2 ranks: each method for 3 steps, and a grpo run stopped at a
    checkpoint after 2 steps (resumed by the tests)."""
    out = tmp_path_factory.mktemp("dp")
    jobs = [{"name": m, "args": [*COMMON, *args, "--num_steps", "3", "--runs_dir",
                                 str(out / "runs2"), "--name", m]}
            for m, args in METHODS.items()]
    jobs.append({"name": "half", "args": [*COMMON, *METHODS["grpo"], "--num_steps", "2",
                                          "--runs_dir", str(out / "runs2"), "--name", "half"]})
    _torchrun(jobs, out)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("method", list(METHODS))
def test_two_ranks_equal_one_process(runs: Path, tmp_path: Path, method: str) -> None:
    one = run_job([*COMMON, *METHODS[method], "--num_steps", "3", "--runs_dir",
                   str(tmp_path), "--name", method])
    ranks = [_load(runs, method, r) for r in (0, 1)]
    assert one["status"] == ranks[0]["status"] == "completed"
    # the ranks' learners split the rows (a minibatch of an odd number of whole groups, left
    # by selection, splits unevenly)
    assert ranks[0]["rows"] + ranks[1]["rows"] == one["rows"]
    assert min(ranks[0]["rows"], ranks[1]["rows"]) >= one["rows"] // 4 > 0
    for rank in ranks:  # every rank holds the same metrics, equal to one process's
        _assert_rows_close(one["metrics"], rank["metrics"], f"{method} metrics")
        assert len(rank["steps"]) == len(one["steps"]) == 3
        for s_one, s_dp in zip(one["steps"], rank["steps"], strict=True):
            _assert_tensors_close(s_one["grads"], s_dp["grads"], f"{method} gradients")
            _assert_tensors_close(s_one["params"], s_dp["params"], f"{method} parameters")
    assert {"loss/total", "optim/grad_norm"} <= set(one["metrics"][-1])
    # rank 0 evaluates and writes the run's files; the other rank writes nothing
    _assert_rows_close(one["evals"], ranks[0]["evals"], f"{method} evals")
    assert ranks[1]["evals"] == []
    written = Path(ranks[0]["run_dir"])
    logged = [json.loads(line) for line in (written / "metrics.jsonl").read_text().splitlines()]
    _assert_rows_close(one["metrics"], logged, f"{method} metrics.jsonl")
    samples = [json.loads(line) for line in (written / "samples.jsonl").read_text().splitlines()]
    expected = [json.loads(line)
                for line in (Path(one["run_dir"]) / "samples.jsonl").read_text().splitlines()]
    assert [(r["prompt"], r["completion"]) for r in samples] == [
        (r["prompt"], r["completion"]) for r in expected]  # the same tokens sampled
    for got, want in zip(samples, expected, strict=True):
        assert math.isclose(got["advantage"], want["advantage"], abs_tol=TOL)
        assert got["reward"] == want["reward"]
    # timings reduced over ranks: the slowest rank and the mean
    for row in logged:
        assert row["time/step"] >= row["time/step_mean"] > 0


@pytest.mark.slow
def test_resume_two_rank_checkpoint_on_one_and_two_ranks(runs: Path, tmp_path: Path) -> None:
    whole = run_job([*COMMON, *METHODS["grpo"], "--num_steps", "4", "--runs_dir",
                     str(tmp_path / "whole"), "--name", "whole"])
    half = Path(_load(runs, "half", 0)["run_dir"])
    assert (half / "checkpoints" / "step_2.pt").exists()
    on_one, on_two = tmp_path / "on_one", tmp_path / "on_two"
    shutil.copytree(half, on_one)
    shutil.copytree(half, on_two)
    resume = [*COMMON, *METHODS["grpo"], "--num_steps", "4"]
    one = run_job([*resume, "--resume", str(on_one)])
    _torchrun([{"name": "resumed", "args": [*resume, "--resume", str(on_two)]}], tmp_path)
    two = _load(tmp_path, "resumed", 0)
    for run, what in ((one, "resumed on 1 rank"), (two, "resumed on 2 ranks")):
        assert [r["step"] for r in run["metrics"]] == [2, 3]
        _assert_rows_close(whole["metrics"][2:], run["metrics"], what)
        _assert_tensors_close(whole["steps"][-1]["params"], run["steps"][-1]["params"], what)
    for directory in (on_one, on_two):  # the logs read as one uninterrupted run's
        logged = [json.loads(line)
                  for line in (directory / "metrics.jsonl").read_text().splitlines()]
        _assert_rows_close(whole["metrics"], logged, f"{directory.name} metrics.jsonl")


def test_split_covers_every_item_once() -> None:
    for n in range(0, 9):
        for parts in (1, 2, 3, 4):
            bounds = [split(n, parts, i) for i in range(parts)]
            assert bounds[0][0] == 0 and bounds[-1][1] == n
            assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
            sizes = [hi - lo for lo, hi in bounds]
            assert max(sizes) - min(sizes) <= 1


def test_rank_rows_keep_groups_whole() -> None:
    ranks = [DataParallel(rank=r, world_size=2, local_rank=r) for r in (0, 1)]
    assert [dp.sample_rows(16, 4) for dp in ranks] == [slice(0, 8), slice(8, 16)]
    # a minibatch of three groups: 2 groups on rank 0, 1 on rank 1
    assert [dp.rank_rows(12, 24, 4) for dp in ranks] == [(12, 20), (20, 24)]
    # one group: rank 1 computes nothing for this minibatch
    assert [dp.rank_rows(0, 4, 4) for dp in ranks] == [(0, 4), (4, 4)]
    # not whole groups: single rows
    assert [dp.rank_rows(0, 5, 4) for dp in ranks] == [(0, 3), (3, 5)]


def test_uneven_groups_are_refused_before_training(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    assert check_layout(4, 2) == []
    assert "multiple of 2" in check_layout(3, 2)[0]
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="do not split evenly over 2 ranks"):
        run_job([*COMMON, "--method", "grpo", "--batch_size", "12", "--group_size", "4",
                 "--num_steps", "1", "--runs_dir", str(tmp_path)])
    assert not any(tmp_path.iterdir())  # nothing written


def test_nproc_is_checked_before_launching_and_not_passed_to_torchrun(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _without_option(["--nproc", "2", "--seed", "1", "--nproc=3"], "--nproc") == [
        "--seed", "1"]
    assert main(["train", *COMMON, "--method", "grpo", "--batch_size", "12", "--group_size",
                 "4", "--nproc", "2", "--runs_dir", str(tmp_path)]) == 2
    assert "make batch_size / group_size a multiple of 2" in capsys.readouterr().err
    assert main(["train", *COMMON, "--method", "grpo", "--batch_size", "16", "--nproc", "2",
                 "--jobs", "2", "--runs_dir", str(tmp_path)]) == 2
    assert "drop --jobs" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_gradient_buckets_keep_order_dtype_and_size(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlscope import distributed

    monkeypatch.setattr(distributed, "BUCKET_NUMEL", 10)
    params = [torch.zeros(4, dtype=F64), torch.zeros(4, dtype=F64), torch.zeros(4, dtype=F64),
              torch.zeros(3, dtype=F32),
              torch.zeros(20, dtype=F32), torch.zeros(2, dtype=F32)]
    buckets = distributed._buckets(params)
    assert [[id(p) for p in b] for b in buckets] == [
        [id(params[0]), id(params[1])], [id(params[2])], [id(params[3])], [id(params[4])],
        [id(params[5])]]


FSDP_METHODS = ("grpo", "ppo")
CLIP = ["--grad_clip", "0.01"]
"""Below every step's gradient norm: each step is clipped by the global norm."""


@pytest.fixture(scope="module")
def fsdp_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One torchrun launch on 2 ranks under --fsdp: grpo and ppo for 3 steps, and a grpo run
    stopped at a sharded checkpoint after 2 steps (resumed by the tests)."""
    out = tmp_path_factory.mktemp("fsdp")
    jobs = [{"name": m, "args": [*COMMON, *METHODS[m], *CLIP, "--num_steps", "3", "--fsdp",
                                 "--runs_dir", str(out / "runs2"), "--name", m]}
            for m in FSDP_METHODS]
    jobs.append({"name": "half", "args": [*COMMON, *METHODS["grpo"], "--num_steps", "2",
                                          "--fsdp", "--runs_dir", str(out / "runs2"),
                                          "--name", "half"]})
    jobs.append({"name": "bf16", "args": [*BF16, "--fsdp", "--runs_dir", str(out / "runs2"),
                                          "--name", "bf16"]})
    _torchrun(jobs, out)
    return out


BF16 = [*COMMON, *METHODS["grpo"], "--num_steps", "2", "--dtype", "float32", "--autocast",
        "bf16"]
"""Mixed precision: float32 master weights, bf16 forwards (FSDP reduces float32 gradients)."""


@pytest.mark.slow
def test_fsdp_mixed_precision_follows_one_process(fsdp_runs: Path, tmp_path: Path) -> None:
    one = run_job([*BF16, "--runs_dir", str(tmp_path)])
    for rank in (_load(fsdp_runs, "bf16", r) for r in (0, 1)):
        assert rank["status"] == "completed"
        for s_one, s_dp in zip(one["steps"], rank["steps"], strict=True):
            for x, y in zip(s_one["params"], s_dp["params"], strict=True):
                assert y.dtype == torch.float32
                torch.testing.assert_close(x, y, rtol=0, atol=1e-3)
        assert rank["metrics"][-1]["loss/total"] == pytest.approx(
            one["metrics"][-1]["loss/total"], abs=1e-2)


@pytest.mark.slow
@pytest.mark.parametrize("method", FSDP_METHODS)
def test_fsdp_two_ranks_equal_one_process(fsdp_runs: Path, tmp_path: Path, method: str
                                          ) -> None:
    one = run_job([*COMMON, *METHODS[method], *CLIP, "--num_steps", "3", "--runs_dir",
                   str(tmp_path), "--name", method])
    ranks = [_load(fsdp_runs, method, r) for r in (0, 1)]
    assert one["status"] == ranks[0]["status"] == ranks[1]["status"] == "completed"
    # each rank computed part of the rows (plus zero-weighted micro-batches that keep the
    # ranks' FSDP collectives in step where one rank has fewer)
    assert one["rows"] <= ranks[0]["rows"] + ranks[1]["rows"] < one["rows"] + 6
    assert 0 < min(ranks[0]["rows"], ranks[1]["rows"]) < one["rows"]
    for rank in ranks:  # the loss, every metric, the summed gradient and the parameters
        _assert_rows_close(one["metrics"], rank["metrics"], f"fsdp {method} metrics")
        assert len(rank["steps"]) == len(one["steps"]) == 3
        for s_one, s_dp in zip(one["steps"], rank["steps"], strict=True):
            _assert_tensors_close(s_one["grads"], s_dp["grads"], f"fsdp {method} gradients")
            _assert_tensors_close(s_one["params"], s_dp["params"], f"fsdp {method} params")
    # every step was clipped (the parameters agree, so the norm clipped is the global one)
    assert all(r["optim/clip_active"] == 1.0 for r in one["metrics"])
    written = Path(ranks[0]["run_dir"])
    logged = [json.loads(line) for line in (written / "metrics.jsonl").read_text().splitlines()]
    _assert_rows_close(one["metrics"], logged, f"fsdp {method} metrics.jsonl")
    _assert_rows_close(one["evals"], ranks[0]["evals"], f"fsdp {method} evals")
    # the checkpoint is a sharded directory (torch.distributed.checkpoint), latest.pt names it
    folder = written / "checkpoints"
    assert (folder / "step_3" / ".metadata").is_file()
    assert (folder / "step_3" / "state.pt").is_file()
    assert (folder / "latest.pt").read_text() == "step_3"
    assert not list(folder.glob("*.tmp"))


@pytest.mark.slow
def test_fsdp_checkpoint_resumes_on_one_and_two_ranks(fsdp_runs: Path, tmp_path: Path) -> None:
    """2 -> 1 (a sharded checkpoint into one process), 2 -> 2 (into sharded ranks, and into
    replicated ranks without --fsdp) and 1 -> 2 (an ordinary checkpoint into sharded ranks)
    all continue as the uninterrupted run."""
    grpo = [*COMMON, *METHODS["grpo"]]
    whole = run_job([*grpo, "--num_steps", "4", "--runs_dir", str(tmp_path / "whole"),
                     "--name", "whole"])
    half = Path(_load(fsdp_runs, "half", 0)["run_dir"])
    assert (half / "checkpoints" / "step_2" / ".metadata").is_file()
    on_one, on_two, replicated = (tmp_path / n for n in ("on_one", "on_two", "replicated"))
    for copy in (on_one, on_two, replicated):
        shutil.copytree(half, copy)
    one_proc = run_job([*grpo, "--num_steps", "2", "--runs_dir", str(tmp_path),
                        "--name", "plain"])  # an ordinary step_2.pt
    plain = Path(one_proc["run_dir"])
    assert (plain / "checkpoints" / "step_2.pt").is_file()
    one = run_job([*grpo, "--num_steps", "4", "--resume", str(on_one)])
    _torchrun([{"name": "two", "args": [*grpo, "--num_steps", "4", "--fsdp", "--resume",
                                        str(on_two)]},
               {"name": "plain", "args": [*grpo, "--num_steps", "4", "--fsdp", "--resume",
                                          str(plain)]},
               {"name": "replicated", "args": [*grpo, "--num_steps", "4", "--resume",
                                               str(replicated)]}], tmp_path)
    for run, what in ((one, "2 -> 1"), (_load(tmp_path, "two", 0), "2 -> 2"),
                      (_load(tmp_path, "plain", 1), "1 -> 2"),
                      (_load(tmp_path, "replicated", 1), "2 sharded -> 2 replicated")):
        assert [r["step"] for r in run["metrics"]] == [2, 3], what
        _assert_rows_close(whole["metrics"][2:], run["metrics"], what)
        _assert_tensors_close(whole["steps"][-1]["params"], run["steps"][-1]["params"], what)
    for directory in (on_one, on_two, plain, replicated):  # as one uninterrupted run's logs
        logged = [json.loads(line)
                  for line in (directory / "metrics.jsonl").read_text().splitlines()]
        _assert_rows_close(whole["metrics"], logged, f"{directory.name} metrics.jsonl")
    # one process writes ordinary files after the sharded one; the sharded runs directories
    assert (on_one / "checkpoints" / "step_4.pt").is_file()
    assert (on_two / "checkpoints" / "step_4" / ".metadata").is_file()
    assert (plain / "checkpoints" / "step_4" / ".metadata").is_file()
    assert (replicated / "checkpoints" / "step_4.pt").is_file()


def test_fsdp_refuses_what_it_cannot_shard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    from rlscope.cli import _tyro_parse
    from rlscope.config import TrainConfig, validate

    def errors(*extra: str) -> str:
        cfg = _tyro_parse(TrainConfig, [*COMMON, *METHODS["grpo"], "--runs_dir",
                                        str(tmp_path), "--fsdp", *extra], "test")
        assert isinstance(cfg, TrainConfig)
        with pytest.raises(ConfigError) as caught:
            validate(cfg)
        return str(caught.value)

    assert "give --nproc 2 or more (or launch with torchrun" in errors()
    assert main(["train", *COMMON, *METHODS["grpo"], "--fsdp", "--runs_dir",
                 str(tmp_path)]) == 2
    assert "run.fsdp shards the model over data-parallel ranks" in capsys.readouterr().err
    for extra, what in ((["--grad_diagnostics"], "--grad_diagnostics"),
                        (["--entropy_diagnostics"], "--entropy_diagnostics")):
        message = errors("--nproc", "2", *extra)
        assert f"run.fsdp cannot be combined with {what}: drop --fsdp" in message
        assert "give --nproc 2" not in message
    monkeypatch.setenv("WORLD_SIZE", "2")  # under torchrun the launcher's count counts
    assert "with --grad_diagnostics" in errors("--grad_diagnostics")
    assert "give --nproc 2" not in errors("--grad_diagnostics")
    assert not any(tmp_path.iterdir())  # nothing written


def test_sharded_checkpoint_directories_in_the_newest_intact_logic(tmp_path: Path) -> None:
    """A ``step_<N>/`` directory without DCP's .metadata (cut off) is skipped for the newest
    intact file, renamed ``.corrupt`` when the resume goes ahead, and a ``.tmp`` directory of
    a write in progress is removed."""
    from rlscope import checkpoint

    run = run_job([*COMMON, *METHODS["grpo"], "--num_steps", "2", "--checkpoint_every", "1",
                   "--runs_dir", str(tmp_path), "--name", "r"])
    folder = Path(run["run_dir"]) / "checkpoints"
    (folder / "step_3").mkdir()
    shutil.copy(folder / "step_2.pt", folder / "step_3" / "state.pt")
    (folder / "step_4.tmp").mkdir()
    assert [s for s, _ in checkpoint.checkpoint_files(Path(run["run_dir"]))] == [3, 2, 1]
    payload, path, notices = checkpoint.newest_intact(Path(run["run_dir"]), "cpu")
    assert path == folder / "step_2.pt" and payload["step"] == 2
    assert notices == [f"skipping checkpoint {folder / 'step_3'}: no .metadata (an incomplete "
                       "sharded checkpoint)"]
    checkpoint.adopt(Path(run["run_dir"]), 2)
    assert sorted(p.name for p in folder.iterdir()) == [
        "latest.pt", "step_1.pt", "step_2.pt", "step_3.corrupt"]
    assert (folder / "latest.pt").read_text() == "step_2.pt"
    assert checkpoint.init_weights_path(run["run_dir"]) == folder / "step_2.pt"
    (folder / "step_5").mkdir()  # --init reads whole weights: a sharded latest is refused
    (folder / "latest.pt").write_text("step_5")
    with pytest.raises(FileNotFoundError, match=r"step_5 is sharded .* --resume"):
        checkpoint.init_weights_path(run["run_dir"])


def test_fsdp_units_are_the_transformer_blocks() -> None:
    from rlscope.distributed import transformer_blocks
    from rlscope.policy import ModelConfig, build_policy

    tiny = build_policy(ModelConfig(d_model=8, n_layers=3), 5, 16)
    assert transformer_blocks(cast(torch.nn.Module, tiny)) == list(
        cast(Any, tiny).blocks)
    qwen = build_policy(ModelConfig(arch="qwen2", d_model=8, n_heads=2, n_layers=2), 5, 16)
    layers = transformer_blocks(cast(torch.nn.Module, qwen))
    assert [type(b).__name__ for b in layers] == ["Qwen2DecoderLayer"] * 2
    assert transformer_blocks(torch.nn.Linear(2, 2)) == []  # the root is the only unit
