"""The preset registry: `METHODS`, one literal dict of `MethodSpec`s (presets are data).

``canonical_method_name`` looks a preset up case-insensitively (CamelCase aliases such as
``DrGRPO`` work). Command-line overrides are applied by `rlscope.methods.resolve`.
"""

from __future__ import annotations

from rlscope.methods.pedagogy import TwoViewRule
from rlscope.methods.spec import (
    AdvantageConfig,
    CorrectionConfig,
    GateConfig,
    KLConfig,
    MethodSpec,
    ObjectiveConfig,
    OverlongConfig,
    ValueConfig,
)

_GRPO_KL = KLConfig(coef=0.04, estimator="k3", target="behaviour", place="loss")
_OPD = ("token_labels", "on_policy", "clean_rewards", "no_kl")
"""What every OPD preset requires (COMPANIONS.md §0: no delay, replay or reward noise)."""
_TWO_VIEW = ("on_policy", "clean_rewards", "no_kl")
"""What the ``two_view`` presets declare (their step refuses delay, replay and reward noise)."""

METHODS: dict[str, MethodSpec] = {
    "ce": MethodSpec(
        description="Cross-entropy on the ground truth: a supervised upper bound.",
        source="supervised learning", regime="tasks with ground-truth labels",
        advantage=AdvantageConfig("zero"), objective=ObjectiveConfig("ce_oracle")),
    "reinforce": MethodSpec(
        description="REINFORCE with the expected-reward baseline.",
        source="Williams 1992", regime="on-policy",
        advantage=AdvantageConfig("expected"), objective=ObjectiveConfig("score")),
    "pg": MethodSpec(
        description="Policy gradient with a capped per-token importance weight.",
        source="importance-weighted PG", regime="on- or slightly off-policy",
        advantage=AdvantageConfig("expected"), objective=ObjectiveConfig("is_capped", cap=10.0)),
    "ppo": MethodSpec(
        description="PPO with a value head, GAE, value clipping, adaptive KL in the reward.",
        source="Schulman et al. 1707.06347; Ziegler et al. 1909.08593",
        regime="any task; needs a critic",
        advantage=AdvantageConfig("gae", gamma=1.0, lam=0.95),
        objective=ObjectiveConfig("ppo_clip", clip_low=0.2, clip_high=0.2),
        kl=KLConfig(coef=0.2, estimator="k1", target="ref", place="reward", control="adaptive"),
        value=ValueConfig(coef=0.1, clip=0.2)),
    "grpo": MethodSpec(
        description="Group z-scored advantages, PPO clip, k3 KL to the behaviour policy.",
        source="Shao et al. 2402.03300", regime="grouped sampling, group_size > 1",
        advantage=AdvantageConfig("group_zscore"), objective=ObjectiveConfig("ppo_clip"),
        kl=_GRPO_KL, selection="mixed_groups", grouped=True),
    "grpo_tis": MethodSpec(
        description="GRPO × truncated token importance weight min(π_learner/π_sampler, 2).",
        source="TIS (Yao et al. blog 2025); verl rollout_corr; TRL",
        regime="a sampler distinct from the learner (inference engine, low precision, "
        "staleness); grouped sampling; equals grpo when the learner samples",
        advantage=AdvantageConfig("group_zscore"), objective=ObjectiveConfig("ppo_clip"),
        kl=_GRPO_KL, selection="mixed_groups", grouped=True,
        correction=CorrectionConfig("token_truncate", cap=2.0)),
    "grpo_mis": MethodSpec(
        description="GRPO × sequence ratio ρ_seq where ρ_seq <= 3, rows above dropped (MIS).",
        source="TRL default sequence_mask; Ling Team 2510.18855",
        regime="a sampler distinct from the learner (inference engine, low precision, "
        "staleness); grouped sampling; equals grpo when the learner samples",
        advantage=AdvantageConfig("group_zscore"), objective=ObjectiveConfig("ppo_clip"),
        kl=_GRPO_KL, selection="mixed_groups", grouped=True,
        correction=CorrectionConfig("sequence_mask", band_low=0.0, band_high=3.0,
                                    keep_ratio=True)),
    "icepop": MethodSpec(
        description="GRPO × token ratio ρ where 0.5 <= ρ <= 5, tokens outside dropped (IcePop).",
        source="Ling Team 2510.18855 (Ring-1T); band from TRL and prime-rl",
        regime="a sampler distinct from the learner (inference engine, low precision, "
        "staleness); grouped sampling; equals grpo when the learner samples",
        advantage=AdvantageConfig("group_zscore"), objective=ObjectiveConfig("ppo_clip"),
        kl=_GRPO_KL, selection="mixed_groups", grouped=True,
        correction=CorrectionConfig("token_mask", band_low=0.5, band_high=5.0,
                                    keep_ratio=True)),
    "dr_grpo": MethodSpec(
        description="GRPO without std normalisation, sequence-mean of token sums.",
        source="Liu et al. 2503.20783", regime="grouped sampling, group_size > 1",
        advantage=AdvantageConfig("group_center"), objective=ObjectiveConfig("ppo_clip"),
        agg="seq_mean_token_sum", kl=_GRPO_KL, selection="mixed_groups", grouped=True),
    "dapo": MethodSpec(
        description="Clip-higher, token-mean loss, mixed groups, no KL, overlong shaping.",
        source="Yu et al. 2503.14476", regime="grouped sampling; no KL term",
        advantage=AdvantageConfig("group_zscore"),
        objective=ObjectiveConfig("ppo_clip", clip_low=0.2, clip_high=0.28),
        selection="mixed_groups", overlong=OverlongConfig("penalty"), grouped=True,
        requires=("no_kl",)),
    "rloo": MethodSpec(
        description="Leave-one-out baseline with the PPO clip.",
        source="Ahmadian et al. 2402.14740", regime="grouped sampling, group_size > 1",
        advantage=AdvantageConfig("rloo"), objective=ObjectiveConfig("ppo_clip"),
        selection="mixed_groups", grouped=True),
    "dg": MethodSpec(
        description="Delightful policy gradient: advantage × sigmoid(advantage × surprisal).",
        source="delight-gradient sandbox", regime="on-policy; any task",
        advantage=AdvantageConfig("expected"), gate=GateConfig("delight", eta=1.0),
        objective=ObjectiveConfig("score")),
    "kondo": MethodSpec(
        description="DG on the samples that Kondo screening keeps by their delight.",
        source="delight-gradient sandbox (Kondo screening)",
        regime="ungrouped batches (group_size 1); 0 < keep_ratio <= 1",
        advantage=AdvantageConfig("expected"), gate=GateConfig("delight", eta=1.0),
        objective=ObjectiveConfig("score"), selection="kondo", keep_ratio=0.5),
    "traj_pg": MethodSpec(
        description="Policy gradient with a capped sequence-level importance weight.",
        source="importance-weighted PG", regime="on- or slightly off-policy",
        advantage=AdvantageConfig("expected"),
        objective=ObjectiveConfig("traj_is_capped", cap=10.0)),
    "gspo": MethodSpec(
        description="Group z-scores with one clipped ratio per sequence (geometric mean).",
        source="Zheng et al. 2507.18071", regime="grouped sampling, group_size > 1",
        advantage=AdvantageConfig("group_zscore"),
        objective=ObjectiveConfig("gspo", clip_low=3e-4, clip_high=4e-4),
        agg="seq_mean_token_mean", selection="mixed_groups", grouped=True),
    "cispo": MethodSpec(
        description="Clipped importance weights as coefficients; no token's gradient is zeroed.",
        source="MiniMax-M1 2506.13585", regime="grouped sampling, group_size > 1",
        advantage=AdvantageConfig("group_zscore"), objective=ObjectiveConfig("cispo"),
        selection="mixed_groups", grouped=True),
    "sapo": MethodSpec(
        description="Soft, sigmoid-gated trust region instead of a hard clip.",
        source="SAPO (soft adaptive policy optimisation)", regime="grouped sampling",
        advantage=AdvantageConfig("group_zscore"), objective=ObjectiveConfig("sapo"),
        selection="mixed_groups", grouped=True),
    "reinforce_pp": MethodSpec(
        description="REINFORCE++: group-mean baseline, batch-whitened returns, PPO clip.",
        source="Hu 2501.03262", regime="grouped sampling",
        advantage=AdvantageConfig("reinforce_pp_baseline"), objective=ObjectiveConfig("ppo_clip"),
        selection="mixed_groups", grouped=True),
    "replay_dg": MethodSpec(
        description="DG trained on batches drawn from a replay buffer.",
        source="delight-gradient sandbox", regime="needs a replay buffer",
        advantage=AdvantageConfig("expected"), gate=GateConfig("delight"),
        objective=ObjectiveConfig("score"), requires=("replay",)),
    "fresh_dg": MethodSpec(
        description="DG whose weights decay with the batch's age.",
        source="delight-gradient sandbox", regime="needs staleness (delay or replay)",
        advantage=AdvantageConfig("expected"), gate=GateConfig("freshness"),
        objective=ObjectiveConfig("score"), requires=("staleness",)),
    "dg_entropy_guard": MethodSpec(
        description="DG that damps positive updates on already-likely tokens.",
        source="delight-gradient sandbox", regime="any task",
        advantage=AdvantageConfig("expected"), gate=GateConfig("entropy_guard"),
        objective=ObjectiveConfig("score")),
    "uncertainty_dg": MethodSpec(
        description="DG whose gate is shifted down by the reward's spread.",
        source="delight-gradient sandbox", regime="noisy rewards",
        advantage=AdvantageConfig("expected"), gate=GateConfig("uncertainty_shift"),
        objective=ObjectiveConfig("score")),
    "filtered_dg": MethodSpec(
        description="DG that drops samples whose reward spread exceeds a threshold.",
        source="delight-gradient sandbox", regime="noisy rewards",
        advantage=AdvantageConfig("expected"), gate=GateConfig("uncertainty_filter"),
        objective=ObjectiveConfig("score")),
    "reward_variance_dg": MethodSpec(
        description="DG with advantages shrunk by the reward's spread.",
        source="delight-gradient sandbox", regime="noisy rewards",
        advantage=AdvantageConfig("expected"), gate=GateConfig("uncertainty_shrink"),
        objective=ObjectiveConfig("score")),
    "dg_token": MethodSpec(
        description="DG with token-level return-to-go credit.",
        source="delight-gradient sandbox",
        regime="token tasks with clean, non-binary, decomposable rewards",
        advantage=AdvantageConfig("rtg"), gate=GateConfig("delight"),
        objective=ObjectiveConfig("score"), requires=("token_rewards",)),
    "aspo": MethodSpec(
        description="Asymmetric importance weights: μ/π for gains, π/μ for losses.",
        source="ASPO", regime="any task; reduces to REINFORCE on-policy",
        advantage=AdvantageConfig("expected"),
        objective=ObjectiveConfig("aspo", clip_low=0.2, clip_high=0.28)),
    "r2vpo": MethodSpec(
        description="Ratio-variance-penalised policy gradient, differentiated through ρ.",
        source="R2VPO", regime="any task; reduces to REINFORCE on-policy",
        advantage=AdvantageConfig("expected"), objective=ObjectiveConfig("r2vpo")),
    "tempo": MethodSpec(
        description="Prefix-tree values within a group as token-level credit.",
        source="TEMPO", regime="grouped sampling",
        advantage=AdvantageConfig("tempo"), objective=ObjectiveConfig("is_capped", cap=10.0),
        selection="mixed_groups", grouped=True),
    "remax": MethodSpec(
        description="REINFORCE with the reward of the prompt's greedy rollout as baseline.",
        source="ReMax, Li et al. 2310.10505", regime="any task; one extra greedy decode per "
        "prompt",
        advantage=AdvantageConfig("remax"), objective=ObjectiveConfig("score")),
    "maxrl": MethodSpec(
        description="Group advantages normalised by the group's mean reward.",
        source="MaxRL", regime="binary rewards with groups, no reward noise",
        advantage=AdvantageConfig("maxrl"), objective=ObjectiveConfig("is_capped", cap=10.0),
        selection="mixed_groups", grouped=True, requires=("binary_rewards", "clean_rewards")),
    "log_growth": MethodSpec(
        description="Kelly-style log-growth weights: successes weighted by 1/π(a).",
        source="log-growth policy gradient", regime="binary bandits, no KL, no reward noise",
        advantage=AdvantageConfig("expected"), objective=ObjectiveConfig("log_growth"),
        requires=("bandit", "binary_rewards", "clean_rewards", "no_kl")),
    "pmd_mean": MethodSpec(
        description="Policy mirror descent: regress τ·log-ratio onto the reward's surplus.",
        source="PMD-mean", regime="any task; off-policy capable",
        advantage=AdvantageConfig("zero"), objective=ObjectiveConfig("pmd_mean"),
        agg="seq_mean_token_sum"),
    "tpo": MethodSpec(
        description="Fit a soft target over the group: behaviour anchor tilted by skill.",
        source="Target Policy Optimisation (TPO sandbox)",
        regime="grouped sampling, group_size > 1",
        advantage=AdvantageConfig("group_zscore"), objective=ObjectiveConfig("tpo"),
        agg="seq_mean_token_sum", selection="mixed_groups", grouped=True),
    "tpo_no_anchor": MethodSpec(
        description="TPO ablation: the target is softmax(skill/η), no behaviour anchor.",
        source="Target Policy Optimisation (TPO sandbox)",
        regime="grouped sampling, group_size > 1",
        advantage=AdvantageConfig("group_zscore"), objective=ObjectiveConfig("tpo_no_anchor"),
        agg="seq_mean_token_sum", selection="mixed_groups", grouped=True),
    "group_pg": MethodSpec(
        description="TPO's skill weights as a plain group policy gradient (no soft target).",
        source="Target Policy Optimisation (TPO sandbox)",
        regime="grouped sampling, group_size > 1",
        advantage=AdvantageConfig("group_zscore"), objective=ObjectiveConfig("group_pg"),
        agg="seq_mean_token_sum", selection="mixed_groups", grouped=True),
    "tpo_full_action": MethodSpec(
        description="TPO over every action of a bandit: soft target from one sampled class.",
        source="Target Policy Optimisation (TPO sandbox)",
        regime="bandit tasks, on-policy, one inner epoch, clean rewards",
        advantage=AdvantageConfig("zero"), objective=ObjectiveConfig("tpo_full_action"),
        requires=("bandit", "on_policy", "single_epoch", "clean_rewards")),
    "tpo_token": MethodSpec(
        description="TPO per prefix over K next-token candidates with dense rewards.",
        source="Target Policy Optimisation (TPO sandbox)",
        regime="token tasks with clean, decomposable rewards; K = group_size > 1; on-policy",
        advantage=AdvantageConfig("zero"), objective=ObjectiveConfig("tpo_token"),
        grouped=True, requires=("token_rewards", "on_policy")),
    "grpo_token": MethodSpec(
        description="GRPO per prefix over K next-token candidates with dense rewards.",
        source="TPO sandbox (the GRPO control of tpo_token)",
        regime="token tasks with clean, decomposable rewards; K = group_size > 1; on-policy",
        advantage=AdvantageConfig("zero"),
        objective=ObjectiveConfig("grpo_token", clip_low=0.2, clip_high=0.2, candidate_kl=0.04),
        grouped=True, requires=("token_rewards", "on_policy")),
    "self_distill_dg": MethodSpec(
        description="DG on a token oracle advantage plus gated label cross-entropy.",
        source="delight-gradient sandbox", regime="sequence tasks with per-token labels",
        advantage=AdvantageConfig("oracle_token"), gate=GateConfig("delight"),
        objective=ObjectiveConfig("self_distill"), requires=("token_labels",)),
    "scope_lite": MethodSpec(
        description="DG plus label cross-entropy from each failure's first wrong token on.",
        source="delight-gradient sandbox (SCOPE, lite)",
        regime="sequence tasks with per-token labels",
        advantage=AdvantageConfig("expected"), gate=GateConfig("delight"),
        objective=ObjectiveConfig("scope_lite"), requires=("token_labels",)),
    "gspo_token": MethodSpec(
        description="GSPO's sequence ratio as each token's value, its gradient per token.",
        source="Zheng et al. 2507.18071; TRL gspo_token",
        regime="grouped sampling; differs from gspo only with token-level advantages",
        advantage=AdvantageConfig("group_zscore"),
        objective=ObjectiveConfig("gspo_token", clip_low=3e-4, clip_high=4e-4),
        agg="seq_mean_token_mean", selection="mixed_groups", grouped=True),
    "gmpo": MethodSpec(
        description="Geometric mean of token ratios per sequence, clipped in log space ±0.4.",
        source="Zhao et al. 2507.20673; TRL GMPOTrainer; verl geo_mean",
        regime="grouped sampling, sequence-level advantages; off-policy within the region",
        advantage=AdvantageConfig("group_zscore"),
        objective=ObjectiveConfig("gmpo", clip_low=0.4, clip_high=0.4),
        agg="seq_mean_token_sum", selection="mixed_groups", grouped=True),
    "intellect2": MethodSpec(
        description="GRPO with two-sided clipping (INTELLECT-2's δ = dual clip 4), KL to ref.",
        source="INTELLECT-2 2505.07291; TRL delta",
        regime="grouped sampling (the paper uses group size 16)",
        advantage=AdvantageConfig("group_zscore"),
        objective=ObjectiveConfig("ppo_clip", clip_low=0.2, clip_high=0.2, dual_clip=4.0),
        kl=KLConfig(coef=0.001, estimator="k3", target="ref", place="loss"),
        selection="mixed_groups", grouped=True),
    "dppo_tv": MethodSpec(
        description="Policy gradient masked where |π − μ| of the token leaves δ 0.15 (TV).",
        source="Qi et al. 2602.04879; sail-sg/Stable-RL",
        regime="grouped sampling; off-policy capable",
        advantage=AdvantageConfig("group_center"),
        objective=ObjectiveConfig("dppo_tv", dppo_delta_low=0.15, dppo_delta_high=0.15,
                                  cap=10.0),
        agg="seq_mean_token_sum_norm", selection="mixed_groups", grouped=True),
    "dppo_kl": MethodSpec(
        description="Policy gradient masked where the token's binary KL leaves δ 0.05.",
        source="Qi et al. 2602.04879; sail-sg/Stable-RL",
        regime="grouped sampling; off-policy capable",
        advantage=AdvantageConfig("group_center"),
        objective=ObjectiveConfig("dppo_kl", dppo_delta_low=0.05, dppo_delta_high=0.05,
                                  cap=10.0),
        agg="seq_mean_token_sum_norm", selection="mixed_groups", grouped=True),
    "clip_cov": MethodSpec(
        description="PPO clip 1/1 whose few high-covariance tokens (batch-wide) get no gradient.",
        source="Cui et al. 2505.22617; PRIME-RL/Entropy-Mechanism-of-RL; verl",
        regime="grouped sampling; needs r·N >= 1 tokens per batch to matter; no KL term",
        advantage=AdvantageConfig("group_zscore"),
        objective=ObjectiveConfig("clip_cov", clip_low=1.0, clip_high=1.0,
                                  clip_cov_ratio=2e-4, clip_cov_low=1.0, clip_cov_high=5.0),
        selection="mixed_groups", grouped=True, requires=("no_kl",)),
    "kl_cov": MethodSpec(
        description="Unclipped surrogate plus |log-ratio| on the batch's top-covariance tokens.",
        source="Cui et al. 2505.22617; PRIME-RL/Entropy-Mechanism-of-RL; verl",
        regime="grouped sampling; needs k_r·N >= 1 tokens per batch to matter; no KL term",
        advantage=AdvantageConfig("group_zscore"),
        objective=ObjectiveConfig("kl_cov", kl_cov_ratio=2e-3, kl_cov_coef=1.0),
        selection="mixed_groups", grouped=True, requires=("no_kl",)),
    "dapo_forking": MethodSpec(
        description="DAPO trained only on the batch's 20% highest-entropy (forking) tokens.",
        source="Wang et al. 2506.01939; TRL top_entropy_quantile",
        regime="grouped sampling; no KL term",
        advantage=AdvantageConfig("group_zscore"), gate=GateConfig("entropy_top",
                                                                   entropy_top_frac=0.2),
        objective=ObjectiveConfig("ppo_clip", clip_low=0.2, clip_high=0.28),
        selection="mixed_groups", overlong=OverlongConfig("penalty"), grouped=True,
        requires=("no_kl",)),
    "opo": MethodSpec(
        description="Score-function PG with OPO's length-weighted group baseline, exact "
        "on-policy.",
        source="Hao et al. 2505.23585; verl opo",
        regime="grouped sampling; exact on-policy (one inner epoch of one minibatch, no delay, "
        "no replay)",
        advantage=AdvantageConfig("opo"), objective=ObjectiveConfig("score"),
        selection="mixed_groups", grouped=True,
        requires=("on_policy", "single_epoch", "no_kl")),
    "gpg": MethodSpec(
        description="Score-function PG on group-centred rewards rescaled by α = B/(B − M) "
        "instead of filtering flat groups.",
        source="Chu et al. 2504.02546; AMAP-ML/GPG; verl gpg",
        regime="grouped sampling; on-policy, one inner epoch; selection none",
        advantage=AdvantageConfig("gpg"), objective=ObjectiveConfig("score"),
        selection="none", grouped=True, requires=("one_epoch", "no_selection", "no_kl")),
    "scalerl": MethodSpec(
        description="CISPO (ε_max 5) on batch-std-normalised centred rewards, prompt-mean "
        "loss, fp32 LM head.",
        source="Khatri et al. 2510.13786; TRL ScaleRL notes (ε_max unverified)",
        regime="grouped sampling (group size 16 in the paper); off-policy capable",
        advantage=AdvantageConfig("group_center_batchstd"),
        objective=ObjectiveConfig("cispo", cispo_max=5.0), agg="prompt_mean",
        selection="mixed_groups", grouped=True, fp32_head=True, requires=("no_kl",)),
    "vapo": MethodSpec(
        description="PPO clip-higher with length-adaptive decoupled GAE, a pre-trained critic "
        "and an LM loss on successes.",
        source="Yue et al. 2504.05118 (ε, μ, pre-training length unverified)",
        regime="grouped sampling; needs a critic (value head) pre-trained for "
        "critic_pretrain_steps >= 1",
        advantage=AdvantageConfig("gae_decoupled", gamma=1.0, lam=0.95, length_alpha=0.05,
                                  lam_critic=1.0),
        objective=ObjectiveConfig("ppo_clip", clip_low=0.2, clip_high=0.28),
        value=ValueConfig(coef=0.1, clip=0.2, pretrain_steps=10), pos_nll_coef=0.1,
        selection="mixed_groups", grouped=True, requires=("no_kl", "critic_pretrain")),
    # issue 19: DeepSeek-V3.2 masking and the distillation presets (METHODS_2026.md §3)
    "dsv32": MethodSpec(
        description="GRPO, rows with A < 0 and mean log(π_sampler/π) > 0.5 dropped, unbiased "
        "ρ·k3 KL to the reference (DeepSeek-V3.2).",
        source="DeepSeek-V3.2 2512.02556; TRL (δ 0.5 and β 0.001 are TRL's: the paper gives "
        "neither)",
        regime="a sampler distinct from the learner (inference engine, low precision, "
        "staleness); grouped sampling; needs the reference policy; equals grpo with the "
        "is_corrected KL when the learner samples",
        advantage=AdvantageConfig("group_zscore"), gate=GateConfig("opsm", opsm_delta=0.5),
        objective=ObjectiveConfig("ppo_clip"),
        kl=KLConfig(coef=0.001, estimator="is_corrected", target="ref", place="loss"),
        selection="mixed_groups", grouped=True),
    "opd": MethodSpec(
        description="On-policy distillation: per-token advantage −(ℓ_μ − ℓ_teacher), the "
        "sampled reverse KL to a frozen teacher, capped importance weight.",
        source="Thinking Machines \"On-Policy Distillation\" (2025); tinker-cookbook (which "
        "uses the uncapped ratio and sums tokens; cap 10 and token_mean here)",
        regime="a frozen teacher of the student's tokenizer scoring the student's samples "
        "(--teacher_path); the task reward only with --teacher_env_coef",
        advantage=AdvantageConfig("teacher_rkl"), objective=ObjectiveConfig("is_capped", cap=10.0)),
    "gkd": MethodSpec(
        description="Generalised knowledge distillation: JSD_β between a frozen teacher's and "
        "the student's full next-token distributions on the student's samples.",
        source="Agarwal et al. 2306.13649; TRL GKDTrainer (λ = 1: student samples only)",
        regime="a frozen teacher with the student's vocabulary and full logits "
        "(--teacher_path); the task reward is only logged",
        advantage=AdvantageConfig("zero"),
        objective=ObjectiveConfig("gkd_jsd", gkd_beta=0.5, gkd_temperature=1.0,
                                  gkd_lambda=1.0)),
    # issue 21, companion 1: OPD from a built-in teacher over the targets (COMPANIONS.md §1)
    "opd_reverse_kl": MethodSpec(
        description="Exact full-vocabulary reverse KL(π‖π_T) to a built-in teacher at every "
        "visited student prefix.",
        source="rl-experiments opd_sandbox (COMPANIONS.md §1)",
        regime="a task with per-token targets and a built-in teacher (--teacher oracle|soft); "
        "on-policy, clean rewards (the reward is only logged)",
        advantage=AdvantageConfig("zero"), objective=ObjectiveConfig("opd_reverse_kl"),
        requires=_OPD),
    "opd_topk_reverse_kl": MethodSpec(
        description="Reverse KL on a top-k support (student, teacher or both), not "
        "renormalised; optional full-vocabulary warm-up.",
        source="rl-experiments opd_sandbox (COMPANIONS.md §1)",
        regime="a task with per-token targets and a built-in teacher; 1 <= opd_top_k <= "
        "vocabulary; on-policy, clean rewards",
        advantage=AdvantageConfig("zero"),
        objective=ObjectiveConfig("opd_topk_reverse_kl", opd_top_k=2, opd_support="student"),
        requires=_OPD),
    "opd_pg": MethodSpec(
        description="PPO clip 0.2 on the sampled token's log-ratio to a built-in teacher "
        "(per-token REINFORCE, γ = 0).",
        source="rl-experiments opd_sandbox (COMPANIONS.md §1)",
        regime="a task with per-token targets and a built-in teacher; on-policy, clean "
        "rewards",
        advantage=AdvantageConfig("teacher_logratio"),
        objective=ObjectiveConfig("ppo_clip", clip_low=0.2, clip_high=0.2), requires=_OPD),
    # issue 21: the learnability companion (COMPANIONS.md §5)
    "traj_group_pg": MethodSpec(
        description="Trajectory policy gradient with a within-prompt group baseline (mean; "
        "--advantage group_zscore for GRPO's std scaling), token sums per sequence, no clip, "
        "no KL.",
        source="learnability sandbox (rl-experiments companions)",
        regime="grouped sampling, group_size > 1; on-policy, clean rewards (unique_path: lr "
        "1e-2, 64 groups of 8)",
        advantage=AdvantageConfig("group_center"), objective=ObjectiveConfig("score"),
        agg="seq_mean_token_sum", selection="none", grouped=True,
        requires=("on_policy", "clean_rewards", "no_kl")),
    # issue 21: the VPO companion (COMPANIONS.md §2), trained by the ``set`` step
    "vpo_grpo": MethodSpec(
        description="Set GRPO: score a set of M candidates by the mean over N_w Dirichlet(1, 1) "
        "preferences of its best candidate, group z-score over the K sets, ppo_clip 0.2 per "
        "candidate.",
        source="Bahlous-Boldi et al., Vector Policy Optimization (rl-experiments vpo_sandbox)",
        regime="vector_pareto, num_candidates > 1; on-policy, clean rewards (defaults: 500 "
        "steps, batch 128, K 8, inner_epochs 4, lr 3e-3)",
        advantage=AdvantageConfig("group_zscore"),
        objective=ObjectiveConfig("ppo_clip", clip_low=0.2, clip_high=0.2),
        grouped=True, step="set"),
    "scalar_grpo": MethodSpec(
        description="Set GRPO baseline with one candidate per set, scored by the gold "
        "scalarisation w*ᵀ r (w* = (0.5, 0.5)).",
        source="Bahlous-Boldi et al., Vector Policy Optimization (rl-experiments vpo_sandbox)",
        regime="vector_pareto, num_candidates = 1; on-policy, clean rewards",
        advantage=AdvantageConfig("group_zscore"),
        objective=ObjectiveConfig("ppo_clip", clip_low=0.2, clip_high=0.2),
        grouped=True, step="set"),
    "multi_rlvr": MethodSpec(
        description="Set GRPO baseline scoring a set of M candidates by its best gold "
        "scalarisation max_m w*ᵀ r_m.",
        source="Bahlous-Boldi et al., Vector Policy Optimization (rl-experiments vpo_sandbox)",
        regime="vector_pareto, num_candidates > 1; on-policy, clean rewards",
        advantage=AdvantageConfig("group_zscore"),
        objective=ObjectiveConfig("ppo_clip", clip_low=0.2, clip_high=0.2),
        grouped=True, step="set"),
    # issue 21: the pedagogy companion (COMPANIONS.md §3), the two_view step
    "pedagogical_rl": MethodSpec(
        description="A teacher that sees the answer trains by GRPO on R·exp(−λ·spike), its "
        "samples scored by the frozen current student; the student imitates fresh teacher "
        "samples through the gate σ(κ(ℓ_t − γ)).",
        source="Ziems, \"Pedagogical RL\" (rl-experiments pedagogy_sandbox; COMPANIONS.md §3)",
        regime="task teacher_student; group_size > 1 dividing the batch; on-policy, clean "
        "rewards, no KL",
        advantage=AdvantageConfig("group_zscore"),
        objective=ObjectiveConfig("ppo_clip", clip_low=0.2, clip_high=0.2), step="two_view",
        two_view=TwoViewRule("reward_times_learnability", "gated_imitation"), requires=_TWO_VIEW),
    "teacher_rl": MethodSpec(
        description="A teacher that sees the answer trains by GRPO on R − λ·mean_t(student "
        "surprisal); the student imitates fresh teacher samples by plain SFT.",
        source="Ziems, \"Pedagogical RL\" (the surprisal-reward baseline; COMPANIONS.md §3)",
        regime="task teacher_student; group_size > 1 dividing the batch; on-policy, clean "
        "rewards, no KL",
        advantage=AdvantageConfig("group_zscore"),
        objective=ObjectiveConfig("ppo_clip", clip_low=0.2, clip_high=0.2), step="two_view",
        two_view=TwoViewRule("reward_minus_surprisal", "sft"), requires=_TWO_VIEW),
    "student_grpo": MethodSpec(
        description="No teacher: GRPO on the student's own rollouts of its view (the "
        "baseline of the pedagogy companion).",
        source="Ziems, \"Pedagogical RL\" (baseline; COMPANIONS.md §3)",
        regime="task teacher_student; group_size > 1 dividing the batch; on-policy, clean "
        "rewards, no KL",
        advantage=AdvantageConfig("group_zscore"),
        objective=ObjectiveConfig("ppo_clip", clip_low=0.2, clip_high=0.2), step="two_view",
        two_view=TwoViewRule("none", "student_grpo"), requires=_TWO_VIEW),
    # issue 21: the RLM companion (COMPANIONS.md §4), trained by the tree step
    "rlm_grpo": MethodSpec(
        description="GRPO over trees of REPL rollouts: each tree's root advantage (group "
        "z-score of the root rewards) on every root and child turn, weighted 1/n_root per root "
        "turn and 1/(k·n_j) per child turn; PPO clip and k3 KL to the reference per segment.",
        source="rlm_grpo (rl-experiments companions); GRPO 2402.03300",
        regime="rlm_papers on a Hugging Face model (LoRA); group_size > 1; on-policy (one "
        "AdamW step per inner epoch on freshly sampled trees); warm-start with rlscope sft",
        advantage=AdvantageConfig("group_zscore"),
        objective=ObjectiveConfig("ppo_clip", clip_low=0.2, clip_high=0.2),
        kl=KLConfig(coef=0.01, estimator="k3", target="ref", place="loss"),
        grouped=True, step="tree"),
}


def _key(name: str) -> str:
    return name.replace("_", "").replace("-", "").lower()


_LOOKUP = {_key(name): name for name in METHODS}


def canonical_method_name(name: str) -> str:
    """The registry key for ``name`` (case-insensitive, CamelCase aliases), or ValueError."""
    try:
        return _LOOKUP[_key(name)]
    except KeyError:
        raise ValueError(
            f"unknown method {name!r}; valid methods: {', '.join(METHODS)}") from None
