#!/usr/bin/env bash
# RLHF against a learned reward model on CPU (~4 minutes on 2 cores; docs/recipes.md,
# "RLHF against a learned reward model"):
#   1. a supervised warm start on generated answers,
#   2. a reward model trained with the Bradley–Terry loss on generated preference pairs,
#   3. PPO against the reward model with KL to the warm-start model,
#   4. the same with the KL term too small (reward-model over-optimisation).
#
#   bash examples/rlhf_preference_rm.sh [SEED]
#
# Compare eval/rm_score (the training reward) with eval/true_reward (the hidden preference)
# in runs/rlhf_ppo_kl_s$SEED/eval.jsonl and runs/rlhf_ppo_small_kl_s$SEED/eval.jsonl.
set -euo pipefail
SEED="${1:-0}"
COMMON=(--task preference_rm --seed "$SEED" --device cpu --threads 1)
EVAL=(--eval_batches 2 --eval_batch_size 100)

rlscope sft "${COMMON[@]}" "${EVAL[@]}" --num_steps 600 --batch_size 64 --lr 3e-3 \
    --name "rlhf_sft_s$SEED"
rlscope rm "${COMMON[@]}" --num_steps 300 --batch_size 64 --lr 1e-3 --name "rlhf_rm_s$SEED"
PPO=(train "${COMMON[@]}" "${EVAL[@]}" --method ppo --init "runs/rlhf_sft_s$SEED"
     --rm_path "runs/rlhf_rm_s$SEED" --num_steps 150 --batch_size 64 --lr 3e-4 --eval_every 25)
rlscope "${PPO[@]}" --name "rlhf_ppo_kl_s$SEED"
rlscope "${PPO[@]}" --kl_control fixed --kl_coef 0.001 --name "rlhf_ppo_small_kl_s$SEED"
