"""The ``two_view`` step kind: Pedagogical RL on ``teacher_student`` (COMPANIONS.md §3).

Two TinyTransformers, copies of **one** random initialisation: a teacher that reads the
teacher view (the pair and its answer) and a student that reads the student view (the pair
only); separate Adam optimisers (``--teacher_lr``, student ``--lr``), gradients clipped to
``--grad_clip``. Sampling is rlscope's sampler at temperature 1. One step is:

1. ``--teacher_steps`` teacher updates (presets with a teacher reward), each on a fresh batch
   of B/K pairs × K teacher rollouts: the frozen current student scores every completion on
   its own view (`rlscope.methods.pedagogy.student_scores`), the preset's teacher reward
   (`TEACHER_REWARDS`) is trained on by GRPO (`grpo_clip_loss`), one optimiser step;
2. ``--student_steps`` student updates, each on a fresh batch: B teacher samples (group 1)
   imitated with the preset's weights (`STUDENT_UPDATES`, `gated_imitation_loss`), or, with no
   teacher (``student_grpo``), GRPO on B/K × K of the student's own rollouts.

Evaluation is exhaustive over the V² pairs, for the student on its view (``eval/``) and the
teacher on its own (``eval/teacher_``): greedy test error (1 − last-token accuracy), the
greedy path's entropy, and the mean reward of one temperature-1 sample per pair, drawn from a
stream keyed by the run seed and the step (never the training stream).

The preset says what to train (`rlscope.methods.pedagogy.TwoViewRule`); this module never
reads the method's name.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import TYPE_CHECKING, Any

import torch

from rlscope.batch import PromptBatch, TwoViewBatch
from rlscope.methods.pedagogy import (
    STUDENT_UPDATES,
    TEACHER_REWARDS,
    gated_imitation_loss,
    grpo_clip_loss,
    spike_B,
    student_scores,
)
from rlscope.methods.spec import MethodSpec
from rlscope.policy import build_policy
from rlscope.policy.base import Policy
from rlscope.sampling import SamplingConfig, generate
from rlscope.steps.base import StepKind
from rlscope.tasks import teacher_student as ts

if TYPE_CHECKING:
    from rlscope.config import TrainConfig

DEFAULT_GROUP_SIZE = 8
"""K when ``--group_size`` is 0 (COMPANIONS.md §3's default)."""
EVAL_STREAM = 1_000_003
"""Evaluation samples of step s draw from seed (run seed + 1)·EVAL_STREAM + s."""


def group_size(cfg: TrainConfig) -> int:
    """K in force: ``--group_size``, or 8 when it is 0."""
    return cfg.run.group_size or DEFAULT_GROUP_SIZE


def completion_logp_BTV(policy: Policy, prompt_BP: torch.Tensor, completion_BT: torch.Tensor
                        ) -> torch.Tensor:
    """``policy``'s log-probs ``[B, T, V]`` (float32 at least) at each completion position,
    teacher-forced on the unpadded ``prompt_BP`` then ``completion_BT``."""
    P, T = prompt_BP.shape[1], completion_BT.shape[1]
    logits_BLV, _ = policy.forward(torch.cat([prompt_BP, completion_BT], dim=1), None)
    return logits_BLV[:, P - 1:P - 1 + T].float().log_softmax(-1)


def sampled_logp_BT(logp_BTV: torch.Tensor, tokens_BT: torch.Tensor) -> torch.Tensor:
    return logp_BTV.gather(-1, tokens_BT[..., None]).squeeze(-1)


def optimizer(policy: Policy, lr: float, cfg: TrainConfig) -> torch.optim.Optimizer:
    """Adam (AdamW under --weight_decay) with the run's betas."""
    o = cfg.optim
    return torch.optim.AdamW(policy.parameters(), lr=lr, weight_decay=o.weight_decay,
                             betas=(o.adam_beta1, o.adam_beta2))


def means(rows: list[dict[str, torch.Tensor]]) -> dict[str, float]:
    """Each metric's mean over repeated updates of one step."""
    return {k: float(torch.stack([r[k].float() for r in rows]).mean()) for k in rows[0]}


class TwoViewStep:
    """One ``two_view`` run (module docstring): a teacher, a student, their optimisers and the
    training stream."""

    def __init__(self, cfg: TrainConfig, spec: MethodSpec, device: torch.device) -> None:
        self.cfg, self.opts, self.rule, self.device = cfg, cfg.pedagogy, spec.two_view, device
        self.vocab, self.T = self.opts.sum_vocab, self.opts.completion_len
        self.K, self.B = group_size(cfg), cfg.run.batch_size
        self.clip = spec.objective.clip_low
        self.student: Policy = build_policy(cfg.model, ts.num_symbols(self.vocab),
                                            ts.max_len(self.T)).to(device)
        self.teacher: Policy = copy.deepcopy(self.student)
        self.student_opt = optimizer(self.student, cfg.optim.lr, cfg)
        self.teacher_opt = optimizer(self.teacher, self.opts.teacher_lr, cfg)
        self.generator = torch.Generator().manual_seed(cfg.run.seed)
        self.sampling = SamplingConfig(temperature=1.0, decode_graphs=cfg.run.cuda_graphs)

    # ------------------------------------------------------------------ sampling

    def sample(self, policy: Policy, teacher_view: bool, num_pairs: int, group: int
               ) -> TwoViewBatch:
        """``num_pairs`` fresh pairs × ``group`` rollouts of ``policy`` on the teacher view or
        the student view, with both views, the sampler's log-probs and the task reward."""
        pairs_B2 = ts.sample_pairs(self.generator, num_pairs, self.vocab)
        pairs_B2 = pairs_B2.repeat_interleave(group, dim=0)
        seeds_B = torch.randint(0, 2**62, (pairs_B2.shape[0],), generator=self.generator)
        student_BP = ts.student_view_BP(pairs_B2, self.vocab).to(self.device)
        teacher_BQ = ts.teacher_view_BQ(pairs_B2, self.vocab).to(self.device)
        policy.eval()
        rollout = generate(policy, PromptBatch(teacher_BQ if teacher_view else student_BP),
                           self.sampling, seeds_B.to(self.device), self.T,
                           group_id_B=torch.arange(num_pairs).repeat_interleave(group)
                           .to(self.device))
        completion_BT = rollout.completion_tokens_BT
        answers = ts.answers_B(pairs_B2, self.vocab).to(self.device)
        return TwoViewBatch(student_prompt_BP=student_BP, teacher_prompt_BQ=teacher_BQ,
                            completion_BT=completion_BT, logp_old_BT=rollout.logp_sampler_BT,
                            rewards_B=ts.last_token_rewards_B(completion_BT, answers))

    def update(self, policy: Policy, opt: torch.optim.Optimizer, loss: torch.Tensor) -> None:
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if self.cfg.optim.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(policy.parameters(), self.cfg.optim.grad_clip)
        opt.step()

    # ------------------------------------------------------------------ updates

    def teacher_update(self) -> dict[str, torch.Tensor]:
        """One GRPO step of the teacher on its preset's reward (`TEACHER_REWARDS`)."""
        batch = self.sample(self.teacher, True, self.B // self.K, self.K)
        with torch.no_grad():
            self.student.eval()
            ell_BT, gap_BT = student_scores(completion_logp_BTV(
                self.student, batch.student_prompt_BP, batch.completion_BT), batch.completion_BT)
        reward_B, learn_B = TEACHER_REWARDS[self.rule.teacher_reward](
            batch.rewards_B, ell_BT, gap_BT, self.opts)
        self.teacher.train()
        logp_BT = sampled_logp_BT(completion_logp_BTV(
            self.teacher, batch.teacher_prompt_BQ, batch.completion_BT), batch.completion_BT)
        loss, stats = grpo_clip_loss(logp_BT, batch.logp_old_BT, reward_B, self.K, self.clip)
        self.update(self.teacher, self.teacher_opt, loss)
        return {"ped/task_reward": batch.rewards_B.mean(),
                "ped/pedagogy_reward": reward_B.mean(),
                "ped/learnability": learn_B.mean(),
                "ped/spike_penalty": spike_B(gap_BT, self.opts.spike_beta).mean(),
                "ped/avg_surprise_gap": gap_BT.mean(),
                "ped/max_surprise_gap": gap_BT.max(-1).values.mean(),
                "ped/avg_student_surprisal": (-ell_BT).mean(),
                **{f"teacher/{k}": v for k, v in stats.items()}}

    def student_imitation(self) -> dict[str, torch.Tensor]:
        """One imitation step of the student on B fresh teacher samples, weighted by the
        preset's `STUDENT_UPDATES` rule under the current student."""
        weights = STUDENT_UPDATES[self.rule.student_update]
        assert weights is not None
        batch = self.sample(self.teacher, True, self.B, 1)
        self.student.train()
        ell_BT = sampled_logp_BT(completion_logp_BTV(
            self.student, batch.student_prompt_BP, batch.completion_BT), batch.completion_BT)
        w_BT = weights(ell_BT, self.opts)
        loss = gated_imitation_loss(ell_BT, w_BT)
        self.update(self.student, self.student_opt, loss)
        return {"assim/loss": loss.detach(), "assim/gate_mean": w_BT.mean(),
                "assim/logp_mean": ell_BT.detach().mean(),
                "assim/teacher_sample_task_reward": batch.rewards_B.mean()}

    def student_grpo(self) -> dict[str, torch.Tensor]:
        """One GRPO step of the student on its own B/K × K rollouts (no teacher)."""
        batch = self.sample(self.student, False, self.B // self.K, self.K)
        self.student.train()
        logp_BT = sampled_logp_BT(completion_logp_BTV(
            self.student, batch.student_prompt_BP, batch.completion_BT), batch.completion_BT)
        loss, stats = grpo_clip_loss(logp_BT, batch.logp_old_BT, batch.rewards_B, self.K,
                                     self.clip)
        self.update(self.student, self.student_opt, loss)
        return {"student/task_reward": batch.rewards_B.mean(),
                **{f"student/{k}": v for k, v in stats.items()}}

    # ------------------------------------------------------------------ KindStep

    def train_step(self, step: int) -> dict[str, float]:
        out: dict[str, float] = {}
        loss = 0.0
        if self.rule.teacher_reward != "none":
            teacher = means([self.teacher_update() for _ in range(self.opts.teacher_steps)])
            out.update(teacher)
            loss += teacher["teacher/loss"]
        own = STUDENT_UPDATES[self.rule.student_update] is None
        student_step = self.student_grpo if own else self.student_imitation
        student = means([student_step() for _ in range(self.opts.student_steps)])
        out.update(student)
        loss += student["student/loss" if own else "assim/loss"]
        return {"loss/total": loss, **out}

    @torch.no_grad()
    def evaluate(self, step: int) -> dict[str, float]:
        pairs_N2 = ts.all_pairs(self.vocab)
        answers = ts.answers_B(pairs_N2, self.vocab).to(self.device)
        stream = torch.Generator().manual_seed((self.cfg.run.seed + 1) * EVAL_STREAM + step)
        seeds_N = torch.randint(0, 2**62, (pairs_N2.shape[0],), generator=stream)
        out: dict[str, float] = {}
        for prefix, policy, view_NP in (
                ("eval/", self.student, ts.student_view_BP(pairs_N2, self.vocab)),
                ("eval/teacher_", self.teacher, ts.teacher_view_BQ(pairs_N2, self.vocab))):
            policy.eval()
            prompts = PromptBatch(view_NP.to(self.device))
            greedy = generate(policy, prompts, dataclasses.replace(self.sampling,
                                                                   temperature=0.0),
                              torch.zeros_like(seeds_N).to(self.device), self.T,
                              with_entropy=True)
            sampled = generate(policy, prompts, self.sampling, seeds_N.to(self.device), self.T)
            assert greedy.entropy_BT is not None
            out[f"{prefix}test_error"] = 1.0 - float(ts.last_token_rewards_B(
                greedy.completion_tokens_BT, answers).mean())
            out[f"{prefix}reward"] = float(ts.last_token_rewards_B(
                sampled.completion_tokens_BT, answers).mean())
            out[f"{prefix}entropy"] = float(greedy.entropy_BT.float().mean())
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"student": self.student.state_dict(), "teacher": self.teacher.state_dict(),
                "student_opt": self.student_opt.state_dict(),
                "teacher_opt": self.teacher_opt.state_dict(),
                "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.student.load_state_dict(state["student"])
        self.teacher.load_state_dict(state["teacher"])
        self.student_opt.load_state_dict(state["student_opt"])
        self.teacher_opt.load_state_dict(state["teacher_opt"])
        self.generator.set_state(state["generator"].cpu())

    def describe(self) -> str:
        m = self.cfg.model
        return (f"{ts.NAME} (V {self.vocab}, T {self.T}): teacher and student TinyTransformers "
                f"(d {m.d_model}, {m.n_heads} heads, {m.n_layers} layers, max length "
                f"{ts.max_len(self.T)}) from one init; teacher reward "
                f"{self.rule.teacher_reward}, student update {self.rule.student_update}")


def two_view_errors(cfg: TrainConfig, spec: MethodSpec) -> list[str]:
    """The rejections of COMPANIONS.md §3, and what the step cannot honour, one line each."""
    p, r, rule, errors = cfg.pedagogy, cfg.run, spec.two_view, list[str]()
    K = group_size(cfg)
    if K <= 1:
        errors.append(f"run.group_size={r.group_size}: the two_view presets compare the "
                      "rollouts of a group; set --group_size >= 2 (0 = 8)")
    elif r.batch_size % K:
        errors.append(f"run.batch_size={r.batch_size} is not divisible by run.group_size={K}: "
                      "set --batch_size to a multiple of the group size")
    if rule.teacher_reward != "none" and p.teacher_steps < 1:
        errors.append(f"pedagogy.teacher_steps={p.teacher_steps}: {cfg.method} trains a "
                      "teacher; set --teacher_steps >= 1")
    if p.student_steps < 1:
        errors.append(f"pedagogy.student_steps={p.student_steps}: set --student_steps >= 1")
    errors += [f"pedagogy.{name}={value} must be > 0" for name, value in (
        ("spike_beta", p.spike_beta), ("gate_kappa", p.gate_kappa),
        ("teacher_lr", p.teacher_lr)) if not value > 0]
    if p.learnability_lambda < 0:
        errors.append(f"pedagogy.learnability_lambda={p.learnability_lambda} must be >= 0")
    if p.sum_vocab < 2:
        errors.append(f"pedagogy.sum_vocab={p.sum_vocab}: teacher_student needs at least two "
                      "content symbols; set --sum_vocab >= 2")
    if p.completion_len < 1:
        errors.append(f"pedagogy.completion_len={p.completion_len}: a completion needs a "
                      "token to score; set --completion_len >= 1")
    if rule.teacher_reward not in (*TEACHER_REWARDS, "none") \
            or rule.student_update not in STUDENT_UPDATES:
        errors.append(f"--method {cfg.method}: unknown two_view rule {rule}")
    overrides = [f"--{f.name}" for f in dataclasses.fields(cfg.components)
                 if getattr(cfg.components, f.name) != f.default]
    if overrides:
        errors.append(f"{', '.join(overrides)}: the two_view presets fix their components "
                      "(group z-score, ppo_clip 0.2, token_mean, no KL); drop the override")
    if r.inner_epochs != 1 or r.num_minibatches != 1:
        errors.append("run.inner_epochs and run.num_minibatches must be 1: the two_view step "
                      "takes one optimiser step per batch")
    s = cfg.sampling
    if s.temperature != 1.0 or s.top_k or s.top_p != 1.0 or s.max_new_tokens \
            or s.stop_token_ids:
        errors.append("the two_view step samples whole completions at temperature 1 (no "
                      "top-k/top-p, no stop tokens); drop the sampling options and set the "
                      "length with --completion_len")
    if cfg.model.arch != "tiny" or cfg.model.lora_rank:
        errors.append(f"model.arch={cfg.model.arch!r}: teacher_student trains two tiny "
                      "transformers; drop --arch (and --lora_rank)")
    if r.init:
        errors.append("--init is not supported by the two_view step (teacher and student "
                      "start from one random initialisation): drop it")
    return errors


def two_view_defaults(cfg: TrainConfig) -> TrainConfig:
    """The pedagogy defaults (COMPANIONS.md §3): 300 steps, batch 96 in groups of 8, evaluation
    every 20 steps; flags given on the command line or in a manifest override them
    (`rlscope.steps.with_kind_defaults`)."""
    from rlscope.config import RunConfig, TrainConfig

    return TrainConfig(method=cfg.method, task=cfg.task, run=RunConfig(
        num_steps=300, batch_size=96, group_size=8, eval_every=20))


KIND = StepKind(tasks={ts.NAME: ts.SUMMARY}, validate=two_view_errors, build=TwoViewStep,
                defaults=two_view_defaults)
"""The ``two_view`` step kind (`rlscope.steps.STEPS`)."""

__all__ = ["KIND", "TwoViewStep", "completion_logp_BTV", "two_view_defaults", "two_view_errors"]
