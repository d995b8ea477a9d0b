"""Environment workers (``--env_workers N``, `rlscope.env_workers`): rewards scored in Ray actors
equal the in-process ones (the code task's sandbox, and a plain scoring function); a worker that
raises, crashes or hangs is retried and counted; a chunk that keeps failing gets the failure
reward; the configuration is checked before the run starts. The pool tests run on one local Ray
cluster (2 CPUs) whose workers can import this module."""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import rlscope
from rlscope.batch import RolloutBatch
from rlscope.config import ConfigError, RunConfig, TrainConfig, validate
from rlscope.env_workers import PoolOptions, ScoringPool, chunk_slices, concat_scores
from rlscope.metrics.sinks import read_jsonl
from rlscope.sandbox import isolation_problem
from rlscope.tasks.base import Scores, TaskConfig
from rlscope.tasks.code import CodeUnitTestsTask

HERE = Path(__file__).resolve().parent
SRC = Path(rlscope.__file__).resolve().parents[1]


class ScriptedTask:
    """A scoring function (reward = the sum of a row's completion tokens) that misbehaves on
    purpose: ``mode`` ``raise``, ``crash`` (the process exits) or ``hang`` on the first call of
    the whole test (a marker file in ``marker`` says it happened), or ``poison`` on every call
    that holds the row with group id 3."""

    def __init__(self, mode: str = "", marker: str = "") -> None:
        self.mode, self.marker = mode, marker

    def _first(self) -> bool:
        try:
            os.close(os.open(Path(self.marker) / "done", os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return False
        return True

    def score(self, batch: RolloutBatch) -> Scores:
        if self.mode == "poison" and 3 in batch.group_id_B.tolist():
            os._exit(3)
        if self.mode in ("raise", "crash", "hang") and self._first():
            if self.mode == "raise":
                raise RuntimeError("scripted failure")
            if self.mode == "crash":
                os._exit(1)
            time.sleep(600)
        return Scores(rewards_B=batch.completion_tokens_BT.sum(1).float(),
                      unshaped_rewards_B=batch.completion_tokens_BT[:, 0].float())


class UnbuildableTask(ScriptedTask):
    """A task whose construction raises: once in the whole test (``once``, a marker file in
    ``marker`` says it happened), or always."""

    def __init__(self, marker: str, once: bool) -> None:
        super().__init__("", marker)
        if not once or self._first():
            raise RuntimeError("scripted start failure")


def _batch(rows: int, width: int = 5) -> RolloutBatch:
    g = torch.Generator().manual_seed(0)
    tokens_BT = torch.randint(0, 9, (rows, width), generator=g)
    return RolloutBatch(prompt_tokens_BP=torch.zeros(rows, 2, dtype=torch.long),
                        prompt_mask_BP=None, completion_tokens_BT=tokens_BT,
                        completion_mask_BT=torch.ones(rows, width),
                        logp_sampler_BT=torch.zeros(rows, width),
                        logp_raw_BT=torch.zeros(rows, width),
                        finished_by_stop_B=torch.ones(rows, dtype=torch.bool),
                        group_id_B=torch.arange(rows))


def test_chunks_and_failed_chunks_in_row_order() -> None:
    assert chunk_slices(10, 3, 0) == [slice(0, 4), slice(4, 8), slice(8, 10)]
    assert chunk_slices(4, 8, 0) == [slice(i, i + 1) for i in range(4)]
    assert chunk_slices(5, 2, 2) == [slice(0, 2), slice(2, 4), slice(4, 5)]
    ok = Scores(torch.tensor([1.0, 2.0]), torch.ones(2, 3), torch.tensor([0.5, 0.5]))
    slices = [slice(0, 2), slice(2, 3), slice(3, 5)]
    out = concat_scores([ok, None, ok], slices, 3, -1.0, torch.device("cpu"))
    assert out.rewards_B.tolist() == [1.0, 2.0, -1.0, 1.0, 2.0]
    assert out.unshaped_rewards_B is not None and out.token_rewards_BT is not None
    assert out.unshaped_rewards_B.tolist() == [0.5, 0.5, -1.0, 0.5, 0.5]
    assert out.token_rewards_BT[2].tolist() == [0.0, 0.0, 0.0]
    assert out.token_rewards_BT[3].tolist() == [1.0, 1.0, 1.0]
    every = concat_scores([None], [slice(0, 2)], 3, 0.0, torch.device("cpu"))
    assert every.rewards_B.tolist() == [0.0, 0.0] and every.token_rewards_BT is None


def test_configuration_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    """A task that scores with the trained policy and a zero timeout are refused; without Ray
    the error says how to install it."""
    with pytest.raises(ConfigError) as e:
        validate(TrainConfig(task="lm_bandit", run=RunConfig(env_workers=2, env_timeout_s=0.0,
                                                             device="cpu")))
    assert "task 'lm_bandit' scores with the trained policy" in str(e.value)
    assert "run.env_timeout_s=0.0 must be > 0 (--env_timeout_s)" in str(e.value)
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ConfigError, match=r"run.env_workers needs Ray, which is not installed: "
                                          r"pip install -e '.\[ray\]'"):
        validate(TrainConfig(run=RunConfig(env_workers=1, device="cpu")))
    validate(TrainConfig(run=RunConfig(env_workers=0, device="cpu")))


def test_env_workers_are_refused_under_data_parallel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every data-parallel rank scores the whole batch: separate pools could give the ranks
    different rewards (a timeout on one rank only), so --env_workers with --nproc > 1, or in
    a torchrun rank, is refused before training."""
    for run, env in ((RunConfig(env_workers=2, nproc=2, device="cpu"), "1"),
                     (RunConfig(env_workers=2, device="cpu"), "2")):
        monkeypatch.setenv("WORLD_SIZE", env)
        with pytest.raises(ConfigError, match=r"run\.env_workers with data parallel"):
            validate(TrainConfig(run=run))
    monkeypatch.setenv("WORLD_SIZE", "2")
    validate(TrainConfig(run=RunConfig(env_workers=0, device="cpu")))


@pytest.fixture(scope="module")
def ray_session() -> Iterator[None]:
    ray = pytest.importorskip("ray")
    path = os.pathsep.join([str(SRC), str(HERE), os.environ.get("PYTHONPATH", "")])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path, "OMP_NUM_THREADS": "1"}})
    yield
    ray.shutdown()


def _pool(mode: str, tmp_path: Path, **options: float) -> ScoringPool:
    make = functools.partial(ScriptedTask, mode, str(tmp_path))
    return ScoringPool(make, PoolOptions(**{"workers": 2, "timeout_s": 20.0, **options}),
                       failure_reward=-1.0)


@pytest.mark.slow
@pytest.mark.skipif(bool(isolation_problem()), reason="no isolated sandbox")
def test_code_task_rewards_equal_the_in_process_path(ray_session: None) -> None:
    """Reference bodies, wrong bodies and garbage, scored by 2 workers in 3 chunks: the same
    rewards as the task's own score, no error."""
    task = CodeUnitTestsTask(TaskConfig(code_completion_len=256, code_workers=1))
    n = len(task.specs)
    texts = [task.specs[b % n].reference if b % 3 == 0 else
             ["    return None\n", "", "    while True:\n        pass\n"][b % 3] if b % 3 == 2
             else "    return 0\n" for b in range(9)]
    from test_code_task import _rollout

    batch = _rollout(task, [b % n for b in range(9)], texts)
    pool = ScoringPool(functools.partial(CodeUnitTestsTask, task.cfg, task.code_cfg),
                       PoolOptions(workers=2, chunk_size=3))
    try:
        scores, errors = pool.score(batch)
    finally:
        pool.close()
    expected = task.score(batch).rewards_B
    assert errors == 0
    assert torch.equal(scores.rewards_B, expected) and expected[0] == 1.0
    assert expected.tolist() != [expected[0].item()] * 9


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["raise", "crash", "hang"])
def test_a_failing_worker_is_retried_and_counted(mode: str, tmp_path: Path,
                                                 ray_session: None) -> None:
    """The first call raises, kills its worker or hangs past the timeout: one error, the chunk
    is retried (on a new worker where the old one died or was killed), and every reward equals
    the in-process score. The next batch scores without error."""
    batch = _batch(6)
    pool = _pool(mode, tmp_path, timeout_s=8.0)
    try:
        scores, errors = pool.score(batch)
        again, errors_again = pool.score(batch)
    finally:
        pool.close()
    expected = ScriptedTask().score(batch)
    assert errors == 1 and errors_again == 0
    for got in (scores, again):
        assert torch.equal(got.rewards_B, expected.rewards_B)
        assert got.unshaped_rewards_B is not None and expected.unshaped_rewards_B is not None
        assert torch.equal(got.unshaped_rewards_B, expected.unshaped_rewards_B)


@pytest.mark.slow
def test_a_worker_that_fails_to_start_is_started_again_and_counted(tmp_path: Path,
                                                                   ray_session: None) -> None:
    """One worker's task raises while being built: one error, the worker is started again,
    and every reward equals the in-process score. A task that can never be built leaves no
    worker: the run stops with the reason (after 1 + retries starts of each worker)."""
    batch = _batch(6)
    pool = ScoringPool(functools.partial(UnbuildableTask, str(tmp_path), True),
                       PoolOptions(workers=2, timeout_s=20.0, retries=1), failure_reward=-1.0)
    try:
        scores, errors = pool.score(batch)
    finally:
        pool.close()
    assert errors == 1
    assert torch.equal(scores.rewards_B, ScriptedTask().score(batch).rewards_B)
    never = ScoringPool(functools.partial(UnbuildableTask, str(tmp_path), False),
                        PoolOptions(workers=2, timeout_s=20.0, retries=1), failure_reward=-1.0)
    try:
        with pytest.raises(RuntimeError, match=r"no environment worker could start .*"
                           r"scripted start failure"):
            never.score(batch)
    finally:
        never.close()


@pytest.mark.slow
def test_a_sample_that_always_crashes_gets_the_failure_reward(tmp_path: Path,
                                                               ray_session: None) -> None:
    """With one row per call, the row that kills every worker is tried 1 + retries times, then
    gets the failure reward; the other rows keep their rewards."""
    batch = _batch(5)
    pool = _pool("poison", tmp_path, chunk_size=1, retries=1)
    try:
        scores, errors = pool.score(batch)
    finally:
        pool.close()
    expected = ScriptedTask().score(batch).rewards_B.tolist()
    expected[3] = -1.0
    assert errors == 2 and scores.rewards_B.tolist() == expected


@pytest.mark.slow
@pytest.mark.skipif(bool(isolation_problem()), reason="no isolated sandbox")
def test_training_with_env_workers_equals_in_process(tmp_path: Path, ray_session: None) -> None:
    """Two GRPO steps on the code task: every metric but timings is the same with 2 workers as
    in process, and env/errors is logged as 0."""
    def run(workers: int) -> list[dict[str, float]]:
        from rlscope.train import train

        result = train(TrainConfig(
            method="grpo", task="code_unit_tests",
            task_options=TaskConfig(eval_batches=1, eval_batch_size=4, code_completion_len=32,
                                    code_workers=1),
            run=RunConfig(num_steps=2, batch_size=8, group_size=4, eval_every=0,
                          progress=False, device="cpu", threads=1, runs_dir=str(tmp_path),
                          name=f"w{workers}", env_workers=workers)))
        return [{k: v for k, v in r.items() if not k.startswith(("time/", "throughput/"))}
                for r in read_jsonl(result.run_dir / "metrics.jsonl")]

    local, remote = run(0), run(2)
    assert [r.pop("env/errors") for r in remote] == [0.0, 0.0]
    assert remote == local
