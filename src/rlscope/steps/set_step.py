"""The ``set`` step: vector policy optimisation on ``vector_pareto`` (COMPANIONS.md §2, VPO).

Per step, G = B/K groups. Each group draws a prompt p uniformly (with replacement), K sets of
M candidates from the `SetPolicy` (temperature 1), the reward vector r_m = R(p, a_m) of every
candidate, and N_w preference weights w_j ~ Dirichlet(1, 1) **shared by the K sets of the
group** (common random weights: the K sets are compared on the same preferences). The method's
set score S (`SET_SCORES`):

- ``vpo_grpo``: S = (1/N_w) Σ_j max_m w_jᵀ r_m (needs M > 1);
- ``scalar_grpo``: S = w*ᵀ r_1 (needs M = 1);
- ``multi_rlvr``: S = max_m w*ᵀ r_m (needs M > 1);

then A = the group z-score of S over the K sets (`rlscope.methods.advantages.group_zscore`, 0
when the group's std ≤ 1e-8), broadcast to the M candidates of the set, and per candidate the
`ppo_clip` loss −min(ρA, clip(ρ, 1 ± 0.2)A), ρ = exp(ℓ − ℓ_μ), averaged over the B·M
candidates. ``inner_epochs`` full-batch passes, Adam, grad clip. No KL, no entropy term, no
group selection.

Evaluation (before the update, from a generator of its own, so it never draws from the
training stream): per prompt, 12 sets at temperature 1, their candidates listed set by set
form a pool; `rlscope.tasks.vector_pareto.pool_metrics` gives the mean gold score, best@1,
best@3, best@9 and the in-set diversity, averaged over ``--eval_batches`` pools; plus the
mean slot entropy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from rlscope.batch import SetBatch
from rlscope.config import OptimConfig, RunConfig, TrainConfig
from rlscope.methods import canonical_method_name
from rlscope.methods.advantages import AdvantageInputs, group_zscore
from rlscope.methods.configs import AdvantageConfig, ObjectiveConfig
from rlscope.methods.objectives import ppo_clip
from rlscope.methods.spec import MethodSpec
from rlscope.methods.terms import PolicyTerms
from rlscope.policy.set_policy import SetPolicy, sample_sets, slot_entropy
from rlscope.steps.base import StepKind
from rlscope.tasks.vector_pareto import (
    EVAL_SETS,
    NUM_ACTIONS,
    NUM_OBJECTIVES,
    candidate_rewards,
    gold_weights,
    num_prompts_of,
    pool_metrics,
    reward_table,
)

TASK = "vector_pareto"
DEFAULT_GROUP_SIZE = 8
EVAL_SEED_OFFSET = 7_000_003
"""The evaluation generator's seed is seed·`EVAL_SEED_OFFSET` + step + 1 (never the training
stream's)."""
MIXED_STD = 1e-6
"""A group is mixed when its set scores' population std exceeds this (``group/mixed_rate``)."""

SetScore = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""(rewards_BMO, weights_BNO, gold_O) → the set score S_B."""


def gold_set_reward(rewards_BMO: torch.Tensor, gold_O: torch.Tensor) -> torch.Tensor:
    """``[B]`` max_m w*ᵀ r_m (``vpo/gold_set_reward``, logged for every preset)."""
    return (rewards_BMO * gold_O).sum(-1).max(-1).values


def vpo_set_score(rewards_BMO: torch.Tensor, weights_BNO: torch.Tensor, gold_O: torch.Tensor
                  ) -> torch.Tensor:
    """S = (1/N_w) Σ_j max_m w_jᵀ r_m: the set's best candidate under each sampled preference,
    averaged over the preferences."""
    utility_BNM = torch.einsum("bno,bmo->bnm", weights_BNO, rewards_BMO)
    return utility_BNM.max(-1).values.mean(-1)


def scalar_set_score(rewards_BMO: torch.Tensor, weights_BNO: torch.Tensor,
                     gold_O: torch.Tensor) -> torch.Tensor:
    """S = w*ᵀ r_1: the gold scalarisation of the set's first (only) candidate."""
    return (rewards_BMO[:, 0] * gold_O).sum(-1)


def multi_rlvr_set_score(rewards_BMO: torch.Tensor, weights_BNO: torch.Tensor,
                         gold_O: torch.Tensor) -> torch.Tensor:
    """S = max_m w*ᵀ r_m: the set's best candidate under the gold scalarisation."""
    return gold_set_reward(rewards_BMO, gold_O)


SET_SCORES: dict[str, SetScore] = {
    "vpo_grpo": vpo_set_score, "scalar_grpo": scalar_set_score,
    "multi_rlvr": multi_rlvr_set_score}
"""Preset → its set score."""
ONE_CANDIDATE = frozenset({"scalar_grpo"})
"""The presets that score exactly one candidate per set (the others need M > 1)."""


def set_advantages(scores_B: torch.Tensor, group_size: int, cfg: AdvantageConfig
                   ) -> torch.Tensor:
    """``[B]`` group z-score of the set scores over the K sets of each group (0 where the
    group's std ≤ 1e-8)."""
    mask_B1 = torch.ones_like(scores_B)[:, None]
    return group_zscore(AdvantageInputs(rewards_B=scores_B, mask_BT=mask_B1,
                                        group_size=group_size), cfg)[:, 0]


def set_loss(policy: SetPolicy, batch: SetBatch, adv_B: torch.Tensor, cfg: ObjectiveConfig
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The mean over the B·M candidates of `ppo_clip`'s −min(ρA, clip(ρ, 1 ± ε)A), A the set's
    advantage broadcast to its candidates; also ``ratio_BM`` and the clip flags."""
    logp_BMA = policy.log_probs(batch.prompt_ids_B)
    logp_BM = logp_BMA.gather(-1, batch.actions_BM[..., None])[..., 0]
    adv_BM = adv_B[:, None].expand_as(logp_BM)
    terms = PolicyTerms(logp_BT=logp_BM, logp_old_BT=batch.logp_old_BM, weight_BT=adv_BM,
                        mask_BT=torch.ones_like(logp_BM))
    loss_BM, stats = ppo_clip(terms, cfg)
    stats["ratio"] = (logp_BM - batch.logp_old_BM).detach().exp()
    return loss_BM.mean(), stats


def dirichlet_ones(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Dirichlet(1, ..., 1) draws over the last dimension: independent Exp(1) variables
    normalised to sum 1 (uniform on the simplex)."""
    e = torch.empty(shape).exponential_(1.0, generator=generator)
    return e / e.sum(-1, keepdim=True)


def step_metrics(batch: SetBatch, scores_B: torch.Tensor, adv_B: torch.Tensor,
                 group_size: int, gold_O: torch.Tensor, stats: dict[str, torch.Tensor],
                 loss: torch.Tensor) -> dict[str, float]:
    """The step's metrics (COMPANIONS.md §2, "Metrics"): the set scores, the advantages of
    the B·M candidates, the last pass's ratios and clip fractions, the mixed-group rate."""
    adv_BM = adv_B[:, None].expand_as(batch.actions_BM).float()
    std_G = scores_B.view(-1, group_size).std(-1, unbiased=False)
    ratio = stats["ratio"]
    out = {
        "reward/mean": scores_B.mean(),
        "vpo/gold_set_reward": gold_set_reward(batch.rewards_BMO, gold_O).mean(),
        "adv/mean": adv_BM.mean(), "adv/abs_mean": adv_BM.abs().mean(),
        "adv/std": adv_BM.std(unbiased=False), "adv/min": adv_BM.min(),
        "adv/max": adv_BM.max(), "adv/frac_zero": (adv_BM.abs() < 1e-8).float().mean(),
        "adv/group_std_mean": std_G.mean(),
        "policy/ratio_mean": ratio.mean(), "policy/ratio_min": ratio.min(),
        "policy/ratio_max": ratio.max(),
        **{f"policy/{k}": v.mean() for k, v in stats.items() if k.startswith("clipfrac")},
        "group/mixed_rate": (std_G > MIXED_STD).float().mean(),
        "loss/policy": loss, "loss/total": loss}
    return {k: float(v.detach()) for k, v in out.items()}


class SetStep:
    """A run of a ``set``-step preset on ``vector_pareto`` (module docstring)."""

    def __init__(self, cfg: TrainConfig, spec: MethodSpec, device: torch.device) -> None:
        t, r = cfg.task_options, cfg.run
        self.method = canonical_method_name(cfg.method)
        self.score = SET_SCORES[self.method]
        self.spec = spec
        self.num_prompts = num_prompts_of(t.num_prompts)
        self.num_candidates = t.num_candidates
        self.num_weights = t.num_weight_samples
        self.hidden = t.set_hidden
        self.group_size = r.group_size or DEFAULT_GROUP_SIZE
        self.num_groups = r.batch_size // self.group_size
        self.inner_epochs = r.inner_epochs
        self.eval_batches = t.eval_batches
        self.seed = r.seed
        self.grad_clip = cfg.optim.grad_clip
        self.device = device
        self.table_PAO = reward_table(self.num_prompts).to(device)
        self.gold_O = gold_weights(device)
        self.policy = SetPolicy(self.num_prompts, self.num_candidates, NUM_ACTIONS,
                                self.hidden).to(device)
        o = cfg.optim
        optim_cls = torch.optim.AdamW if o.weight_decay > 0 else torch.optim.Adam
        self.optimizer = optim_cls(self.policy.parameters(), lr=o.lr,
                                   betas=(o.adam_beta1, o.adam_beta2),
                                   weight_decay=o.weight_decay)
        self.generator = torch.Generator().manual_seed(r.seed)

    def collect(self) -> SetBatch:
        """G groups of K sets from the current policy (training stream)."""
        G, K = self.num_groups, self.group_size
        prompts_G = torch.randint(0, self.num_prompts, (G,), generator=self.generator)
        prompt_ids_B = prompts_G.repeat_interleave(K).to(self.device)
        with torch.no_grad():
            logp_BMA = self.policy.log_probs(prompt_ids_B)
        actions_BM, logp_old_BM = sample_sets(logp_BMA, self.generator)
        weights_GNO = dirichlet_ones((G, self.num_weights, NUM_OBJECTIVES), self.generator)
        return SetBatch(
            prompt_ids_B=prompt_ids_B, actions_BM=actions_BM, logp_old_BM=logp_old_BM,
            rewards_BMO=candidate_rewards(self.table_PAO, prompt_ids_B, actions_BM),
            weights_GNO=weights_GNO.to(self.device),
            group_ids_B=torch.arange(G, device=self.device).repeat_interleave(K))

    def train_step(self, step: int) -> dict[str, float]:
        batch = self.collect()
        scores_B = self.score(batch.rewards_BMO, batch.weights_BNO, self.gold_O)
        adv_B = set_advantages(scores_B, self.group_size, self.spec.advantage)
        for _ in range(self.inner_epochs):
            loss, stats = set_loss(self.policy, batch, adv_B, self.spec.objective)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if self.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.grad_clip)
            self.optimizer.step()
        return step_metrics(batch, scores_B, adv_B, self.group_size, self.gold_O, stats, loss)

    @torch.no_grad()
    def evaluate(self, step: int) -> dict[str, float]:
        generator = torch.Generator().manual_seed(self.seed * EVAL_SEED_OFFSET + step + 1)
        P, S, M = self.num_prompts, EVAL_SETS, self.num_candidates
        prompts_P = torch.arange(P, device=self.device)
        logp_PMA = self.policy.log_probs(prompts_P)
        logp_NMA = logp_PMA.repeat_interleave(S, dim=0)  # N = P·S sets, prompt-major
        totals: dict[str, float] = {}
        for _ in range(self.eval_batches):
            actions_NM, _ = sample_sets(logp_NMA, generator)
            rewards_NMO = candidate_rewards(self.table_PAO, prompts_P.repeat_interleave(S),
                                            actions_NM)
            for k, v in pool_metrics(rewards_NMO.view(P, S, M, NUM_OBJECTIVES),
                                     self.gold_O).items():
                totals[k] = totals.get(k, 0.0) + float(v) / self.eval_batches
        return {**{f"eval/{k}": v for k, v in totals.items()},
                "eval/entropy": float(slot_entropy(logp_PMA).mean())}

    def state_dict(self) -> dict[str, Any]:
        return {"policy": self.policy.state_dict(), "optimizer": self.optimizer.state_dict(),
                "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"].cpu())

    def describe(self) -> str:
        return (f"{TASK}: {self.num_prompts} prompts, {NUM_ACTIONS} actions, "
                f"{NUM_OBJECTIVES} objectives; SetPolicy h={self.hidden}, "
                f"M={self.num_candidates} candidates per set; {self.method} set score, "
                f"K={self.group_size} sets per group, N_w={self.num_weights} weights per group")


def set_errors(cfg: TrainConfig, spec: MethodSpec) -> list[str]:
    """The ``set`` step's and its presets' rejections (COMPANIONS.md §2, "Rejections")."""
    t, r = cfg.task_options, cfg.run
    method = canonical_method_name(cfg.method)
    errors = []
    K = r.group_size or DEFAULT_GROUP_SIZE
    if K <= 1:
        errors.append(f"run.group_size={r.group_size}: the set step compares the K sets of a "
                      f"group; set --group_size 2 or more (0 = {DEFAULT_GROUP_SIZE})")
    elif r.batch_size % K:
        errors.append(f"run.batch_size={r.batch_size} is not divisible by the group size {K}: "
                      f"set --batch_size to a multiple of {K}")
    M = t.num_candidates
    if method in ONE_CANDIDATE and M != 1:
        errors.append(f"{method} scores one answer per set (w*ᵀ r_1), but "
                      f"task.num_candidates={M}: set --num_candidates 1")
    elif method not in ONE_CANDIDATE and M <= 1:
        errors.append(f"{method} scores a set of several candidates, but "
                      f"task.num_candidates={M}: set --num_candidates 2 or more (default 3)")
    for name, value in (("num_weight_samples", t.num_weight_samples),
                        ("set_hidden", t.set_hidden), ("eval_batches", t.eval_batches)):
        if value < 1:
            errors.append(f"task.{name}={value} must be >= 1: set --{name} 1 or more")
    if r.num_minibatches != 1:
        errors.append(f"run.num_minibatches={r.num_minibatches}: the set step makes "
                      "--inner_epochs full-batch passes; drop --num_minibatches")
    fixed = [f.name for f in dataclasses.fields(cfg.components)
             if getattr(cfg.components, f.name) is not None
             and f.name not in ("clip_low", "clip_high")]
    if fixed:
        errors.append(f"--{', --'.join(fixed)}: the set step's update is fixed (group z-score "
                      "of the set score, ppo_clip, no KL, no entropy term, no selection; "
                      "only --clip_low / --clip_high may change): drop them")
    if spec.objective.clip_low <= 0 or spec.objective.clip_high <= 0:
        errors.append(f"clip bounds ({spec.objective.clip_low}, {spec.objective.clip_high}) "
                      "must be > 0: set --clip_low and --clip_high above 0")
    return errors


def set_defaults(cfg: TrainConfig) -> TrainConfig:
    """The VPO defaults (COMPANIONS.md §2): 500 steps, batch 128 = 16 groups of K 8 sets,
    4 inner epochs, Adam lr 3e-3, evaluation every 20 steps."""
    return TrainConfig(
        method=cfg.method, task=cfg.task,
        run=RunConfig(num_steps=500, batch_size=128, group_size=DEFAULT_GROUP_SIZE,
                      inner_epochs=4, eval_every=20),
        optim=OptimConfig(lr=3e-3))


KIND = StepKind(
    tasks={TASK: "Two-objective bandit (7 actions, 8 prompts); a set of M answers per prompt "
                 "from a SetPolicy, scored by sampled or gold preferences (VPO)"},
    validate=set_errors, build=SetStep, defaults=set_defaults)
"""The ``set`` step kind (`rlscope.steps.STEPS`)."""

__all__ = ["KIND", "SET_SCORES", "SetStep", "dirichlet_ones", "gold_set_reward",
           "multi_rlvr_set_score", "scalar_set_score", "set_advantages", "set_defaults",
           "set_errors", "set_loss", "step_metrics", "vpo_set_score"]
