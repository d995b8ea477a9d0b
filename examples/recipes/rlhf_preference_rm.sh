#!/usr/bin/env bash
# RLHF against a learned reward model on preference_rm (docs/recipes.md, "RLHF against a
# learned reward model"): an SFT warm start on generated answers, a reward model trained with
# the Bradley–Terry loss on generated preference pairs, then PPO against it with the adaptive
# KL to the warm-start model, and the same PPO with the KL term too small (reward-model
# over-optimisation: eval/rm_score up, eval/true_reward down). Settings: common.sh; the
# qwen2-100m learning rates are untested guesses.
source "$(dirname "$0")/common.sh"
SFT_STEPS=${SFT_STEPS:-$(by_size 600 500)}
SFT_LR=${SFT_LR:-$(by_size 3e-3 1e-4)}
RM_STEPS=${RM_STEPS:-300}
RM_LR=${RM_LR:-$(by_size 1e-3 1e-5)}
RL_STEPS=${RL_STEPS:-150}
RL_LR=${RL_LR:-$(by_size 3e-4 1e-6)}
NAME=pref_${SIZE}_s$SEED
rlscope sft --task preference_rm "${MODEL[@]}" --num_steps "$SFT_STEPS" --batch_size 64 \
    --lr "$SFT_LR" --eval_every 0 "${COMMON[@]}" --name "sft_$NAME"
rlscope rm --task preference_rm "${MODEL[@]}" --num_steps "$RM_STEPS" --batch_size 64 \
    --lr "$RM_LR" --eval_every 100 "${COMMON[@]}" --name "rm_$NAME"
for arm in kl small_kl; do
  KL=(); [ "$arm" = small_kl ] && KL=(--kl_control fixed --kl_coef 0.001)
  rlscope train --task preference_rm --method ppo "${MODEL[@]}" --init "$RUNS/sft_$NAME" \
      --rm_path "$RUNS/rm_$NAME" "${KL[@]}" --num_steps "$RL_STEPS" --batch_size 64 \
      --lr "$RL_LR" --eval_every 25 "${COMMON[@]}" --name "ppo_${NAME}_$arm"
done
