#!/usr/bin/env bash
# GRPO on arithmetic from an SFT warm start (docs/recipes.md). Settings: common.sh.
source "$(dirname "$0")/common.sh"
SFT_STEPS=${SFT_STEPS:-$(by_size 1000 500)}
SFT_LR=${SFT_LR:-$(by_size 3e-3 1e-4)}
RL_STEPS=${RL_STEPS:-200}
RL_LR=${RL_LR:-$(by_size 3e-4 3e-6)}
NAME=arith_${SIZE}_s$SEED
rlscope sft --task arithmetic --difficulty 1 "${MODEL[@]}" --num_steps "$SFT_STEPS" \
    --batch_size 64 --lr "$SFT_LR" --eval_every 0 "${COMMON[@]}" --name "sft_$NAME"
rlscope train --task arithmetic --difficulty 1 --method grpo "${MODEL[@]}" \
    --init "$RUNS/sft_$NAME" --num_steps "$RL_STEPS" --batch_size 64 --lr "$RL_LR" \
    --eval_every 50 "${COMMON[@]}" --name "grpo_$NAME"
