"""The ``twenty_questions`` task: `EpisodeTask` over the environment, plus its model answerer.

With ``--twenty_questions_answerer model`` the task loads the answerer
(`rlscope.tasks.answerer.load_answerer`, from ``--twenty_questions_answerer_path``) when it is
built and hands it to the environment factory; a path that cannot be loaded is a validation
problem naming it. As `TrainsCompanion` the task then owns that second model: the loop moves it
to the run's device, and after each policy update the task logs ``answerer/questions`` and
``answerer/accuracy`` (the answers given in the batch's episodes against the oracle's) and,
with ``--twenty_questions_train_answerer``, trains it (`rlscope.tasks.answerer.answerer_update`,
its own Adam at ``--twenty_questions_answerer_lr``: ``answerer/loss``,
``answerer/reward_mean``), its weights, optimizer and sampling stream checkpointed with the run.
The model answerer steps in the trainer's process (``--env_processes 0``).
"""

from __future__ import annotations

from typing import Any

import torch

from rlscope.batch import RolloutBatch
from rlscope.envs.twenty_questions import OracleAnswerer, TwentyQuestions
from rlscope.tasks.answerer import (
    TRAIN_SEED_OFFSET,
    AnswererTraining,
    ModelAnswerer,
    answerer_accuracy,
    answerer_update,
    asked_questions,
    load_answerer,
)
from rlscope.tasks.base import TaskConfig
from rlscope.tasks.episodes import EpisodeTask

SUMMARY = ("Multi-turn: find a hidden object by yes/no questions to an answerer (rule-based "
           "oracle over a shipped table, or a model answerer, trainable).")


class TwentyQuestionsTask(EpisodeTask):
    """twenty_questions episodes, with the model answerer when asked (module docstring)."""

    def __init__(self, cfg: TaskConfig) -> None:
        env = cfg.env
        self.model: ModelAnswerer | None = None
        self.training: AnswererTraining | None = None
        self.load_error = ""
        if env.twenty_questions_answerer == "model" and env.twenty_questions_answerer_path:
            try:
                self.model = load_answerer(env.twenty_questions_answerer_path)
            except (ValueError, OSError) as error:
                self.load_error = str(error)
        self.twenty = TwentyQuestions(env, answerer=self.model)
        super().__init__("twenty_questions", self.twenty, cfg, "twenty_questions_", SUMMARY)
        self.oracle = OracleAnswerer(self.twenty.table)

    def validate(self) -> list[str]:
        """The episode task's checks and the answerer options' (each saying what to change)."""
        env, errors = self.cfg.env, []
        model = env.twenty_questions_answerer == "model"
        if self.load_error:
            errors.append(self.load_error)
        if env.twenty_questions_answerer_path and not model:
            errors.append("--twenty_questions_answerer_path is read with "
                          "--twenty_questions_answerer model only: add it or drop the path")
        if env.twenty_questions_train_answerer and not model:
            errors.append("--twenty_questions_train_answerer trains a model answerer: add "
                          "--twenty_questions_answerer model --twenty_questions_answerer_path "
                          "DIR (the oracle cannot be trained)")
        if env.twenty_questions_answerer_lr <= 0:
            errors.append(f"--twenty_questions_answerer_lr must be > 0 "
                          f"(got {env.twenty_questions_answerer_lr})")
        if env.twenty_questions_answerer_samples < 2:
            errors.append(f"--twenty_questions_answerer_samples must be >= 2 (the baseline is "
                          f"their mean; got {env.twenty_questions_answerer_samples})")
        if model and self.cfg.env_processes > 0:
            errors.append("--twenty_questions_answerer model answers in the trainer's process "
                          "(its answerer is a model): set --env_processes 0")
        return errors + super().validate()

    def start_companion(self, device: torch.device, seed: int) -> None:
        """The model answerer onto ``device``; with --twenty_questions_train_answerer its
        optimizer and sampling stream (seeded from ``seed``)."""
        if self.model is None:
            return
        policy = self.model.policy
        if isinstance(policy, torch.nn.Module):
            policy.to(device)
        if self.cfg.env.twenty_questions_train_answerer:
            self.training = AnswererTraining(
                optimizer=torch.optim.Adam(policy.parameters(),
                                           lr=self.cfg.env.twenty_questions_answerer_lr),
                generator=torch.Generator().manual_seed(seed + TRAIN_SEED_OFFSET),
                samples=self.cfg.env.twenty_questions_answerer_samples)

    def companion_step(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        """``answerer/questions`` and ``answerer/accuracy`` of the batch's answers; when the
        answerer trains, one update on the batch's questions (``answerer/loss``,
        ``answerer/reward_mean``). Nothing with the oracle."""
        if self.model is None:
            return {}
        device = batch.completion_tokens_BT.device
        asked = asked_questions(batch, self.twenty.table)
        m = {"answerer/questions": torch.tensor(float(len(asked)), device=device)}
        if not asked:
            return m
        m["answerer/accuracy"] = torch.tensor(answerer_accuracy(asked, self.oracle),
                                              device=device)
        if self.training is not None:
            m |= {k: v.to(device) for k, v in
                  answerer_update(self.model, self.training, asked, self.oracle).items()}
        return m

    def companion_state(self) -> dict[str, Any]:
        """The trained answerer's weights, optimizer and stream (``{}`` when it is frozen or
        the oracle)."""
        if self.model is None or self.training is None:
            return {}
        return {"answerer": self.model.policy.state_dict(),  # type: ignore[attr-defined]
                **self.training.state_dict()}

    def load_companion_state(self, state: dict[str, Any]) -> None:
        """Restore the trained answerer (a checkpoint without it: ValueError)."""
        if self.model is None or self.training is None:
            return
        if "answerer" not in state:
            raise ValueError("the checkpoint holds no trained answerer (was the run started "
                             "without --twenty_questions_train_answerer?)")
        self.model.policy.load_state_dict(state["answerer"])  # type: ignore[attr-defined]
        self.training.load_state_dict(state)
