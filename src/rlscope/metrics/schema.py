"""The metric schema: the single source of truth for every metric name rlscope writes.

Each metric has a **population** (what it is computed over: tokens, sequences, groups, steps),
a **reduction** (token-weighted mean, mean over sequences, max, min, std, sum, or a per-step
value), and a **timing** (on the rollout batch before any update; during the update on the
first or last pass; after the update; at evaluation). `docs/metrics.md` is rendered from it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MetricDef:
    name: str
    population: str
    """tokens | sequences | groups | steps | prompts"""
    reduction: str
    """token_mean | seq_mean | max | min | std | sum | value | frac"""
    timing: str
    """rollout | first_pass | last_pass | update | eval | step"""
    description: str


def _m(name: str, population: str, reduction: str, timing: str, description: str) -> MetricDef:
    return MetricDef(name, population, reduction, timing, description)


_PASS_METRICS = (
    ("ratio_mean", "token_mean", "mean importance ratio ρ = π/μ over valid tokens"),
    ("ratio_min", "min", "smallest ρ"),
    ("ratio_max", "max", "largest ρ"),
    ("kl_behaviour_k1", "token_mean", "k1 estimate of KL(π‖μ) to the behaviour policy"),
    ("kl_behaviour_k2", "token_mean", "k2 estimate of KL(π‖μ)"),
    ("kl_behaviour_k3", "token_mean", "k3 estimate of KL(π‖μ) (≥ 0 per token)"),
    ("clipfrac_low", "frac", "tokens with ρ < 1 − ε_low and A < 0 (clipped from below; gmpo: "
     "log-ratio ℓ − ℓ_μ < −ε_low)"),
    ("clipfrac_high", "frac", "tokens with ρ > 1 + ε_high and A > 0 (clipped from above; "
     "gmpo: log-ratio ℓ − ℓ_μ > ε_high)"),
    ("clipfrac_region", "frac", "tokens clipped on either side"),
    ("clipfrac_dual", "frac", "tokens where the dual-clip cap binds"),
)

METRICS: tuple[MetricDef, ...] = (
    _m("reward/mean", "sequences", "seq_mean", "rollout", "mean training reward"),
    _m("reward/std", "sequences", "std", "rollout", "population std of training rewards"),
    _m("reward/min", "sequences", "min", "rollout", "smallest training reward"),
    _m("reward/max", "sequences", "max", "rollout", "largest training reward"),
    _m("reward/raw_mean", "sequences", "seq_mean", "rollout",
       "mean reward before noise or shaping"),
    _m("reward/noise_rate", "sequences", "frac", "rollout",
       "rows whose training reward the configured reward noise replaced"),
    _m("reward/overlong_penalty_mean", "sequences", "seq_mean", "rollout",
       "--overlong penalty: mean length penalty added to the training reward"),
    _m("reward/greedy_mean", "sequences", "seq_mean", "rollout",
       "ReMax: mean training reward of the greedy rollouts used as baseline"),
    _m("adv/mean", "tokens", "token_mean", "rollout", "mean advantage over valid tokens"),
    _m("adv/abs_mean", "tokens", "token_mean", "rollout", "mean |A|"),
    _m("adv/std", "tokens", "std", "rollout", "std of A over valid tokens"),
    _m("adv/min", "tokens", "min", "rollout", "smallest A"),
    _m("adv/max", "tokens", "max", "rollout", "largest A"),
    _m("adv/frac_zero", "tokens", "frac", "rollout", "tokens whose |A| < 1e-8"),
    _m("adv/group_std_mean", "groups", "seq_mean", "rollout", "mean within-group reward std"),
    _m("adv/group_std_min", "groups", "min", "rollout", "smallest within-group reward std"),
    _m("adv/amplification", "sequences", "value", "rollout",
       "mean |A| / mean |r − mean_g|: how much normalisation inflates reward gaps"),
    _m("candidates/reward_mean", "tokens", "token_mean", "rollout",
       "mean dense reward of the K next-token candidates (tpo_token, grpo_token)"),
    _m("group/mixed_rate", "groups", "frac", "rollout", "groups with reward std > 1e-6"),
    _m("group/all_zero_rate", "groups", "frac", "rollout",
       "groups whose rewards are all 0 (no success: no contrast), before selection"),
    _m("group/all_one_rate", "groups", "frac", "rollout",
       "groups whose rewards are all 1 (no failure: no contrast), before selection"),
    _m("group/retained_rate", "sequences", "frac", "rollout", "rows kept by selection"),
    _m("group/fallback", "steps", "value", "rollout", "1 when no group was mixed"),
    _m("group/fill_rounds", "steps", "value", "rollout",
       "generation rounds --fill_batch (or gpg's --gpg_min_valid) used to fill the batch with "
       "mixed groups"),
    _m("select/kept_frac", "sequences", "frac", "rollout",
       "kondo selection: rows kept for the update"),
    _m("select/gate_prob_mean", "sequences", "seq_mean", "rollout",
       "kondo selection: mean keep probability σ((χ − λ)/η) (the keep ratio, up to bisection)"),
    _m("select/overlong_masked_frac", "sequences", "frac", "rollout",
       "--overlong mask: rows truncated at max_new_tokens without a stop token, dropped from "
       "the loss"),
    _m("policy/entropy", "tokens", "token_mean", "first_pass",
       "categorical entropy of the learner's sampling distribution on action tokens, before "
       "the update"),
    _m("policy/entropy_sampled", "tokens", "token_mean", "rollout",
       "−mean ℓ_μ: surprisal of the sampled tokens under the behaviour policy"),
    *(_m(f"policy/{n}", "tokens", red, "last_pass", f"{d} (last pass)")
      for n, red, d in _PASS_METRICS),
    *(_m(f"policy/{n}_first", "tokens", red, "first_pass", f"{d} (first pass)")
      for n, red, d in _PASS_METRICS),
    _m("policy/approx_kl", "tokens", "token_mean", "last_pass",
       "½·mean (ℓ − ℓ_μ)² on the last pass (the k2 estimate PPO codes report)"),
    _m("policy/kl_ref_k1", "tokens", "token_mean", "rollout",
       "k1 estimate of KL(π‖π_ref) before the update"),
    _m("policy/kl_ref_k3", "tokens", "token_mean", "rollout",
       "k3 estimate of KL(π‖π_ref) before the update"),
    _m("policy/kl_ref_seq_k1", "sequences", "seq_mean", "rollout",
       "k1 KL to the reference summed over each sequence (the adaptive controller's input)"),
    _m("policy/gate_mean", "tokens", "token_mean", "last_pass", "mean delight gate σ(A·(−ℓ)/η)"),
    _m("policy/iw_mean", "tokens", "token_mean", "last_pass", "mean capped importance weight"),
    *(_m(f"policy/{n}", "tokens", red, "last_pass", d) for n, red, d in (
        ("cispo_capped_frac", "frac", "tokens whose CISPO weight hit ε_max"),
        ("weight_mean", "token_mean", "ASPO: mean asymmetric importance weight w"),
        ("pos_frac", "frac", "ASPO: tokens with A > 0"),
        ("var_penalty_mean", "token_mean", "R2VPO: mean ratio-variance penalty λ(ρ − 1)²"),
        ("sapo_gate_mean", "token_mean", "SAPO: mean soft gate σ(τ(ρ − 1))"),
        ("dro_penalty_mean", "token_mean", "DRO: mean (β/2)(ℓ − ℓ_μ)²"),
        ("tpo_target_entropy", "token_mean",
         "TPO family: entropy of the soft target q (per group, or per prefix over candidates)"),
        ("tpo_target_top_prob", "token_mean", "TPO family: largest probability of the target q"),
        ("candidate_kl", "token_mean", "grpo_token: Σ over candidates of k3 to the behaviour"),
        ("distill_ce", "token_mean", "self_distill: gated label cross-entropy g·CE"),
        ("first_error_frac", "frac",
         "scope_lite: valid tokens at or after a rollout's first wrong token"),
        ("correction_loss", "token_mean",
         "scope_lite: label cross-entropy on the correction suffix, over all valid tokens"),
        ("log_growth_weight", "token_mean", "log-growth weight A·(1/π or 1)"),
        ("pmd_seq_loss", "token_mean", "PMD-mean: per-sequence squared error"),
        ("kept_frac", "frac", "uncertainty filter: tokens of samples kept (u ≤ τ)"),
        ("uncertainty_mean", "token_mean", "mean reward spread u seen by the gate"),
        ("entropy_guard_mean", "token_mean", "mean entropy-guard factor"),
        ("freshness_weight", "token_mean", "mean freshness factor exp(−λ_age·age)"),
        ("batch_age", "token_mean", "age of the trained batch, as the freshness gate saw it"),
    )),
    _m("sampler/logp_diff_mean", "tokens", "token_mean", "first_pass",
       "mean |ℓ_learner − ℓ_sampler| before the update: sampler/learner mismatch"),
    _m("sampler/logp_diff_max", "tokens", "max", "first_pass", "largest |ℓ_learner − ℓ_sampler|"),
    _m("sampler/frac_outside_band", "tokens", "frac", "first_pass",
       "tokens whose first-pass ratio lies outside [0.9, 1.1]"),
    _m("sampler/is_ess", "tokens", "value", "first_pass",
       "normalised effective sample size (Σρ)²/(N·Σρ²) of first-pass ratios"),
    _m("sampler/correction_weight_mean", "tokens", "token_mean", "rollout",
       "mean off-policy correction weight (--is_correction) multiplied into the loss"),
    _m("sampler/correction_active_frac", "tokens", "frac", "rollout",
       "tokens whose correction weight was capped (truncate) or dropped (mask)"),
    _m("sampler/correction_ess", "tokens", "value", "rollout",
       "--is_correction: normalised effective sample size 1/mean(ŵ²), ŵ = w/mean(w), of the "
       "correction weights w (1 = equal weights; 0 = all dropped)"),
    _m("sampler/is_mean", "tokens", "token_mean", "rollout",
       "--is_correction: mean token ratio ρ_c = exp(ℓ_learner − ℓ_sampler), before the update"),
    _m("sampler/is_max", "tokens", "max", "rollout", "--is_correction: largest token ρ_c"),
    _m("sampler/is_min", "tokens", "min", "rollout", "--is_correction: smallest token ρ_c"),
    _m("sampler/frac_high", "tokens", "frac", "rollout",
       "--is_correction: tokens whose compared ratio (token, or its sequence's) is above C "
       "(truncate) or the band (mask)"),
    _m("sampler/frac_low", "tokens", "frac", "rollout",
       "--is_correction: tokens whose compared ratio is below C_min (truncate) or the band "
       "(mask)"),
    _m("sampler/masked_frac", "tokens", "frac", "rollout",
       "--is_correction: tokens whose correction weight is 0 (dropped)"),
    _m("sampler/seq_masked_frac", "sequences", "frac", "rollout",
       "--is_correction: sequences with at least one dropped token (all of them for "
       "sequence_mask)"),
    _m("sampler/chi2_token", "tokens", "token_mean", "rollout",
       "--is_correction: mean ρ_c² − 1, the χ² divergence of the learner from the sampler "
       "on the sampled tokens"),
    _m("sampler/k3", "tokens", "token_mean", "rollout",
       "--is_correction (and --fp32_head, from the first pass): mean ρ_c − 1 − log ρ_c, k3 "
       "estimate of KL(π_sampler‖π_learner)"),
    _m("sampler/seq_log_ratio", "sequences", "seq_mean", "rollout",
       "--is_correction: mean over sequences of Σ_t (ℓ_learner − ℓ_sampler), the log of the "
       "sequence ratio"),
    _m("optim/grad_norm", "steps", "seq_mean", "update",
       "global gradient norm before clipping (mean over the step's optimizer steps)"),
    _m("optim/grad_norm_clipped", "steps", "seq_mean", "update", "gradient norm after clipping"),
    _m("optim/nonfinite_steps", "steps", "value", "update",
       "optimizer steps with a NaN or infinite gradient norm, skipped (eager learner)"),
    _m("optim/clip_active", "steps", "frac", "update",
       "fraction of optimizer steps where the gradient clip fired"),
    _m("optim/lr", "steps", "value", "update", "learning rate"),
    _m("loss/total", "steps", "seq_mean", "last_pass", "total loss"),
    _m("loss/policy", "steps", "seq_mean", "last_pass", "aggregated policy objective"),
    _m("loss/value", "steps", "seq_mean", "last_pass", "value loss (before vf_coef)"),
    _m("loss/kl", "steps", "seq_mean", "last_pass", "aggregated KL term (before β)"),
    _m("loss/entropy", "steps", "seq_mean", "last_pass", "aggregated entropy (before c)"),
    _m("value/explained_var", "tokens", "value", "rollout",
       "1 − Var(R − V) / Var(R) of the critic before the update"),
    _m("value/pred_mean", "tokens", "token_mean", "rollout", "mean predicted value"),
    _m("value/clipfrac", "tokens", "frac", "last_pass", "tokens where the value clip binds"),
    _m("value/error", "tokens", "token_mean", "rollout", "mean squared error (R − V)²"),
    _m("kl_ctrl/beta", "steps", "value", "step", "KL coefficient β in force this step"),
    _m("entropy_ctrl/coef", "steps", "value", "step",
       "entropy-bonus coefficient c in force this step (moves under adaptive control)"),
    _m("length/mean", "sequences", "seq_mean", "rollout", "mean completion length"),
    _m("length/min", "sequences", "min", "rollout", "shortest completion"),
    _m("length/max", "sequences", "max", "rollout", "longest completion"),
    _m("length/terminated_mean", "sequences", "frac", "rollout",
       "rows ended by a stop token (finish reason stop)"),
    _m("length/clip_ratio", "sequences", "frac", "rollout",
       "rows ended by max_new_tokens (finish reason length)"),
    _m("env/errors", "steps", "sum", "rollout",
       "--env_workers: scoring calls that raised, lost their worker or timed out while this "
       "step's batch was scored (each retried; rows still failing get the failure reward); "
       "interactive tasks: environment calls that raised (the episode ends 'failed')"),
    _m("time/sample", "steps", "value", "step", "seconds sampling"),
    _m("time/score", "steps", "value", "step", "seconds scoring"),
    _m("time/ref", "steps", "value", "step",
       "seconds in no-grad forwards before the update (values, reference, baselines)"),
    _m("time/learn", "steps", "value", "step", "seconds in learner passes and optimizer steps"),
    _m("time/eval", "steps", "value", "step", "seconds evaluating (eval steps only)"),
    _m("time/step", "steps", "value", "step", "seconds for the whole step"),
    _m("time/sampler_weight_sync", "steps", "value", "step",
       "seconds the static sampler spent copying updated weights into its own (inside "
       "time/sample; 0 with the eager backend)"),
    _m("time/sample_mean", "steps", "value", "step",
       "data parallel: time/sample averaged over ranks (time/sample is the slowest rank's)"),
    _m("time/score_mean", "steps", "value", "step",
       "data parallel: time/score averaged over ranks (time/score is the slowest rank's)"),
    _m("time/ref_mean", "steps", "value", "step",
       "data parallel: time/ref averaged over ranks (time/ref is the slowest rank's)"),
    _m("time/learn_mean", "steps", "value", "step",
       "data parallel: time/learn averaged over ranks (time/learn is the slowest rank's)"),
    _m("time/step_mean", "steps", "value", "step",
       "data parallel: time/step averaged over ranks (time/step is the slowest rank's)"),
    _m("throughput/sample_tokens_per_s", "steps", "value", "step", "generated tokens / s"),
    _m("throughput/learn_tokens_per_s", "steps", "value", "step",
       "learner tokens (prompt + completion, all passes) / s"),
    _m("perf/peak_memory_mb", "steps", "max", "step", "peak device memory (CUDA only)"),
    _m("replay/size", "steps", "value", "step", "batches stored in the replay buffer"),
    _m("replay/age_mean", "steps", "value", "step", "mean age of the stored batches"),
    _m("replay/age_max", "steps", "value", "step", "oldest stored batch"),
    _m("replay/priority_mean", "steps", "value", "step", "mean push-time priority"),
    _m("replay/eligible", "steps", "value", "step",
       "stored batches old enough (age >= delay) to be drawn this step"),
    _m("replay/age", "steps", "value", "step",
       "age of the batch trained on this step (0 = the fresh batch)"),
    _m("replay/priority", "steps", "value", "step",
       "draw weight of the batch trained on this step (fresh_delight: age factor included)"),
    _m("replay/trained_age_mean", "steps", "value", "step",
       "mean age of every batch trained on so far"),
    _m("replay/age_hist_*", "steps", "sum", "step",
       "cumulative count of trained batches per age bin (0, 1, 2–3, 4–7, ...)"),
    _m("diag/batch_entropy_before", "tokens", "token_mean", "rollout",
       "entropy on the trained batch before the first inner epoch (eval steps)"),
    _m("diag/batch_entropy_after", "tokens", "token_mean", "update",
       "entropy on the trained batch after the last inner epoch (eval steps)"),
    _m("diag/batch_entropy_delta", "tokens", "token_mean", "update", "after − before"),
    _m("diag/cov_pi_dlogit", "tokens", "value", "update",
       "covariance of π_before(a) and the change of the chosen token's logit"),
    _m("diag/entropy_delta_pos_adv", "tokens", "token_mean", "update",
       "entropy change on positions with A > 0"),
    _m("diag/entropy_delta_neg_adv", "tokens", "token_mean", "update",
       "entropy change on positions with A < 0"),
    *(_m(f"diag/entropy_delta_{key}_t{i}", "tokens", "token_mean", "update",
         f"entropy change in the {word} third of positions by {key}")
      for key in ("surprisal", "delight")
      for i, word in ((1, "lowest"), (2, "middle"), (3, "highest"))),
    _m("diag/grad_norm", "steps", "value", "first_pass",
       "norm of the method's gradient on the batch before the update (eval steps)"),
    _m("diag/grad_norm_clipped", "steps", "value", "first_pass", "the same after clipping"),
    _m("diag/grad_cos_ce_oracle", "steps", "value", "first_pass",
       "cosine between the method's gradient and the cross-entropy-oracle gradient"),
    _m("eval/test_error", "prompts", "seq_mean", "eval", "held-out greedy error"),
    _m("eval/entropy", "tokens", "token_mean", "eval",
       "mean per-step entropy along greedy held-out rollouts"),
    _m("eval/test_error_unscored", "prompts", "seq_mean", "eval",
       "held-out error on unscored positions (masked_reversal)"),
    _m("eval/chain_reward", "prompts", "seq_mean", "eval", "mean chain reward of greedy outputs"),
    _m("eval/format_error", "prompts", "seq_mean", "eval",
       "share of greedy answers that are not a terminated canonical integer (arithmetic)"),
    _m("eval/words", "prompts", "seq_mean", "eval",
       "mean word count of greedy answers (length_target, preference_rm)"),
    _m("eval/true_reward", "prompts", "seq_mean", "eval",
       "preference_rm: mean hidden (true) preference of greedy answers: distinct liked words "
       "− repeated words − [unterminated]"),
    _m("eval/rm_score", "prompts", "seq_mean", "eval",
       "preference_rm: mean standardised reward-model score of greedy answers (the training "
       "reward)"),
    _m("eval/liked_words", "prompts", "seq_mean", "eval",
       "preference_rm: mean number of distinct liked words in greedy answers"),
    _m("eval/repeats", "prompts", "seq_mean", "eval",
       "preference_rm: mean number of words repeating an earlier word in greedy answers"),
    _m("eval/solved", "prompts", "seq_mean", "eval",
       "share of greedy function bodies that pass every hidden test (code_unit_tests)"),
    _m("eval/sandbox_ok", "prompts", "seq_mean", "eval",
       "share of greedy programs that ran to a result in the sandbox: no timeout, crash, "
       "limit or blocked call (code_unit_tests)"),
    _m("eval/success", "prompts", "seq_mean", "eval",
       "interactive tasks: share of greedy held-out episodes the environment ended 'solved'"),
    _m("eval/turns", "prompts", "seq_mean", "eval",
       "interactive tasks: mean policy turns of a greedy held-out episode"),
    _m("eval/return", "prompts", "seq_mean", "eval",
       "interactive tasks: mean return (turn rewards, discounted by --turn_discount) of a "
       "greedy held-out episode"),
    _m("sft/loss", "tokens", "token_mean", "step",
       "rlscope sft: cross-entropy of the step's batch on completion tokens (prompt masked)"),
    _m("rm/loss", "sequences", "seq_mean", "step",
       "rlscope rm: Bradley–Terry loss −log σ(r_chosen − r_rejected) of the step's pairs"),
    _m("rm/accuracy", "sequences", "frac", "step",
       "rlscope rm: share of the step's pairs with r_chosen > r_rejected"),
    _m("rm/margin", "sequences", "seq_mean", "step",
       "rlscope rm: mean r_chosen − r_rejected of the step's pairs"),
    _m("rm/heldout_loss", "sequences", "seq_mean", "eval",
       "rlscope rm: Bradley–Terry loss on held-out generated pairs"),
    _m("rm/heldout_accuracy", "sequences", "frac", "eval",
       "rlscope rm: share of held-out pairs ranked as the hidden preference ranks them"),
    _m("rm/probe_accuracy", "sequences", "frac", "eval",
       "rlscope rm: the same on probe pairs outside the training distribution (an answer vs "
       "itself with a liked word repeated; preference_rm)"),
    _m("sft/heldout_loss", "tokens", "token_mean", "eval",
       "rlscope sft: the same on held-out pairs (the first 256 pairs of --data)"),
    _m("eval/nll", "prompts", "seq_mean", "eval",
       "mean −log π(next token) on held-out windows, teacher-forced (lm_bandit)"),
    _m("eval/perplexity", "prompts", "value", "eval",
       "exp of the mean held-out NLL of the next token (lm_bandit)"),
    *(_m(f"eval/test_error_t{i}", "prompts", "seq_mean", "eval",
         f"held-out greedy error on the {word} third of windows by the initial model's loss, "
         "terciles fixed per seed (lm_bandit)")
      for i, word in ((1, "easiest"), (2, "middle"), (3, "hardest"))),
    # METHODS_2026.md objectives and batch-wide selections (issue 19, obj19)
    *(_m(f"policy/{n}", "tokens", red, "last_pass", d) for n, red, d in (
        ("masked_frac_pos", "frac", "dppo_tv/dppo_kl: valid tokens with A > 0 masked for "
         "leaving the divergence region (a fraction of the valid tokens with A ≠ 0)"),
        ("masked_frac_neg", "frac", "dppo_tv/dppo_kl: valid tokens with A < 0 masked (a "
         "fraction of the valid tokens with A ≠ 0)"),
        ("tv_mean", "token_mean", "dppo: mean |π(a) − μ(a)| of the sampled tokens"),
        ("binary_kl_mean", "token_mean",
         "dppo: mean binary KL p_μ ln(p_μ/p) + (1−p_μ) ln((1−p_μ)/(1−p))"),
        ("kl_cov_penalty", "token_mean",
         "kl_cov: mean β|ℓ − ℓ_μ| over valid tokens (non-zero on the selected tokens only)"),
    )),
    _m("cov/selected_frac", "tokens", "frac", "first_pass",
       "clip_cov/kl_cov: tokens selected by the covariance rule at the step's first optimizer "
       "step (selection over the whole minibatch)"),
    _m("cov/mean", "tokens", "token_mean", "first_pass",
       "clip_cov/kl_cov: mean covariance C_t = (A_t − Ā)(ℓ_t − ℓ̄) over valid tokens"),
    _m("cov/selected_mean", "tokens", "token_mean", "first_pass",
       "clip_cov/kl_cov: mean C_t of the selected tokens"),
    _m("gate/kept_frac", "tokens", "frac", "first_pass",
       "entropy_top gate (dapo_forking): valid tokens with H_t >= τ at the first optimizer "
       "step"),
    _m("gate/entropy_threshold", "tokens", "value", "first_pass",
       "entropy_top gate: τ, the (1 − ρ_H)-quantile of H over the minibatch's valid tokens"),
    _m("policy/entropy_kept", "tokens", "token_mean", "first_pass",
       "entropy_top gate: mean entropy of the kept (high-entropy) tokens"),
    _m("policy/entropy_dropped", "tokens", "token_mean", "first_pass",
       "entropy_top gate: mean entropy of the dropped tokens"),
    _m("adv/opo_baseline_gap", "groups", "seq_mean", "rollout",
       "opo: mean_g |b_g − mean_g r|, how far the length-weighted baseline moves from GRPO's"),
    _m("adv/gpg_alpha", "steps", "value", "rollout",
       "gpg: α = B/(B − M), M the rows of zero-variance groups (0 when every group is flat)"),
    _m("adv/batch_std", "sequences", "std", "rollout",
       "group_center_batchstd (scalerl): std over the kept rows of the centred rewards"),
    _m("adv/lambda_policy_mean", "sequences", "seq_mean", "rollout",
       "gae_decoupled (vapo): mean actor λ_i = clamp(1 − 1/(α_L|y_i|), 0, 1)"),
    _m("loss/pos_nll", "steps", "seq_mean", "last_pass",
       "vapo: NLL of the successful rows' tokens (before pos_nll_coef)"),
    _m("critic_pretrain/value_loss_first", "tokens", "token_mean", "rollout",
       "critic pre-training (vapo): value loss of its first step (logged with step 0)"),
    _m("critic_pretrain/value_loss_last", "tokens", "token_mean", "rollout",
       "critic pre-training: value loss of its last step (logged with step 0)"),
    _m("critic_pretrain/explained_var", "tokens", "value", "rollout",
       "critic pre-training: explained variance of the λ = 1 targets at its last step"),
    # issue 19, distillation and DeepSeek-V3.2 masking (METHODS_2026.md §3 dsv32, opd, gkd)
    _m("gate/opsm_masked_seq_frac", "sequences", "frac", "last_pass",
       "opsm gate (dsv32): rows dropped (A < 0 and D > δ, D = mean_t(ℓ_s − ℓ) with the "
       "current ℓ)"),
    _m("gate/opsm_D_mean", "sequences", "seq_mean", "last_pass",
       "opsm gate (dsv32): mean over rows of D_i = mean_t(ℓ_s − ℓ)"),
    _m("policy/kl_ref_is", "tokens", "token_mean", "last_pass",
       "is_corrected KL (dsv32): mean of ρ·k3 to the reference, ρ = π/μ"),
    _m("distill/teacher_rkl", "tokens", "token_mean", "rollout",
       "opd: mean sampled-token reverse KL to the teacher, ℓ_μ − ℓ_T"),
    _m("distill/teacher_rkl_seq", "sequences", "seq_mean", "rollout",
       "opd: Σ_t (ℓ_μ − ℓ_T) per sequence, mean over rows"),
    _m("distill/jsd", "tokens", "token_mean", "last_pass",
       "gkd: mean JSD_β(P_T‖P_θ) over the vocabulary at temperature τ"),
    _m("distill/rkl", "tokens", "token_mean", "last_pass",
       "gkd: mean reverse KL(P_θ‖P_T) at temperature τ"),
    _m("distill/fkl", "tokens", "token_mean", "last_pass",
       "gkd: mean forward KL(P_T‖P_θ) at temperature τ"),
    # issue 21, companion 1: OPD from a built-in teacher (COMPANIONS.md §1)
    _m("opd/reverse_kl", "tokens", "token_mean", "last_pass",
       "opd_reverse_kl: exact KL(π‖π_T) over the vocabulary at the visited prefixes"),
    _m("opd/student_topk_mass", "tokens", "token_mean", "last_pass",
       "opd_topk_reverse_kl: Σ_{a∈S_t} π(a), the student's mass on the support"),
    _m("opd/teacher_topk_mass", "tokens", "token_mean", "last_pass",
       "opd_topk_reverse_kl: Σ_{a∈S_t} π_T(a), the teacher's mass on the support"),
    _m("opd/topk_support_size", "tokens", "token_mean", "last_pass",
       "opd_topk_reverse_kl: |S_t| (k, or less for the intersection)"),
    _m("opd/top1_agreement", "tokens", "frac", "last_pass",
       "opd_topk_reverse_kl: [argmax π = argmax π_T] (ties to the lower id)"),
    _m("eval/opd_reverse_kl", "tokens", "token_mean", "eval",
       "OPD presets: KL(π‖π_T) on a fresh batch of temperature-1 student samples"),
    _m("eval/opd_forward_kl", "tokens", "token_mean", "eval",
       "OPD presets: KL(π_T‖π) on the same samples"),
    _m("eval/opd_sampled_reverse_kl", "tokens", "token_mean", "eval",
       "OPD presets: mean of ℓ(a_t) − log π_T(a_t) over the sampled tokens"),
    _m("eval/student_entropy", "tokens", "token_mean", "eval",
       "OPD presets: the student's entropy at the sampled prefixes"),
    _m("eval/teacher_entropy", "tokens", "token_mean", "eval",
       "OPD presets: the teacher's entropy at the sampled prefixes; two_view: the teacher's "
       "entropy along its greedy paths"),
    _m("eval/entropy_gap", "tokens", "token_mean", "eval",
       "OPD presets: student − teacher entropy"),
    _m("eval/top1_agreement", "tokens", "frac", "eval",
       "OPD presets: [argmax π = argmax π_T] at the sampled prefixes"),
    _m("eval/overlap_at_k", "tokens", "token_mean", "eval",
       "OPD presets: |top-k(π) ∩ top-k(π_T)|/k, k = --overlap_k (ties to the lower id)"),
    _m("eval/student_topk_mass", "tokens", "token_mean", "eval",
       "OPD presets: Σ_S π on the run's support (other presets: the student's top overlap_k)"),
    _m("eval/teacher_topk_mass", "tokens", "token_mean", "eval",
       "OPD presets: Σ_S π_T on the run's support"),
    _m("eval/topk_support_size", "tokens", "token_mean", "eval",
       "OPD presets: |S| of the run's support"),
    _m("eval/sampled_reward", "sequences", "seq_mean", "eval",
       "OPD presets: task reward of the fresh temperature-1 student samples"),
    _m("phase", "steps", "value", "eval",
       "tag of an evaluation row (a string): 'switch' = the OPD warm-up switch, evaluated "
       "before step W's update (--opd_warmup_steps)"),
    _m("eval/token_error", "tokens", "token_mean", "eval",
       "OPD presets: greedy token error against the targets on the fresh prompts"),
    # issue 20, multi-turn episodes (interactive tasks; docs/environments.md)
    _m("episode/turns", "sequences", "seq_mean", "rollout",
       "interactive tasks: mean policy turns per episode"),
    _m("episode/policy_tokens", "sequences", "seq_mean", "rollout",
       "interactive tasks: mean policy tokens per episode (the loss mask's tokens)"),
    _m("episode/env_tokens", "sequences", "seq_mean", "rollout",
       "interactive tasks: mean environment (observation) tokens per episode"),
    _m("episode/solved_frac", "sequences", "frac", "rollout",
       "interactive tasks: episodes the environment ended 'solved'"),
    _m("episode/reward_per_turn", "sequences", "value", "rollout",
       "interactive tasks: mean environment reward per policy turn taken (Σ rewards / Σ "
       "turns over the batch, undiscounted)"),
    _m("episode/truncated_frac/*", "sequences", "frac", "rollout",
       "interactive tasks: episodes a budget truncated, per reason: max_turns, max_turn_tokens "
       "(the last allowed turn was itself cut by the per-turn limit), max_episode_tokens"),
    _m("episode/env_tokens_in_loss", "tokens", "frac", "rollout",
       "interactive tasks: fraction of environment tokens inside the learner's loss mask "
       "(0 in a correct run; the doctor's env_tokens_in_loss rule)"),
    # issue 20, twenty_questions' model answerer (--twenty_questions_answerer model)
    _m("eval/accuracy", "prompts", "seq_mean", "eval",
       "twenty_questions_answerer: greedy answers equal to the table oracle's"),
    _m("answerer/questions", "steps", "value", "rollout",
       "twenty_questions, model answerer: questions it answered in the batch's episodes"),
    _m("answerer/accuracy", "steps", "frac", "rollout",
       "twenty_questions, model answerer: its answers in the batch's episodes equal to the "
       "table oracle's"),
    _m("answerer/loss", "steps", "value", "update",
       "twenty_questions --twenty_questions_train_answerer: the answerer's REINFORCE loss "
       "(faithful-answer reward, per-question mean baseline)"),
    _m("answerer/reward_mean", "steps", "seq_mean", "update",
       "twenty_questions --twenty_questions_train_answerer: mean faithful-answer reward of the "
       "answerer's sampled answers (1 = the oracle's answer)"),
    # issue 21, learnability (COMPANIONS.md §5): unique_path's exact metrics, read from the
    # tabular policy (p_d = π(target | x, d), reach_d = Π_{t<d} p_t, q = Π_d p_d)
    _m("eval/success_probability", "prompts", "seq_mean", "eval",
       "unique_path: exact success probability q = Π_d p_d, mean over prompts"),
    _m("eval/pass_at_group_size", "prompts", "seq_mean", "eval",
       "unique_path: exact 1 − (1 − q)^K, K the run's group size"),
    _m("eval/predicted_mixed_group_rate", "prompts", "seq_mean", "eval",
       "unique_path: exact M(q, K) = 1 − q^K − (1 − q)^K, the mixed-group rate the theory "
       "predicts (compare group/mixed_rate)"),
    _m("eval/mean_state_correct_probability", "prompts", "seq_mean", "eval",
       "unique_path: mean over prompts and depths of p_d"),
    _m("eval/expected_visited_steps", "prompts", "seq_mean", "eval",
       "unique_path: exact expected actions per episode Σ_d reach_d"),
    _m("eval/correct_probability_d*", "prompts", "seq_mean", "eval",
       "unique_path: p_d at depth d (d = 0..H − 1)"),
    _m("eval/reach_probability_d*", "prompts", "seq_mean", "eval",
       "unique_path: reach_d = Π_{t<d} p_t, the probability an episode reaches depth d"),
    # issue 21, VPO (COMPANIONS.md §2): the set step on vector_pareto (w* = (0.5, 0.5))
    _m("vpo/gold_set_reward", "sequences", "seq_mean", "rollout",
       "vector_pareto: mean over the batch's sets of max_m w*ᵀ r_m (every set preset; "
       "reward/mean is the preset's own set score)"),
    _m("eval/mean_scalar_reward", "prompts", "seq_mean", "eval",
       "vector_pareto: mean gold score w*ᵀ r over the evaluation pool (12 sets per prompt)"),
    _m("eval/best@1", "prompts", "seq_mean", "eval",
       "vector_pareto: gold score of the pool's first candidate"),
    _m("eval/best@3", "prompts", "seq_mean", "eval",
       "vector_pareto: best gold score among the pool's first 3 candidates (set by set)"),
    _m("eval/best@9", "prompts", "seq_mean", "eval",
       "vector_pareto: best gold score among the pool's first 9 candidates (set by set)"),
    _m("eval/pool_diversity_l1", "prompts", "seq_mean", "eval",
       "vector_pareto: mean over sets of the mean pairwise ‖r_m − r_m'‖₁ inside a set (0 at "
       "M = 1)"),
    # issue 21, pedagogy (COMPANIONS.md §3): the two_view step on teacher_student. ℓ_t is the
    # frozen current student's log-prob of a teacher token on the student view, gap_t =
    # max_a log π_s(a) − ℓ_t, spike = (logsumexp_t(β·gap_t) − log T)/β, G = exp(−λ·spike)
    _m("ped/task_reward", "sequences", "seq_mean", "rollout",
       "two_view: mean task reward R of the teacher's grouped samples"),
    _m("ped/pedagogy_reward", "sequences", "seq_mean", "rollout",
       "two_view: mean teacher reward (pedagogical_rl R·G; teacher_rl R − λ·mean_t(−ℓ_t))"),
    _m("ped/learnability", "sequences", "seq_mean", "rollout",
       "two_view: pedagogical_rl mean G = exp(−λ·spike); teacher_rl mean surprisal penalty "
       "λ·mean_t(−ℓ_t)"),
    _m("ped/spike_penalty", "sequences", "seq_mean", "rollout",
       "two_view: mean spike, the soft max over tokens of the student's surprise gap"),
    _m("ped/avg_surprise_gap", "tokens", "token_mean", "rollout",
       "two_view: token mean of gap_t on the teacher's samples"),
    _m("ped/max_surprise_gap", "sequences", "seq_mean", "rollout",
       "two_view: mean over sequences of max_t gap_t (spike's upper bound)"),
    _m("ped/avg_student_surprisal", "tokens", "token_mean", "rollout",
       "two_view: token mean of −ℓ_t, the student's surprisal at the teacher's tokens"),
    _m("teacher/adv_abs_mean", "tokens", "token_mean", "rollout",
       "two_view: mean |A| of the teacher's GRPO step (group z-score of its reward)"),
    _m("teacher/ratio_mean", "tokens", "token_mean", "update",
       "two_view: mean importance ratio ρ of the teacher's GRPO step"),
    _m("teacher/clipfrac", "tokens", "frac", "update",
       "two_view: teacher tokens clipped by ppo_clip (either side)"),
    _m("teacher/loss", "steps", "value", "update", "two_view: the teacher's GRPO loss"),
    _m("teacher/mixed_group_rate", "groups", "frac", "rollout",
       "two_view: teacher groups whose teacher-reward std > 1e-6 (the reward it trains on)"),
    _m("assim/loss", "steps", "value", "update",
       "two_view: the student's imitation loss mean_b[Σ_t w_t(−ℓ_t) / max(Σ_t w_t, 1e-8)]"),
    _m("assim/gate_mean", "tokens", "token_mean", "update",
       "two_view: token mean of the imitation weight w_t = σ(κ(ℓ_t − γ)) (1 under SFT)"),
    _m("assim/logp_mean", "tokens", "token_mean", "update",
       "two_view: token mean of the student's ℓ_t on the teacher samples it imitates"),
    _m("assim/teacher_sample_task_reward", "sequences", "seq_mean", "rollout",
       "two_view: mean task reward of the teacher samples the student imitates"),
    _m("student/task_reward", "sequences", "seq_mean", "rollout",
       "student_grpo: mean task reward of the student's own grouped rollouts"),
    _m("student/adv_abs_mean", "tokens", "token_mean", "rollout",
       "student_grpo: mean |A| (group z-score of R)"),
    _m("student/ratio_mean", "tokens", "token_mean", "update",
       "student_grpo: mean importance ratio ρ"),
    _m("student/clipfrac", "tokens", "frac", "update",
       "student_grpo: tokens clipped by ppo_clip (either side)"),
    _m("student/loss", "steps", "value", "update", "student_grpo: the student's GRPO loss"),
    _m("student/mixed_group_rate", "groups", "frac", "rollout",
       "student_grpo: groups whose reward std > 1e-6"),
    _m("eval/reward", "prompts", "seq_mean", "eval",
       "two_view: the student's mean reward of one temperature-1 sample per pair (all V²)"),
    _m("eval/teacher_test_error", "prompts", "seq_mean", "eval",
       "two_view: the teacher's greedy test error on its view (1 − last-token accuracy)"),
    _m("eval/teacher_reward", "prompts", "seq_mean", "eval",
       "two_view: the teacher's mean reward of one temperature-1 sample per pair"),
    _m("env/time", "steps", "sum", "rollout",
       "interactive tasks: seconds spent inside the environments (reset and steps) while the "
       "step's episodes were sampled (part of time/sample)"),
    # issue 21, companion 4: rlm_grpo's tree step (COMPANIONS.md §4)
    _m("reward/precision", "sequences", "seq_mean", "rollout",
       "rlm_grpo (char_f1): mean character precision of the roots' final answers (0 without "
       "FINAL)"),
    _m("reward/recall", "sequences", "seq_mean", "rollout",
       "rlm_grpo (char_f1): mean character recall of the gold sentences (0 without FINAL)"),
    _m("rlm/n_pred_mean", "sequences", "seq_mean", "rollout",
       "rlm_grpo (char_f1): mean number of predicted strings per final answer"),
    _m("rlm/children_mean", "sequences", "seq_mean", "rollout",
       "rlm_grpo: children spawned per tree (rlm_query* calls that ran)"),
    _m("rlm/segments", "steps", "sum", "rollout",
       "rlm_grpo: generated turns (segments) of the step's trees, root and child"),
    _m("rlm/root_segments", "steps", "sum", "rollout", "rlm_grpo: root turns of the step"),
    _m("rlm/child_segments", "steps", "sum", "rollout", "rlm_grpo: child turns of the step"),
    _m("rlm/segment_loss_mean", "sequences", "seq_mean", "first_pass",
       "rlm_grpo: mean over the trained segments (weight > 0) of the segment loss L_s (token "
       "mean of −[min(ρA, clip(ρ)A) − β·k3])"),
    _m("rlm/root_turns_mean", "sequences", "seq_mean", "rollout",
       "rlm_grpo: root turns per tree"),
    _m("rlm/final_rate", "sequences", "frac", "rollout",
       "rlm_grpo: trees whose root ended with FINAL"),
    _m("rlm/repl_error_rate", "steps", "frac", "rollout",
       "rlm_grpo: REPL blocks (root and child) that raised, timed out or crashed, over all "
       "blocks run"),
    _m("rlm/repl_timeouts", "steps", "sum", "rollout",
       "rlm_grpo: REPL blocks killed by --repl_timeout (the session was reset)"),
    _m("rlm/budget_refusals", "steps", "sum", "rollout",
       "rlm_grpo: rlm_query* calls refused with BudgetError (--max_children, "
       "--max_children_per_call)"),
    _m("rlm/context_limit_rate", "sequences", "frac", "rollout",
       "rlm_grpo: trees whose root stopped because its conversation passed "
       "--max_prompt_tokens"),
    _m("eval/reward", "prompts", "seq_mean", "eval",
       "rlm_grpo: mean root reward of one greedy tree per eval example"),
    _m("eval/final_rate", "prompts", "frac", "eval",
       "rlm_grpo: eval trees whose root ended with FINAL"),
    _m("eval/children_mean", "prompts", "seq_mean", "eval",
       "rlm_grpo: children per eval tree"),
)

SCHEMA: dict[str, MetricDef] = {m.name: m for m in METRICS}


_FAMILIES = tuple(m.name[:-1] for m in METRICS if m.name.endswith("*"))


def metric_def(name: str) -> MetricDef:
    """The schema entry of ``name`` (a ``*`` entry covers a family); KeyError if none."""
    if name in SCHEMA:
        return SCHEMA[name]
    for m in METRICS:
        if m.name.endswith("*") and name.startswith(m.name[:-1]):
            return m
    raise KeyError(name)


def is_registered(name: str) -> bool:
    """Whether ``name`` is in the schema; a name ending in ``*`` there covers a family."""
    return name in SCHEMA or name.startswith(_FAMILIES)


def unregistered(names: object) -> list[str]:
    """Names not in the schema (a test keeps this empty for everything a run writes)."""
    return sorted(n for n in names if not is_registered(n) and n != "step")  # type: ignore[attr-defined]


def render_markdown() -> str:
    """The schema as the Markdown table of ``docs/metrics.md`` (a test keeps them in sync)."""
    lines = [
        "# Metric schema",
        "",
        "Generated from `src/rlscope/metrics/schema.py` by "
        "`python -m rlscope.metrics.schema > docs/metrics.md`; do not edit by hand.",
        "",
        "Population: what the metric is computed over. Reduction: how it is reduced "
        "(`token_mean` = mask-weighted mean over valid tokens, `seq_mean` = mean over rows, "
        "`frac` = fraction, `value` = one number per step). Timing: `rollout` = on the batch "
        "before any update, `first_pass` / `last_pass` = during the update, `update` = the "
        "optimizer steps, `step` = the whole step, `eval` = held-out evaluation.",
        "",
        "| name | population | reduction | timing | description |",
        "| --- | --- | --- | --- | --- |",
    ]
    lines += [f"| `{m.name}` | {m.population} | {m.reduction} | {m.timing} | {m.description} |"
              for m in METRICS]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import sys

    sys.stdout.write(render_markdown())
