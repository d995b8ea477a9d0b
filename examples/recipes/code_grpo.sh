#!/usr/bin/env bash
# GRPO on code_unit_tests (hidden unit tests run in the sandbox) from an SFT warm start on the
# training specs' reference bodies (docs/recipes.md). Settings: common.sh.
source "$(dirname "$0")/common.sh"
SFT_STEPS=${SFT_STEPS:-$(by_size 150 100)}
SFT_LR=${SFT_LR:-$(by_size 3e-3 1e-4)}
RL_STEPS=${RL_STEPS:-60}
RL_LR=${RL_LR:-$(by_size 3e-4 3e-6)}
NAME=code_${SIZE}_s$SEED
rlscope sft --task code_unit_tests "${MODEL[@]}" \
    --num_steps "$SFT_STEPS" --batch_size 32 --lr "$SFT_LR" --eval_every 0 "${COMMON[@]}" \
    --name "sft_$NAME"
rlscope train --task code_unit_tests --method grpo "${MODEL[@]}" \
    --init "$RUNS/sft_$NAME" --num_steps "$RL_STEPS" --batch_size 32 --group_size 8 \
    --lr "$RL_LR" --eval_every 20 "${COMMON[@]}" --name "grpo_$NAME"
