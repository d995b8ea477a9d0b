"""twenty_questions' model answerer (issue 20, the multi-agent case): the answerer's SFT task,
the model answerer answering through the environment (batched, cut to one line), the
questions read back from episode batches, --twenty_questions_train_answerer (its own
optimizer and metrics, checkpointed: exact resume) and every rejection."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from rlscope import checkpoint
from rlscope.batch import RolloutBatch
from rlscope.cli import main
from rlscope.envs import EnvConfig
from rlscope.envs.text import NEWLINE, encode
from rlscope.envs.twenty_questions import (
    MAX_ANSWER_BYTES,
    OracleAnswerer,
    TwentyQuestions,
    answerer_sft_pairs,
    load_table,
)
from rlscope.policy import ModelConfig
from rlscope.sampling.draw import SamplingConfig
from rlscope.sampling.episodes import generate_episodes
from rlscope.supervised.sft import SftConfig, sft
from rlscope.tasks import TaskConfig, TrainsCompanion, make_task
from rlscope.tasks.answerer import (
    TASK_NAME,
    AnswererTraining,
    AskedQuestion,
    ModelAnswerer,
    answer_prompts,
    answerer_accuracy,
    answerer_update,
    asked_questions,
    load_answerer,
)
from rlscope.tasks.base import make_policy_for
from rlscope.tasks.twenty_questions import TwentyQuestionsTask

QUESTIONER = TaskConfig(max_turns=3, max_turn_tokens=32, max_episode_tokens=120,
                        eval_batches=1, eval_batch_size=8)
EPISODE_FLAGS = ["--max_turns", "3", "--max_turn_tokens", "32", "--max_episode_tokens", "120",
                 "--eval_batches", "1", "--eval_batch_size", "8"]


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A questioner warm-started 20 SFT steps (it asks question-shaped lines, mostly outside the
    table) and an answerer warm-started 20 steps on the table, in one folder (``q``, ``a``)."""
    root = tmp_path_factory.mktemp("warm")
    common = {"eval_every": 0, "lr": 3e-3, "runs_dir": str(root), "device": "cpu",
              "threads": 1, "progress": False}
    sft(SftConfig(task="twenty_questions", task_options=QUESTIONER, num_steps=20,
                  batch_size=16, name="q", **common))  # type: ignore[arg-type]
    sft(SftConfig(task=TASK_NAME, task_options=TaskConfig(eval_batches=1, eval_batch_size=8),
                  num_steps=20, batch_size=16, name="a", **common))  # type: ignore[arg-type]
    return root


def model_task(answerer: Path, **env: object) -> TwentyQuestionsTask:
    cfg = TaskConfig(**{**QUESTIONER.__dict__, "env": EnvConfig(
        twenty_questions_answerer="model", twenty_questions_answerer_path=str(answerer),
        **env)})  # type: ignore[arg-type]
    task = make_task("twenty_questions", cfg)
    assert isinstance(task, TwentyQuestionsTask)
    return task


# ------------------------------------------------------------- the answerer's task


def test_answerer_task_pairs_are_the_tables_oracle_answers() -> None:
    task = make_task(TASK_NAME, TaskConfig())
    assert task.validate() == []
    all_pairs = {(tuple(p), tuple(c)) for p, c in answerer_sft_pairs()}
    drawn = task.sft_pairs(torch.Generator().manual_seed(0), 64)  # type: ignore[attr-defined]
    assert all((tuple(p), tuple(c)) in all_pairs for p, c in drawn)
    assert len(task.items) == len(all_pairs) == 49 * 103  # type: ignore[attr-defined]
    assert max(len(p) for p, _ in answerer_sft_pairs()) <= task.prompt_len


def test_answerer_task_scores_the_oracles_answer_one() -> None:
    task = make_task(TASK_NAME, TaskConfig())
    oracle = OracleAnswerer(load_table())
    items = [("dog", "is it an animal?"), ("car", "can it fly?"), ("sun", "what is it?")]
    prompts = answer_prompts([s for s, _ in items], [q for _, q in items], task.prompt_len)

    def rewards(answers: list[str]) -> list[float]:
        ids = [list(encode(a)) for a in answers]
        T = max(map(len, ids))
        tokens_BT = torch.full((3, T), NEWLINE)
        mask_BT = torch.zeros(3, T)
        for i, a in enumerate(ids):
            tokens_BT[i, :len(a)] = torch.tensor(a)
            mask_BT[i, :len(a)] = 1
        batch = RolloutBatch(prompt_tokens_BP=prompts.tokens_BP,
                             prompt_mask_BP=prompts.attention_mask_BP,
                             completion_tokens_BT=tokens_BT, completion_mask_BT=mask_BT,
                             logp_sampler_BT=torch.zeros(3, T), logp_raw_BT=torch.zeros(3, T),
                             finished_by_stop_B=torch.ones(3, dtype=torch.bool),
                             group_id_B=torch.arange(3))
        return task.score(batch).rewards_B.tolist()

    truth = [oracle.answer_text(s, q) for s, q in items]
    assert truth == ["yes\n", "no\n", "I can't answer that\n"]
    assert rewards(truth) == [1.0, 1.0, 1.0]
    # wrong; right; right without its newline (the environment adds it)
    assert rewards(["maybe\n", "no\n", "I can't answer that"]) == [0.0, 1.0, 1.0]


# ------------------------------------------------------------- the model answerer


def test_model_answerer_answers_through_the_environment_one_line(warm: Path) -> None:
    answerer = load_answerer(str(warm / "a"))
    factory = TwentyQuestions(EnvConfig(twenty_questions_answerer="model"), answerer=answerer)
    questions = ["is it an animal?\n", "can it fly?\n", "what is it?\n", "is it a dog?\n",
                 "is it " + "very " * 30 + "big?\n"]  # longer than the answerer reads
    for seed in range(3):
        for q in questions:
            env = factory.make(seed)
            env.reset()
            t = env.step(encode(q))
            assert (not t.done and t.reward == 0.0) or t.reason == "solved"
            if not t.done:
                assert t.observation[-1] == NEWLINE and NEWLINE not in t.observation[:-1]
                assert 1 <= len(t.observation) <= MAX_ANSWER_BYTES
    # the batched answers are the one-by-one answers
    secrets = ["dog", "penguin", "car", "apple"]
    ids = [encode(q) for q in questions[:4]]
    batched = answerer.answer_many(secrets, ids)
    assert batched == [answerer.answer(s, q) for s, q in zip(secrets, ids, strict=True)]
    assert all(len(a) <= MAX_ANSWER_BYTES for a in batched)


def test_step_many_equals_stepping_one_by_one_and_answers_in_one_call(warm: Path) -> None:
    answerer = load_answerer(str(warm / "a"))
    calls: list[int] = []

    class Counting(ModelAnswerer):
        def answer_many(self, secrets, questions):  # type: ignore[no-untyped-def]
            calls.append(len(questions))
            return super().answer_many(secrets, questions)

    counting = Counting(answerer.policy, answerer.prompt_len)
    factory = TwentyQuestions(EnvConfig(twenty_questions_answerer="model"), answerer=counting)
    together = [factory.make(s) for s in range(5)]
    alone = [factory.make(s) for s in range(5)]
    table = factory.table
    other = table.names[(together[4].secret + 1) % len(table.names)]  # a wrong guess
    actions = [encode(a) for a in ("is it alive?\n", "no question\n", "I give up\n",
                                   "does it fit in your hand?\n", f"is it the {other}?\n")]
    got = factory.step_many(together, actions)  # type: ignore[arg-type]
    assert calls == [3]  # the three questions for the answerer, in one decode
    want = [env.step(a) for env, a in zip(alone, actions, strict=True)]
    assert got == want
    assert [e.turns for e in together] == [e.turns for e in alone] == [1] * 5


def test_the_episode_sampler_answers_the_questions_of_a_position_together(warm: Path) -> None:
    """A batch answerer sees every question that ends at one position in one call, and the
    episodes are those of answering one by one."""
    table = load_table()
    calls: list[int] = []

    class BatchedOracle:
        def __init__(self) -> None:
            self.oracle = OracleAnswerer(table)

        def answer(self, secret: str, question: tuple[int, ...]) -> tuple[int, ...]:
            return self.oracle.answer(secret, question)

        def answer_many(self, secrets: list[str], questions: list[tuple[int, ...]]
                        ) -> list[tuple[int, ...]]:
            calls.append(len(questions))
            return [self.oracle.answer(s, q) for s, q in zip(secrets, questions, strict=True)]

    task = make_task("twenty_questions", QUESTIONER)
    assert isinstance(task, TwentyQuestionsTask)
    policy = make_policy_for(task, ModelConfig())
    checkpoint.load_init(str(warm / "q"), policy, torch.device("cpu"))
    B = 16  # rows i and i + 8 share their seeds: the same episode, questions at one position
    env_seeds, row_seeds = torch.arange(B) % 8, torch.arange(B) % 8
    cfg = EnvConfig(twenty_questions_answerer="model")
    batched = generate_episodes(policy, TwentyQuestions(cfg, answerer=BatchedOracle()),
                                env_seeds, task.budget, SamplingConfig(temperature=1.0),
                                row_seeds)
    alone = generate_episodes(policy, task.factory, env_seeds, task.budget,
                              SamplingConfig(temperature=1.0), row_seeds)
    assert torch.equal(batched.completion_tokens_BT, alone.completion_tokens_BT)
    assert torch.equal(batched.env_mask_BT, alone.env_mask_BT)  # type: ignore[arg-type]
    asked = asked_questions(alone, table)
    assert len(asked) > 0 and sum(calls) >= len(asked)  # (the last turn's answer is not fed)
    assert calls and all(n % 2 == 0 for n in calls)  # both twins' questions in every call


def test_asked_questions_reads_every_answered_question_of_a_batch(warm: Path) -> None:
    task = make_task("twenty_questions", QUESTIONER)  # the oracle answers
    assert isinstance(task, TwentyQuestionsTask)
    policy = make_policy_for(task, ModelConfig())
    checkpoint.load_init(str(warm / "q"), policy, torch.device("cpu"))
    B = 16
    batch = generate_episodes(policy, task.factory, torch.arange(B), task.budget,
                              SamplingConfig(temperature=1.0), torch.arange(B))
    asked = asked_questions(batch, task.twenty.table)
    assert len(asked) >= 4  # the warm start asks question-shaped lines
    table = task.twenty.table
    for q in asked:
        assert q.secret in table.names and q.answer.endswith(b"\n")
        assert q.question.rstrip().endswith("?")
    assert answerer_accuracy(asked, OracleAnswerer(table)) == 1.0  # the oracle answered them
    # the number of answered questions is the number of answer segments fed back that do not
    # ask for a question
    need = encode("ask a yes/no question ending in ?\n")
    segments = 0
    for i in range(B):
        env_ids = batch.completion_tokens_BT[i][batch.env_mask_BT[i].bool()].tolist()
        lines = bytes(env_ids).split(b"\n")[:-1]
        segments += sum(line + b"\n" != bytes(need) and line != b"" for line in lines)
    assert len(asked) == segments


# ------------------------------------------------------------- rlscope train


def _train(tmp: Path, warm: Path, name: str, *extra: str, steps: int = 2) -> int:
    return main(["train", "--task", "twenty_questions", *EPISODE_FLAGS,
                 "--twenty_questions_answerer", "model",
                 "--twenty_questions_answerer_path", str(warm / "a"),
                 "--init", str(warm / "q"), "--method", "grpo", "--batch_size", "16",
                 "--group_size", "4", "--num_steps", str(steps), "--eval_every", "0",
                 "--device", "cpu", "--threads", "1", "--no_progress",
                 "--runs_dir", str(tmp), "--name", name, *extra])


def _answerer_weights(run: Path) -> dict[str, torch.Tensor]:
    payload = torch.load(run / "checkpoints" / "step_2.pt", weights_only=True)
    return payload.get("companion", {}).get("answerer", {})


def test_the_answerer_update_moves_its_weights_on_the_faithful_reward(warm: Path) -> None:
    answerer = load_answerer(str(warm / "a"))
    table = load_table()
    oracle = OracleAnswerer(table)
    asked = [AskedQuestion(name, q, b"") for name in table.names[:12]
             for q in ("is it an animal?", "can it fly?", "is it made of metal?")]
    before = {k: v.clone() for k, v in answerer.policy.state_dict().items()}  # type: ignore
    training = AnswererTraining(
        torch.optim.Adam(answerer.policy.parameters(), lr=1e-3),
        torch.Generator().manual_seed(0), samples=4)
    m = answerer_update(answerer, training, asked, oracle)
    # the 20-step answerer's sampled answers are partly the oracle's: a signal to learn from
    assert 0.0 < float(m["answerer/reward_mean"]) < 1.0 and math.isfinite(float(m["answerer/loss"]))
    after = answerer.policy.state_dict()  # type: ignore[attr-defined]
    assert any(not torch.equal(before[k], after[k]) for k in before)
    # the same stream and weights give the same update (the resume test relies on it)
    again = load_answerer(str(warm / "a"))
    training2 = AnswererTraining(torch.optim.Adam(again.policy.parameters(), lr=1e-3),
                                 torch.Generator().manual_seed(0), samples=4)
    m2 = answerer_update(again, training2, asked, oracle)
    assert float(m2["answerer/loss"]) == float(m["answerer/loss"])


def test_train_answerer_steps_its_own_optimizer_and_logs_finite_metrics(
        warm: Path, tmp_path: Path) -> None:
    assert _train(tmp_path, warm, "trained", "--twenty_questions_train_answerer") == 0
    payload = torch.load(tmp_path / "trained" / "checkpoints" / "step_2.pt", weights_only=True)
    companion = payload["companion"]
    start = torch.load(warm / "a" / "sft.pt", weights_only=True)["policy"]
    assert set(companion["answerer"]) == set(start)
    # its own Adam (not the policy's) took one step per training step
    steps = {float(s["step"]) for s in companion["optimizer"]["state"].values()}
    assert steps == {2.0}
    assert len(companion["optimizer"]["param_groups"]) == 1
    assert companion["optimizer"]["param_groups"][0]["lr"] == 1e-4
    rows = [json.loads(line) for line in (tmp_path / "trained" / "metrics.jsonl").open()]
    assert len(rows) == 2
    for row in rows:
        assert row["answerer/questions"] > 0
        for name in ("answerer/accuracy", "answerer/loss", "answerer/reward_mean"):
            assert math.isfinite(row[name])
        assert 0.0 <= row["answerer/accuracy"] <= 1.0
        assert 0.0 <= row["answerer/reward_mean"] <= 1.0


def test_a_frozen_model_answerer_is_not_trained_nor_checkpointed(warm: Path,
                                                                  tmp_path: Path) -> None:
    assert _train(tmp_path, warm, "frozen") == 0
    assert _answerer_weights(tmp_path / "frozen") == {}  # nothing to restore: it never moved
    task = model_task(warm / "a")
    before = {k: v.clone() for k, v in task.model.policy.state_dict().items()}  # type: ignore
    assert isinstance(task, TrainsCompanion)
    task.start_companion(torch.device("cpu"), 0)
    assert task.training is None
    rows = [json.loads(line) for line in (tmp_path / "frozen" / "metrics.jsonl").open()]
    assert all("answerer/loss" not in row and "answerer/accuracy" in row for row in rows)
    after = task.model.policy.state_dict()  # type: ignore[union-attr]
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_a_run_training_the_answerer_resumes_exactly(warm: Path, tmp_path: Path) -> None:
    flags = ("--twenty_questions_train_answerer", "--checkpoint_every", "1")
    assert _train(tmp_path, warm, "whole", *flags, steps=2) == 0
    assert _train(tmp_path, warm, "cut", *flags, steps=1) == 0
    assert main(["train", "--task", "twenty_questions", *EPISODE_FLAGS,
                 "--twenty_questions_answerer", "model",
                 "--twenty_questions_answerer_path", str(warm / "a"),
                 "--init", str(warm / "q"), "--method", "grpo", "--batch_size", "16",
                 "--group_size", "4", "--num_steps", "2", "--eval_every", "0",
                 "--device", "cpu", "--threads", "1", "--no_progress",
                 "--runs_dir", str(tmp_path), "--resume", str(tmp_path / "cut"),
                 *flags]) == 0

    def records(name: str) -> list[dict[str, float]]:
        return [{k: v for k, v in json.loads(line).items()
                 if not k.startswith(("time/", "env/time", "throughput/"))}
                for line in (tmp_path / name / "metrics.jsonl").open()]

    assert records("cut") == records("whole")
    whole, cut = _answerer_weights(tmp_path / "whole"), _answerer_weights(tmp_path / "cut")
    assert whole and all(torch.equal(whole[k], cut[k]) for k in whole)


# ------------------------------------------------------------- rejections


@pytest.mark.parametrize(("flags", "message"), [
    (["--twenty_questions_train_answerer"], "--twenty_questions_train_answerer trains a model"),
    (["--twenty_questions_answerer", "model"], "needs --twenty_questions_answerer_path"),
    (["--twenty_questions_answerer_path", "x"], "read with --twenty_questions_answerer model"),
    (["--twenty_questions_answerer", "model", "--twenty_questions_answerer_path",
      "/nonexistent/answerer"], "no such file or directory"),
])
def test_answerer_options_are_refused_before_training(tmp_path: Path, capsys, flags,
                                                      message) -> None:
    rc = main(["train", "--task", "twenty_questions", *EPISODE_FLAGS, *flags,
               "--num_steps", "1", "--device", "cpu", "--no_progress",
               "--runs_dir", str(tmp_path / "runs")])
    assert rc == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_model_answerer_paths_that_hold_no_answerer_are_refused(warm: Path,
                                                                tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert "not an rlscope run directory" in model_task(tmp_path / "empty").validate()[0]
    # the questioner's warm start: another task, whose prompts the answerer never saw
    assert "trained on task 'twenty_questions'" in model_task(warm / "q").validate()[0]
    # weights that do not fit the recorded model (a vocabulary or size mismatch)
    payload = torch.load(warm / "a" / "sft.pt", weights_only=True)
    payload["model"]["d_model"] = 32
    (tmp_path / "bad").mkdir()
    torch.save(payload, tmp_path / "bad" / "sft.pt")
    assert "do not fit the answerer's byte vocabulary" in \
        model_task(tmp_path / "bad").validate()[0]
    problems = model_task(warm / "a", twenty_questions_answerer_lr=0.0,
                          twenty_questions_answerer_samples=1).validate()
    assert any("answerer_lr must be > 0" in p for p in problems)
    assert any("answerer_samples must be >= 2" in p for p in problems)
    task = make_task("twenty_questions", TaskConfig(**{**QUESTIONER.__dict__, "env_processes": 1,
                                                       "env": EnvConfig(
        twenty_questions_answerer="model",
        twenty_questions_answerer_path=str(warm / "a"))}))  # type: ignore[arg-type]
    assert any("set --env_processes 0" in p for p in task.validate())
    assert model_task(warm / "a").validate() == []


# ------------------------------------------------------------- accuracy after SFT (slow)

SFT_STEPS = 1200
"""Answerer SFT steps of the slow test (the recipe's: docs/recipes.md)."""
MIN_ACCURACY = 0.7
"""Agreement with the oracle over the whole table (5,047 items) the slow test asks for: 0.782
measured (seed 0, this CPU; docs/recipes.md)."""
MIN_CLASS_ACCURACY = 0.65
"""...and on each answer (measured: yes 0.953, no 0.765, I can't answer that 0.812), so that
answering ``no`` to everything (0.871 overall, 0 on ``yes``) fails."""


@pytest.mark.slow
def test_an_answerer_warm_started_on_the_table_agrees_with_the_oracle(tmp_path: Path) -> None:
    sft(SftConfig(task=TASK_NAME, task_options=TaskConfig(eval_batches=1, eval_batch_size=64),
                  num_steps=SFT_STEPS, eval_every=0, batch_size=64, lr=3e-3, seed=0,
                  model=ModelConfig(embed_init="balanced"), runs_dir=str(tmp_path), name="a",
                  device="cpu", threads=1, progress=False))
    answerer = load_answerer(str(tmp_path / "a"))
    oracle = OracleAnswerer(load_table())
    items = make_task(TASK_NAME, TaskConfig()).items  # type: ignore[attr-defined]
    right = {"yes\n": [0, 0], "no\n": [0, 0], "I can't answer that\n": [0, 0]}
    for i in range(0, len(items), 512):
        chunk = items[i:i + 512]
        answers = answerer.answer_many([s for s, _ in chunk],
                                       [encode(q + "\n") for _, q in chunk])
        for (s, q), a in zip(chunk, answers, strict=True):
            truth = oracle.answer_text(s, q)
            right[truth][0] += bytes(a) == truth.encode()
            right[truth][1] += 1
    per_class = {k: r / n for k, (r, n) in right.items()}
    assert sum(r for r, _ in right.values()) / len(items) >= MIN_ACCURACY, per_class
    assert min(per_class.values()) >= MIN_CLASS_ACCURACY, per_class
