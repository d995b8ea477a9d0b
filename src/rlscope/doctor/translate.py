"""Name translators: verl, TRL, tinker-cookbook and OpenRLHF metric names onto rlscope's schema
and back.

A foreign name is mapped only where it is the same quantity as one of ours: the same per-token or
per-sequence statistic in the same units. Each `Translation` records the foreign metric's
population, reduction, sign and timing where they differ from ours (a mean over every
micro-batch of the update instead of the last pass, a mean of per-sequence means instead of a
token mean, a width instead of a finish reason), and its note says how. A quantity of ours
logged with the opposite sign is translated with ``sign=-1`` and negated by the importer
(verl's ``actor/ppo_kl`` and tinker-cookbook's ``optim/kl_sample_train_v1`` are
mean(ℓ_behaviour − ℓ_learner), ours mean(ℓ_learner − ℓ_behaviour)). Names without a true
equivalent (other units such as verl's ``perf/max_memory_allocated_gb``, other populations) are
left out and the importer keeps them under their own names (METRICS.md, "The doctor").

What each framework logs is data: ``names/<framework>.toml`` lists every documented name per
source file at a recorded commit, with a reason for each name left untranslated
(`name_list`); tests/test_doctor_translate.py fails on a documented name that is neither.

Sources read, per framework (files in the public repositories; the name lists give the commits):

- verl (volcengine/verl): ``verl/trainer/ppo/ray_trainer.py`` (fit loop, timers, validation
  keys), ``verl/trainer/ppo/metric_utils.py`` (data, timing, throughput and validation
  metrics), ``verl/workers/actor/dp_actor.py`` (update_policy accumulation),
  ``verl/trainer/ppo/core_algos.py`` (policy loss and KL penalties),
  ``verl/trainer/ppo/rollout_corr_helper.py`` (rollout_corr/*), ``verl/workers/fsdp_workers.py``
  (lr, memory), ``verl/utils/debug/metrics.py`` (rollout_probs_diff), and
  ``verl/trainer/config/_generated_ppo_trainer.yaml`` (defaults).
- TRL (huggingface/trl): ``trl/trainer/grpo_trainer.py`` and ``rloo_trainer.py``, the "Logged
  metrics" section of ``docs/source/grpo_trainer.md``, ``trl/experimental/ppo/ppo_trainer.py``
  and ``docs/source/ppo_trainer.md`` (PPO v2), ``trl/trainer/ppo_trainer.py`` at v0.11.4
  (classic PPOTrainer: ``record_step_stats``, ``loss``); ``loss``, ``grad_norm`` and
  ``learning_rate`` come from transformers' ``Trainer``.
- tinker-cookbook (thinking-machines-lab/tinker-cookbook): ``tinker_cookbook/rl/train.py``,
  ``tinker_cookbook/rl/metrics.py``, ``tinker_cookbook/rl/metric_util.py``,
  ``tinker_cookbook/utils/trace.py`` and ``tinker_cookbook/utils/misc_utils.py`` (``time/<name>``).
- OpenRLHF (OpenRLHF/OpenRLHF): ``openrlhf/trainer/ray/ppo_actor.py``, ``ppo_critic.py``,
  ``openrlhf/trainer/ppo_trainer.py``, ``openrlhf/trainer/ppo_utils/*.py``,
  ``openrlhf/models/loss.py`` and ``openrlhf/utils/logging_utils.py`` (the ``train/`` prefix).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

from rlscope.metrics.schema import metric_def

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


@dataclass(frozen=True)
class Translation:
    """One foreign metric name's equivalent in our schema.

    ``population``, ``reduction`` and ``timing`` use the schema's vocabulary
    (`rlscope.metrics.schema.MetricDef`); an empty field means "as our metric" and is resolved
    by `Translation.population_of` etc. They are set where the foreign metric differs.
    """

    canonical: str
    """Our schema name (must exist in rlscope.metrics.schema: metric_def(canonical) works)."""
    note: str = ""
    """Where the foreign metric's population, reduction or timing differs from ours."""
    sign: float = 1.0
    """Ours = sign × theirs: -1 where the framework logs the same estimate with the opposite
    sign (mean(ℓ_behaviour − ℓ_learner) where ours is mean(ℓ_learner − ℓ_behaviour))."""
    population: str = ""
    """What the foreign metric is computed over (tokens | sequences | groups | steps), when it
    differs from ours."""
    reduction: str = ""
    """How it is reduced (token_mean | seq_mean | max | min | std | sum | value | frac), when
    it differs from ours."""
    timing: str = ""
    """When it is measured (rollout = on the batch before any update | first_pass | last_pass
    | update = averaged over every pass of the update | step | eval), when it differs."""

    def resolved(self) -> dict[str, str | float]:
        """Population, reduction, timing and sign with "as ours" filled in from the schema."""
        ours = metric_def(self.canonical)
        return {"canonical": self.canonical, "sign": self.sign,
                "population": self.population or ours.population,
                "reduction": self.reduction or ours.reduction,
                "timing": self.timing or ours.timing}


_T = Translation

_VERL_UPDATE_MEAN = ("averaged over every micro-batch of every mini-batch and PPO epoch of the "
                     "update, so a mix of first and later passes rather than the last pass")

# verl: keys from ray_trainer.py / metric_utils.py / dp_actor.py / core_algos.py (see module
# docstring). Defaults from _generated_ppo_trainer.yaml: loss_agg_mode token-mean,
# entropy_coeff 0, kl_loss_type low_var_kl, algorithm.kl_penalty kl, clip_ratio_c 3.
VERL: dict[str, Translation] = {
    "actor/entropy": _T(
        "policy/entropy",
        "Computed in the old-log-prob recompute before the update (ray_trainer.py) and reduced "
        "with actor.loss_agg_mode, a token mean only under the default 'token-mean'. With "
        "actor.entropy_coeff != 0 or actor.calculate_entropy, the update's own value (" +
        _VERL_UPDATE_MEAN + ") overwrites it."),
    "actor/pg_loss": _T(
        "loss/policy",
        "Accumulated, not averaged (dp_actor.update_policy): each micro-batch adds "
        "pg_loss / grad_accum, so a mini-batch contributes its micro-batch mean and the "
        "mini-batches of all PPO epochs are summed; divide by ppo_epochs × mini-batches for a "
        "per-update mean. Older releases logged the mean over micro-batches. Aggregated by "
        "loss_agg_mode; excludes the entropy and KL terms.", reduction="sum", timing="update"),
    "actor/kl_loss": _T(
        "loss/kl",
        "Summed over mini-batches and epochs like actor/pg_loss. KL to the reference on the "
        "current policy during the update, estimator actor.kl_loss_type (default low_var_kl: "
        "k3 clamped to [-10, 10]), before the actor.kl_loss_coef factor.", reduction="sum",
        timing="update"),
    "actor/loss": _T(
        "loss/total",
        "Newer verl only; the actor's objective (pg_loss − entropy_coeff·entropy + "
        "kl_loss_coef·kl_loss), critic loss excluded (critic/vf_loss)."),
    "actor/kl_coef": _T(
        "kl_ctrl/beta",
        "The fixed actor.kl_loss_coef of the KL loss, logged only with use_kl_loss."),
    "actor/reward_kl_penalty_coeff": _T(
        "kl_ctrl/beta",
        "β of the KL-in-reward penalty (algorithm.use_kl_in_reward), fixed or adaptive per "
        "algorithm.kl_ctrl; a run with both use_kl_loss and use_kl_in_reward logs two β."),
    "actor/reward_kl_penalty": _T(
        "policy/kl_ref_k1",
        "Mean over sequences of each sequence's token mean (not a token mean over the batch) of "
        "kl_penalty(old_log_probs, ref_log_prob); k1 only with the default algorithm.kl_penalty "
        "'kl'. Uses the learner's recomputed log-probs, not the sampler's.",
        population="sequences", reduction="seq_mean"),
    "actor/pg_clipfrac": _T(
        "policy/clipfrac_region",
        "Tokens where PPO's clipped branch is taken on either side, token mean per micro-batch, "
        + _VERL_UPDATE_MEAN + ".", timing="update"),
    "actor/pg_clipfrac_lower": _T(
        "policy/clipfrac_dual",
        "Despite the name, the dual-clip fraction: tokens with A < 0 where the −A·clip_ratio_c "
        "cap binds (clip_ratio_c = 3 by default); " + _VERL_UPDATE_MEAN + ".", timing="update"),
    "actor/ppo_kl": _T(
        "policy/kl_behaviour_k1",
        "mean(ℓ_old − ℓ_new) over response tokens: our k1 with the sign flipped (the importer "
        "negates it); " + _VERL_UPDATE_MEAN + ", so about 0 on the first pass of an "
        "on-policy step.", sign=-1.0, timing="update"),
    "actor/entropy_loss": _T(
        "loss/entropy",
        "Entropy aggregated by loss_agg_mode before entropy_coeff; " + _VERL_UPDATE_MEAN + ".",
        timing="update"),
    "rollout_corr/kl": _T(
        "policy/kl_behaviour_k1_first",
        "mean(ℓ_rollout − ℓ_old) over response tokens, ℓ_old from the learner's recompute before "
        "the update: our first-pass k1 with the sign flipped (the importer negates it). Logged "
        "when the rollout engine returns log-probs (algorithm.rollout_correction).", sign=-1.0),
    "rollout_corr/rollout_is_mean": _T(
        "sampler/correction_weight_mean",
        "Token mean of the rollout importance weights π_old/π_rollout after the configured "
        "truncation or masking (rollout_is_threshold); a sequence-level weight under "
        "rollout_is='sequence'."),
    "rollout_corr/rollout_is_eff_sample_size": _T(
        "sampler/is_ess",
        "Normalised effective sample size of the weights clamped to [1/threshold, threshold] "
        "(ours uses the unclamped first-pass ratios)."),
    "actor/grad_norm": _T(
        "optim/grad_norm",
        "Pre-clip total norm returned by clip_grad_norm_ (actor.grad_clip = 1.0 by default), one "
        "per mini-batch optimizer step, mean over them; a non-finite norm skips the step but is "
        "still logged."),
    "actor/lr": _T(
        "optim/lr",
        "Read with get_last_lr() before the scheduler steps in most releases: the rate this "
        "update used."),
    "critic/score/mean": _T(
        "reward/mean",
        "Per-sequence sum of the reward function's token-level scores, before any KL-in-reward "
        "penalty (critic/rewards/* include it); zero-length (aborted) responses excluded in "
        "recent verl. Shaping done by the reward manager (e.g. DAPO's overlong penalty) is "
        "included."),
    "critic/score/max": _T("reward/max", "See critic/score/mean."),
    "critic/score/min": _T("reward/min", "See critic/score/mean."),
    "critic/advantages/mean": _T("adv/mean", "Token mean over response_mask, as ours."),
    "critic/advantages/max": _T("adv/max"),
    "critic/advantages/min": _T("adv/min"),
    "critic/values/mean": _T(
        "value/pred_mean", "Critic values on response tokens before the update (PPO with GAE)."),
    "critic/vf_explained_var": _T(
        "value/explained_var",
        "1 − Var(R − V) / (Var(R) + 1e-5) over response tokens, with unbiased variances."),
    "critic/vf_loss": _T(
        "loss/value",
        "Clipped value loss ½·max((V − R)², (V_clip − R)²) aggregated by critic.loss_agg_mode, "
        "per micro-batch (scaled by the accumulation factor in some releases) and averaged over "
        "the critic update; compare trends across verl runs, not levels with ours.",
        timing="update"),
    "critic/vf_clipfrac": _T(
        "value/clipfrac",
        "Tokens where the clipped value term is the larger one, averaged over every micro-batch "
        "of the critic update rather than the last pass.", timing="update"),
    "response_length/mean": _T(
        "length/mean",
        "Response tokens from the attention mask; aborted (zero-length) responses included "
        "(response_length_non_aborted/* excludes them)."),
    "response_length/max": _T("length/max"),
    "response_length/min": _T("length/min"),
    "response_length/clip_ratio": _T(
        "length/clip_ratio",
        "Fraction of responses whose length equals the padded response width "
        "(data.max_response_length), not the finish reason: a response ending with EOS exactly "
        "at the limit counts as clipped."),
    "timing_s/gen": _T(
        "time/sample", "Generation wall time, including the weight sync done inside its timer."),
    "timing_s/reward": _T("time/score"),
    "timing_s/ref": _T("time/ref", "Reference-policy log-probs of the batch."),
    "timing_s/update_actor": _T(
        "time/learn", "Actor update only; PPO with a critic spends timing_s/update_critic too."),
    "timing_s/testing": _T("time/eval", "Present on validation steps only."),
    "timing_s/step": _T("time/step"),
    "perf/time_per_step": _T("time/step", "The same value as timing_s/step."),
}

_TRL_WINDOW = ("TRL averages its own metrics over every entry collected since the previous log "
               "(all micro-batches, processes and steps of the logging window)")

# TRL GRPOTrainer (grpo_trainer.py, docs/source/grpo_trainer.md "Logged metrics") and PPOTrainer
# (ppo_trainer.py, docs/source/logging.md); loss / grad_norm / learning_rate from transformers.
TRL: dict[str, Translation] = {
    "reward": _T(
        "reward/mean",
        "Weighted sum of the reward functions, mean over the generation batch gathered across "
        "processes; " + _TRL_WINDOW + "."),
    "reward_std": _T(
        "adv/group_std_mean",
        "With scale_rewards 'group' (default) or 'none': the mean of per-group reward stds, "
        "Bessel-corrected (÷ (G − 1)), so √(G / (G − 1)) times ours; with scale_rewards "
        "'batch' it is the std over the whole batch instead (compare reward/std)."),
    "kl": _T(
        "policy/kl_ref_k3",
        "k3 of KL(π‖π_ref) on the current policy inside compute_loss, token mean per "
        "micro-batch; during the update, so before it only when num_iterations = 1. Logged "
        "only when beta != 0; " + _TRL_WINDOW + "."),
    "entropy": _T(
        "policy/entropy",
        "Categorical entropy from the learner logits over completion tokens (truncated "
        "completions excluded under mask_truncated_completions), token mean per micro-batch in "
        "the loss pass: before the update only when num_iterations = 1; " + _TRL_WINDOW + ".",
        timing="update"),
    "clip_ratio/low_mean": _T(
        "policy/clipfrac_low",
        "Tokens with ρ < 1 − ε_low and A < 0, token mean per micro-batch, mean over processes, "
        "averaged over all passes rather than the last; 0 on a fully on-policy step (ρ ≡ 1).",
        timing="update"),
    "clip_ratio/high_mean": _T(
        "policy/clipfrac_high",
        "Tokens with ρ > 1 + ε_high and A > 0; reduced like clip_ratio/low_mean.",
        timing="update"),
    "clip_ratio/region_mean": _T(
        "policy/clipfrac_region",
        "Tokens clipped on either side; reduced like clip_ratio/low_mean. Sequences instead of "
        "tokens under importance_sampling_level='sequence'.", timing="update"),
    "clip_ratio": _T(
        "policy/clipfrac_region",
        "Name used by GRPOTrainer releases before the low/high/region split.", timing="update"),
    "completions/mean_length": _T(
        "length/mean", "Completion tokens (tool tokens excluded); " + _TRL_WINDOW + "."),
    "completions/min_length": _T(
        "length/min", "A mean of per-batch minima when the logging window holds several."),
    "completions/max_length": _T(
        "length/max", "A mean of per-batch maxima when the logging window holds several."),
    "completions/clipped_ratio": _T(
        "length/clip_ratio",
        "Completions without an EOS token (cut at max_completion_length): a finish-reason "
        "count, like ours."),
    "completion_length": _T(
        "length/mean", "Name used by early GRPOTrainer releases."),
    "grad_norm": _T(
        "optim/grad_norm",
        "transformers Trainer: pre-clip norm of the last optimizer step before the log, not a "
        "mean over logging_steps."),
    "learning_rate": _T(
        "optim/lr",
        "transformers Trainer reads it after the scheduler stepped: the rate of the next "
        "optimizer step."),
    "loss": _T(
        "loss/total",
        "transformers Trainer: mean loss over the optimizer steps since the previous log, "
        "rounded to 4 decimals; GRPO's includes β·KL."),
    "step_time": _T("time/step", "Average seconds per training step, generation included."),
    "sampling/sampling_logp_difference/mean": _T(
        "sampler/logp_diff_mean",
        "|ℓ_trainer − ℓ_vLLM| token mean before the update, logged only with vLLM and "
        "vllm_importance_sampling_correction; mean of per-process means."),
    "sampling/sampling_logp_difference/max": _T(
        "sampler/logp_diff_max", "Logged only with vLLM importance-sampling correction."),
    "sampling/importance_sampling_ratio/mean": _T(
        "sampler/correction_weight_mean",
        "vLLM importance weight after truncation (TIS) or masking (MIS) at "
        "vllm_importance_sampling_cap, per token or per sequence by "
        "vllm_importance_sampling_mode."),
    # PPOTrainer. Its `val/` prefix is value-function bookkeeping, not validation.
    "objective/kl": _T(
        "policy/kl_ref_seq_k1",
        "Per-sequence sum of ℓ − ℓ_ref (k1 unless PPOConfig.kl_estimator='k3'), mean over "
        "sequences, on the rollout before the update. Classic PPOTrainer (TRL ≤ 0.11) logs the "
        "same quantity under the same name."),
    "objective/scores": _T(
        "reward/mean",
        "Reward-model score after missing_eos_penalty, before the KL penalty "
        "(objective/rlhf_reward includes it)."),
    "policy/approxkl_avg": _T(
        "policy/approx_kl",
        "½·mean (Δℓ)² per micro-batch over all positions, padding counted as zeros (an "
        "unmasked .mean()), averaged over every PPO epoch, mini-batch and micro-batch rather "
        "than the last pass.", timing="update"),
    "policy/clipfrac_avg": _T(
        "policy/clipfrac_region",
        "Masked token mean per micro-batch, averaged over every epoch, mini-batch and "
        "micro-batch of the update.", timing="update"),
    "policy/entropy_avg": _T(
        "policy/entropy",
        "Categorical entropy from the logits, unmasked mean over all response positions "
        "(padding included), averaged over every pass of the update.", timing="update"),
    "val/ratio": _T(
        "policy/ratio_mean",
        "Unmasked mean of ρ per micro-batch (padding contributes ρ = 1), averaged over every "
        "pass of the update.", timing="update"),
    "loss/policy_avg": _T("loss/policy", "Mean over every micro-batch of the update.",
                          timing="update"),
    "loss/value_avg": _T(
        "loss/value",
        "½·masked mean of the larger of the unclipped and clipped squared errors, before "
        "vf_coef; mean over every micro-batch of the update.", timing="update"),
    "val/clipfrac_avg": _T(
        "value/clipfrac", "Mean over every micro-batch of the update rather than the last.",
        timing="update"),
    "lr": _T("optim/lr"),
    "policy_loss": _T(
        "loss/policy",
        "Newer GRPOTrainer: the clipped surrogate alone (no β·KL, no entropy bonus), mean over "
        "processes; " + _TRL_WINDOW + ".", timing="update"),
    "sampling/importance_sampling_ratio/min": _T(
        "policy/ratio_min_first",
        "Smallest vLLM importance weight π_trainer/π_vLLM before the update (after the cap), "
        "logged with vllm_importance_sampling_correction."),
    "sampling/importance_sampling_ratio/max": _T(
        "policy/ratio_max_first",
        "Largest vLLM importance weight before the update (after the cap)."),
    # Classic PPOTrainer (trl/trainer/ppo_trainer.py up to TRL 0.11; record_step_stats and
    # loss). `ppo/*` entries are means over every PPO epoch and mini-batch of the step.
    "ppo/loss/policy": _T("loss/policy", "Mean over every epoch and mini-batch of the step.",
                          timing="update"),
    "ppo/loss/value": _T(
        "loss/value",
        "½·masked mean of max((V − R)², (V_clip − R)²), before vf_coef; mean over every "
        "epoch and mini-batch.", timing="update"),
    "ppo/loss/total": _T("loss/total", "Policy loss + vf_coef × value loss (no KL term: the "
                         "KL penalty is in the reward).", timing="update"),
    "ppo/policy/entropy": _T(
        "policy/entropy",
        "Categorical entropy from the logits, masked token mean per mini-batch, averaged over "
        "every epoch and mini-batch of the update.", timing="update"),
    "ppo/policy/approxkl": _T(
        "policy/approx_kl", "½·masked mean (Δℓ)², averaged over every pass of the update.",
        timing="update"),
    "ppo/policy/policykl": _T(
        "policy/kl_behaviour_k1",
        "masked mean(ℓ_old − ℓ_new): our k1 with the sign flipped (the importer negates it), "
        "averaged over every pass of the update.", sign=-1.0, timing="update"),
    "ppo/policy/clipfrac": _T(
        "policy/clipfrac_region",
        "Masked token mean per mini-batch, averaged over every pass of the update.",
        timing="update"),
    "ppo/policy/advantages_mean": _T(
        "adv/mean",
        "Masked mean of the whitened GAE advantages (about 0 by construction), averaged over "
        "the passes.", timing="update"),
    "ppo/val/mean": _T("value/pred_mean", "Value-head predictions recorded on the rollout."),
    "ppo/val/clipfrac": _T("value/clipfrac", "Averaged over every pass of the update.",
                           timing="update"),
    "ppo/val/error": _T("value/error", "Masked mean (V − R)² during the update.",
                        timing="update"),
    "ppo/val/var_explained": _T(
        "value/explained_var",
        "1 − ppo/val/error / ppo/returns/var, from predictions made during the update.",
        timing="update"),
    "ppo/learning_rate": _T("optim/lr"),
    "ppo/mean_scores": _T("reward/mean", "Mean of the scores passed to step(), before the "
                          "KL penalty."),
    "ppo/std_scores": _T("reward/std", "torch.std: Bessel-corrected (ours is the population "
                         "std)."),
    "env/reward_mean": _T("reward/mean", "The same scores as ppo/mean_scores, logged by "
                          "log_stats."),
    "env/reward_std": _T("reward/std", "Bessel-corrected std of the scores."),
    "objective/kl_coef": _T("kl_ctrl/beta", "Fixed or adaptive (adap_kl_ctrl) KL coefficient."),
    "tokens/responses_len_mean": _T(
        "length/mean", "Response tensor lengths (tokens up to the stop/pad as the user passed "
        "them)."),
    "time/ppo/total": _T(
        "time/learn",
        "Seconds in PPOTrainer.step(): forward passes, rewards, advantages and the optimisation; "
        "generation happens in user code outside step() and is not included."),
}

# tinker-cookbook RL (rl/train.py, rl/metrics.py, rl/metric_util.py, utils/misc_utils.py).
TINKER: dict[str, Translation] = {
    "env/all/reward/total": _T(
        "reward/mean",
        "Mean total reward (per-step rewards plus the group reward) over trajectories, computed "
        "in prepare_minibatch after remove_constant_reward_groups (when on) dropped uniform "
        "groups: the trained batch, not everything sampled."),
    "env/all/by_group/frac_mixed": _T(
        "group/mixed_rate",
        "Groups whose total rewards are not all equal (exact equality); 1 by construction when "
        "remove_constant_reward_groups is on."),
    "env/all/ac_tokens_per_turn": _T(
        "length/mean",
        "Action tokens per turn: the mean completion length only in single-turn environments."),
    "optim/entropy": _T(
        "policy/entropy_sampled",
        "−mean of the sampler's log-probs over the action tokens (mask > 0) of the trained "
        "batch."),
    "optim/kl_sample_train_v1": _T(
        "policy/kl_behaviour_k1_first",
        "mean(ℓ_sampler − ℓ_train) over action tokens: our k1 with the sign flipped (the "
        "importer negates it); ℓ_train from the forward_backward pass, the first pass when "
        "num_substeps = 1.", sign=-1.0),
    "optim/kl_sample_train_v2": _T(
        "policy/kl_behaviour_k2_first",
        "½·mean (ℓ_sampler − ℓ_train)² over action tokens, ℓ_train from the forward_backward "
        "pass: the first pass when num_substeps = 1; later substeps see updated weights."),
    "kl_policy_base": _T(
        "policy/kl_ref_k1",
        "mean(ℓ_sampler − ℓ_base) over action tokens, logged only with kl_penalty_coef > 0."),
    "optim/lr": _T("optim/lr", "The configured learning_rate, logged as is (no schedule)."),
    "time/total": _T("time/step", "The whole iteration, evaluation included."),
    "time/sample": _T("time/sample", "Name from timed('sample') in older cookbook loops."),
    "time/sampling": _T("time/sample", "Trace-span name in newer cookbook loops."),
    "time/train": _T(
        "time/learn",
        "forward_backward and optim_step round trips to the Tinker service, all substeps."),
    "time/run_evals": _T("time/eval"),
    "async/staleness_mean": _T(
        "replay/age",
        "Async training only: mean over the trained groups of (step − sampler step)."),
}

_ORLHF_UPDATE = ("averaged over every micro-batch of the update, weighted by action tokens "
                 "(token metrics) or samples")

# OpenRLHF (openrlhf/trainer/ray/ppo_actor.py, ppo_critic.py, ppo_trainer.py,
# ppo_utils/experience_maker.py, samples_generator.py, models/loss.py). Its W&B and TensorBoard
# loggers prefix every name with `train/` (openrlhf/utils/logging_utils.py); the importer strips
# it.
OPENRLHF: dict[str, Translation] = {
    "rollout/reward_mean": _T("reward/mean", "All rollout samples before dynamic filtering."),
    "rollout/reward_std": _T("reward/std", "torch.std over the samples: Bessel-corrected."),
    "rollout/response_length_mean": _T("length/mean", "All rollout samples."),
    "rollout/truncated_rate": _T("length/clip_ratio",
                                 "Finish reason 'length', over all rollout samples."),
    "policy_loss": _T("loss/policy", "Per-token PPO/GSPO loss, " + _ORLHF_UPDATE + ".",
                      timing="update"),
    "entropy_loss": _T("loss/entropy", "Entropy aggregated over action tokens before "
                       "actor.entropy_coef; " + _ORLHF_UPDATE + ".", timing="update"),
    "critic_loss": _T("loss/value", "Clipped value loss, " + _ORLHF_UPDATE + ".",
                      timing="update"),
    "ppo_clip_ratio": _T("policy/clipfrac_region",
                         "Tokens where the clipped surrogate is the smaller one, "
                         + _ORLHF_UPDATE + ".", timing="update"),
    "ppo_kl": _T("policy/kl_behaviour_k1",
                 "mean(ℓ_old − ℓ_new) over action tokens: our k1 with the sign flipped (the "
                 "importer negates it); " + _ORLHF_UPDATE + ".", sign=-1.0, timing="update"),
    "vllm_kl": _T("policy/kl_behaviour_k1_first",
                  "mean(ℓ_vLLM − ℓ_old) over action tokens, logged with vLLM importance-sampling "
                  "correction: our first-pass k1 with the sign flipped (the importer negates it).",
                  sign=-1.0, timing="update"),
    "logprobs_diff": _T("policy/kl_ref_k1",
                        "mean(ℓ − ℓ_ref) over action tokens per sample, then over samples: the "
                        "k1 estimate whatever algo.kl.estimator is.", reduction="seq_mean"),
    "kl": _T("policy/kl_ref_k1",
             "KL to the reference by algo.kl.estimator (default k1; k2/k3 when set), a per-sample "
             "token mean averaged over samples; under use_loss it is the loss-pass value.",
             reduction="seq_mean"),
    "reward": _T("reward/mean", "Per-sample reward (after reward shaping), mean over samples."),
    "actor_grad_norm": _T("optim/grad_norm", "The last micro-batch's value, not a mean."),
    "actor_lr": _T("optim/lr", "The last value in the update."),
    "values": _T("value/pred_mean", "Critic values, masked mean over action tokens, during the "
                 "critic update.", timing="update"),
    "response_length": _T("length/mean", "Generated tokens per sample, mean over samples."),
    "response_clip_ratio": _T(
        "length/clip_ratio",
        "Samples whose prompt + response reached the truncation length: a width comparison, "
        "not the finish reason (rollout/truncated_rate uses the finish reason)."),
    "timing/generation": _T("time/sample"),
    "timing/ppo_train": _T("time/learn", "Critic and actor updates."),
    "timing/step_total": _T("time/step", "Sum of the other timing/* entries."),
}

TRANSLATIONS: dict[str, dict[str, Translation]] = {
    "verl": VERL, "trl": TRL, "tinker": TINKER, "openrlhf": OPENRLHF}

_FOREIGN: dict[str, dict[str, str]] = {
    framework: {t.canonical: name for name, t in reversed(table.items())}
    for framework, table in TRANSLATIONS.items()
}
"""canonical → the first foreign name (in table order) that maps to it, per framework."""


def _table(framework: str) -> dict[str, Translation]:
    if framework not in TRANSLATIONS:
        raise ValueError(f"unknown framework {framework!r}; expected one of "
                         f"{sorted(TRANSLATIONS)}")
    return TRANSLATIONS[framework]


def translate(framework: str, name: str) -> tuple[str, str]:
    """(canonical name, note) for a known foreign name; (name, "") unchanged otherwise.

    ``framework`` is ``"verl"``, ``"trl"``, ``"tinker"`` (tinker-cookbook) or ``"openrlhf"``;
    anything else is a ValueError. Sources are listed in the module docstring. The sign is not
    applied here (see `Translation.sign`; the importer applies it).
    """
    t = _table(framework).get(name)
    return (name, "") if t is None else (t.canonical, t.note)


def to_foreign(framework: str, canonical: str) -> str | None:
    """The framework's familiar name for one of ours (for users who want familiar names).

    Where several foreign names map to ``canonical`` (a renamed metric, a duplicate), the first
    in the table wins; None when the framework has no equivalent.
    """
    _table(framework)
    return _FOREIGN[framework].get(canonical)


NAMES_DIR = Path(__file__).parent / "names"
"""Per-framework lists of the names each framework logs (``<framework>.toml``): the source
files they were read from, and the names deliberately left untranslated, each with a reason."""


@dataclass(frozen=True)
class NameList:
    """One framework's documented metric names (``names/<framework>.toml``)."""

    framework: str
    repository: str
    commit: str
    sources: dict[str, list[str]]
    """Source file(s) → the names read there."""
    ignored: dict[str, str]
    """Name → why it is kept under its own name."""
    ignored_patterns: dict[str, str]
    """fnmatch pattern → why names matching it are kept under their own names."""

    def names(self) -> list[str]:
        return list(dict.fromkeys(n for names in self.sources.values() for n in names))

    def ignore_reason(self, name: str) -> str | None:
        """Why ``name`` is deliberately untranslated, or None."""
        if name in self.ignored:
            return self.ignored[name]
        return next((r for p, r in self.ignored_patterns.items() if fnmatchcase(name, p)), None)


def name_list(framework: str) -> NameList:
    """The committed name list of ``framework`` (verl, trl, tinker, openrlhf, wandb)."""
    path = NAMES_DIR / f"{framework}.toml"
    if not path.exists():
        raise ValueError(f"no name list for {framework!r}; expected one of "
                         f"{sorted(p.stem for p in NAMES_DIR.glob('*.toml'))}")
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    return NameList(framework=data["framework"], repository=data["repository"],
                    commit=data["commit"],
                    sources={s["file"]: list(s["names"]) for s in data["source"]},
                    ignored=dict(data.get("ignored", {})),
                    ignored_patterns=dict(data.get("ignored_patterns", {})))


_NOT_SECONDS = re.compile(r"(^|_)(length|len|tokens?|count|num|preempted|ratio|frac|calls?_count)"
                          r"($|_)|^num_")


def is_seconds(name: str) -> bool:
    """Whether a name under a timing prefix (``time/``, ``timing_s/``, ``timing/``) holds
    seconds: a token count (verl's ``timing_s/agent_loop/slowest/response_length``), a count
    (tinker-cookbook's ``time/<span>:count``, ``.../num_preempted/...``) or a ratio logged under
    such a prefix is not a phase time."""
    parts = [p for p in re.split(r"[/:]", name)[1:] if p]
    return bool(parts) and not any(_NOT_SECONDS.search(p) for p in parts)
