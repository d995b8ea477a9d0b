"""Advice in the source's terms: each finding's actions name the setting of the framework that
wrote the log (issue 16, "Advice in the source's terms").

Rules write their actions as templates with ``{setting}`` placeholders (``"lower the learning
rate ({lr})"``). `render_action` fills each placeholder with that framework's own name for the
setting: a verl config key, a TRL ``GRPOConfig``/``PPOConfig`` field, an OpenRLHF flag, a
tinker-cookbook ``rl.train.Config`` (or recipe CLI) field, or an rlscope flag. A setting the
framework does not have is dropped from the sentence (``" ({x})"``) or named in words, never
replaced by another framework's flag.

Names were looked up in the frameworks' sources and docs:

- verl: ``verl/trainer/config/ppo_trainer.yaml`` and the DAPO recipe
  (``recipe/dapo/*.sh``: ``algorithm.filter_groups.*``, ``reward_model.overlong_buffer.*``),
  ``algorithm.rollout_correction.*`` from the rollout-correction docs.
- TRL: ``trl/trainer/grpo_config.py`` (``epsilon_high``, ``scale_rewards``,
  ``mask_truncated_completions``, ``vllm_importance_sampling_correction``, ``num_iterations``)
  and the PPO trainer's ``PPOConfig`` (``kl_coef``, ``cliprange``, ``cliprange_value``,
  ``vf_coef``, ``num_ppo_epochs``, ``response_length``, ``missing_eos_penalty``);
  ``learning_rate`` and ``max_grad_norm`` come from transformers' ``TrainingArguments``.
- OpenRLHF: ``openrlhf/cli/train_ppo_ray.py`` argparse flags.
- tinker-cookbook: ``tinker_cookbook/rl/train.py`` (``Config``) and the recipes' CLI configs.
"""

from __future__ import annotations

import re

from rlscope.doctor.table import MetricTable

GENERIC: dict[str, str] = {
    "lr": "the learning rate", "entropy_coef": "an entropy bonus",
    "clip_high": "the upper clip bound", "clip": "the clip range",
    "adv_center": "centring without dividing by the group std",
    "adv_std_floor": "a floor on the group std", "adv_clip": "advantage clipping",
    "kl_coef": "the KL coefficient", "kl_target": "the adaptive KL target",
    "kl_horizon": "the KL controller horizon", "max_length": "the response length limit",
    "overlong_penalty": "an overlong penalty", "overlong_mask": "masking truncated samples",
    "sampling_mask": "replaying the sampler's kept set (or no top-k/top-p)",
    "is_correction": "an importance correction of the sampler/learner gap",
    "group_size": "the samples per prompt", "batch_size": "the batch size",
    "epochs": "the update epochs per batch", "critic_lr": "the critic's learning rate",
    "value_clip": "value clipping", "vf_coef": "the value-loss coefficient",
    "dynamic_sampling": "dynamic sampling of mixed groups", "grad_clip": "the gradient clip",
    "temperature": "the sampling temperature",
}
"""Each setting in words (used in the sentence when a framework has no such setting)."""

SETTINGS: dict[str, dict[str, str]] = {
    "rlscope": {
        "lr": "--lr", "entropy_coef": "--entropy_coef", "clip_high": "--clip_high",
        "clip": "--clip_low/--clip_high", "adv_center": "--advantage group_center",
        "adv_std_floor": "--adv_std_floor", "adv_clip": "--adv_clip", "kl_coef": "--kl_coef",
        "kl_target": "--kl_target", "kl_horizon": "--kl_horizon",
        "max_length": "--max_new_tokens", "overlong_penalty": "--overlong penalty",
        "overlong_mask": "--overlong mask", "sampling_mask": "--replay_sampling_mask",
        "is_correction": "--is_correction token_truncate", "group_size": "--group_size",
        "batch_size": "--batch_size", "epochs": "--inner_epochs", "critic_lr": "--vf_coef",
        "value_clip": "--value_clip", "vf_coef": "--vf_coef",
        "dynamic_sampling": "--fill_batch", "grad_clip": "--grad_clip",
        "temperature": "--temperature",
    },
    "verl": {
        "lr": "actor_rollout_ref.actor.optim.lr",
        "entropy_coef": "actor_rollout_ref.actor.entropy_coeff",
        "clip_high": "actor_rollout_ref.actor.clip_ratio_high",
        "clip": "actor_rollout_ref.actor.clip_ratio_low/clip_ratio_high",
        "adv_center": "algorithm.norm_adv_by_std_in_grpo=False",
        "kl_coef": "algorithm.kl_ctrl.kl_coef (KL in reward) or "
                   "actor_rollout_ref.actor.kl_loss_coef (KL loss)",
        "kl_target": "algorithm.kl_ctrl.type=adaptive with algorithm.kl_ctrl.target_kl",
        "kl_horizon": "algorithm.kl_ctrl.horizon",
        "max_length": "data.max_response_length",
        "overlong_penalty": "reward_model.overlong_buffer.enable=True",
        "sampling_mask": "actor_rollout_ref.rollout.top_p=1.0, top_k=-1",
        "is_correction": "algorithm.rollout_correction.rollout_is=token with "
                         "actor_rollout_ref.rollout.calculate_log_probs=True",
        "group_size": "actor_rollout_ref.rollout.n", "batch_size": "data.train_batch_size",
        "epochs": "actor_rollout_ref.actor.ppo_epochs", "critic_lr": "critic.optim.lr",
        "value_clip": "critic.cliprange_value",
        "dynamic_sampling": "algorithm.filter_groups.enable=True",
        "grad_clip": "actor_rollout_ref.actor.grad_clip",
        "temperature": "actor_rollout_ref.rollout.temperature",
    },
    "trl": {  # GRPOConfig (and RLOOConfig, which shares these names)
        "lr": "learning_rate", "clip_high": "epsilon_high", "clip": "epsilon",
        "adv_center": "scale_rewards=\"none\"", "kl_coef": "beta",
        "max_length": "max_completion_length", "overlong_mask": "mask_truncated_completions=True",
        "sampling_mask": "top_p=1.0, top_k=0",
        "is_correction": "vllm_importance_sampling_correction=True",
        "group_size": "num_generations",
        "batch_size": "per_device_train_batch_size × gradient_accumulation_steps",
        "epochs": "num_iterations", "grad_clip": "max_grad_norm",
        "temperature": "temperature",
    },
    "trl_ppo": {  # PPOConfig
        "lr": "learning_rate", "clip": "cliprange", "clip_high": "cliprange",
        "kl_coef": "kl_coef", "max_length": "response_length",
        "overlong_penalty": "missing_eos_penalty", "batch_size": "per_device_train_batch_size",
        "epochs": "num_ppo_epochs", "critic_lr": "learning_rate (shared with the policy)",
        "value_clip": "cliprange_value", "vf_coef": "vf_coef", "grad_clip": "max_grad_norm",
        "temperature": "temperature",
    },
    "openrlhf": {
        "lr": "--actor_learning_rate", "entropy_coef": "--entropy_loss_coef",
        "clip_high": "--eps_clip_low_high LOW HIGH", "clip": "--eps_clip",
        "adv_center": "--advantage_estimator dr_grpo", "kl_coef": "--init_kl_coef",
        "kl_target": "--kl_target", "kl_horizon": "--kl_horizon",
        "max_length": "--generate_max_len",
        "overlong_penalty": "--overlong_buffer_len with --overlong_penalty_factor",
        "sampling_mask": "--top_p 1.0", "group_size": "--n_samples_per_prompt",
        "batch_size": "--train_batch_size/--rollout_batch_size", "epochs": "--max_epochs",
        "critic_lr": "--critic_learning_rate", "value_clip": "--value_clip",
        "dynamic_sampling": "--dynamic_filtering", "grad_clip": "--max_norm",
        "temperature": "--temperature",
    },
    "tinker": {  # tinker_cookbook.rl.train.Config and the recipes' CLI configs
        "lr": "learning_rate", "kl_coef": "kl_penalty_coef", "max_length": "max_tokens",
        "clip_high": "loss_fn=\"ppo\" with loss_fn_config clip_high_threshold",
        "clip": "loss_fn=\"ppo\" with loss_fn_config clip_low_threshold/clip_high_threshold",
        "group_size": "group_size", "batch_size": "groups_per_batch",  # of the dataset builder
        "epochs": "num_substeps", "dynamic_sampling": "remove_constant_reward_groups=True",
        "temperature": "temperature",
    },
}

_PARENTHESISED = re.compile(r" \(\{(\w+)\}\)")
_INLINE = re.compile(r"\{(\w+)\}")
_PPO_MARKERS = ("objective/kl", "objective/scores", "ppo/", "policy/approxkl_avg",
                "loss/value_avg", "val/clipfrac_avg", "env/reward_mean")
_OPENRLHF_MARKERS = ("policy_loss", "kl", "reward", "response_length", "return",
                     "actor_lr", "critic_loss")


def framework_of(t: MetricTable) -> str:
    """Which framework wrote ``t``: rlscope for our run directories; else the importer's tag
    (``framework`` where the importer records one, then the format), else the foreign names'
    characteristic prefixes. ``trl_ppo`` for TRL's PPO trainer (its config differs from
    GRPO's). Falls back to ``rlscope`` (our names) for a plain CSV/JSONL in our schema."""
    tagged = getattr(t, "framework", None) or t.config.get("framework")
    # as the framework names them: without the train/ prefix of W&B and TensorBoard loggers
    foreign = [n.removeprefix("train/") for n in (list(t.original.values()) or t.names())]
    if t.fmt == "run":
        return "rlscope"
    fw = tagged if isinstance(tagged, str) and tagged else {
        "verl": "verl", "trl": "trl", "tinker": "tinker"}.get(t.fmt)
    if fw is None:
        from rlscope.doctor.naming import guess_framework  # torch-free

        fw = guess_framework(foreign)
    if fw is None and sum(n in _OPENRLHF_MARKERS for n in t.names()) >= 3:
        fw = "openrlhf"
    if fw == "trl" and any(n.startswith(_PPO_MARKERS) for n in foreign):
        return "trl_ppo"
    return fw if fw in SETTINGS else "rlscope"


def setting(framework: str, key: str) -> str | None:
    """The framework's name for a setting, or None when it has none."""
    if key not in GENERIC:
        raise ValueError(f"unknown setting {key!r}; expected one of {sorted(GENERIC)}")
    return SETTINGS.get(framework, {}).get(key)


def render_action(template: str, framework: str) -> str:
    """Fill ``{setting}`` placeholders with ``framework``'s names: ``" ({x})"`` becomes
    ``" (`name`)"`` or disappears; an inline ``{x}`` becomes ``name`` or the setting in words."""

    def paren(m: re.Match[str]) -> str:
        name = setting(framework, m.group(1))
        return f" (`{name}`)" if name else ""

    def inline(m: re.Match[str]) -> str:
        name = setting(framework, m.group(1))
        return f"`{name}`" if name else GENERIC[m.group(1)]

    return _INLINE.sub(inline, _PARENTHESISED.sub(paren, template))


def settings_named(template: str) -> tuple[str, ...]:
    """The setting keys a template refers to."""
    return tuple(_INLINE.findall(template))
